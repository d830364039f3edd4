#!/usr/bin/env python3
"""Many cameras, one accelerator: four streams on one engine, and batched against one frame per invoke.

Two measurements, each repeated ``--reps`` times in one run (medians; the machine is shared):

1. **Fair sharing**: four cameras (generated 640x480 frames of four real photos at ``--fps``, 250 by
   default: four cameras ask more than the engine can do, so it never waits) on one MobileNet v2 engine (XNNPACK):
   the aggregate fps and the fairness (slowest stream's fps over the fastest's; goal >= 0.9),
   against one camera alone on the same engine (what sharing costs).
2. **Batched vs one at a time**: four streams of Ultraface face detection on OpenVINO (CPU), the
   model reshaped to a batch of four (four frames, one per stream, per invoke) against the same
   model at batch one (four invokes for the same frames), alternating in the same run.

    python bench/multistream.py [--reps 5] [--seconds 4] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

PHOTOS = ["parrot.jpg", "cat.bmp", "grace_hopper.bmp", "squat.bmp"]


def assets_dir() -> Path:
    return Path(os.environ.get("EDGEINFER_ASSETS", REPO.parent / "shared" / "assets")).resolve()


def run_streams(engine, photos: list[str], seconds: float, fps: float | None, **options) -> dict:
    from edgeinfer import MultiPipeline
    from edgeinfer.capture import SyntheticSource

    images = assets_dir() / "images"
    sources = {f"cam{i}": SyntheticSource((640, 480), fps=fps, image=images / photo) for i, photo in enumerate(photos)}
    with MultiPipeline(engine, sources, **options) as multi:
        multi.start()
        time.sleep(1.0)  # warm-up
        multi.take_window()
        invokes = multi.invokes
        time.sleep(seconds)
        window = multi.take_window()
        invokes = multi.invokes - invokes
    rates = [s.fps for s in window.values()]
    return {"fps": sum(rates), "fairness": min(rates) / max(rates) if max(rates) else 1.0,
            "dropped": sum(s.dropped for s in window.values()),
            "frames_per_invoke": sum(s.frames for s in window.values()) / max(invokes, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--fps", type=float, default=250.0, help="each camera's frame rate (0: unpaced)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    import edgeinfer
    from edgeinfer.runtime.model import inspect_model

    models = assets_dir() / "models"
    classifier = edgeinfer.load(models / "mobilenet_v2_1.0_224_quant.tflite", "xnnpack", threads=2)
    detector = inspect_model(models / "ultraface_rfb_320.onnx")
    openvino = edgeinfer.get_delegate("openvino")
    batched = openvino.load(detector, device="CPU", batch=4, threads=2)
    single = openvino.load(detector, device="CPU", batch=1, threads=2)
    samples: dict[str, list[dict]] = {"one stream": [], "four streams": [], "batch 1": [], "batch 4": []}
    for rep in range(args.reps):
        order = list(samples) if rep % 2 == 0 else list(samples)[::-1]
        for name in order:
            fps = args.fps or None
            if name == "one stream":  # one camera asking more than the engine can do: its capacity alone
                samples[name].append(run_streams(classifier, PHOTOS[:1], args.seconds, fps))
            elif name == "four streams":
                samples[name].append(run_streams(classifier, PHOTOS, args.seconds, fps))
            else:
                engine = batched if name == "batch 4" else single
                samples[name].append(run_streams(engine, ["grace_hopper.bmp"] * 4, args.seconds, fps, task="detect"))
    for engine in (classifier, batched, single):
        engine.close()
    report = {name: {key: round(statistics.median(s[key] for s in runs), 3) for key in runs[0]}
              for name, runs in samples.items()}
    report["batched_over_single_fps"] = round(report["batch 4"]["fps"] / report["batch 1"]["fps"], 3)
    report["four_over_one_fps"] = round(report["four streams"]["fps"] / report["one stream"]["fps"], 3)
    if args.json:
        print(json.dumps(report, indent=2))
        return
    print(f"{args.reps} reps x {args.seconds:g} s, medians; cameras at {args.fps:g} fps (0: unpaced)")
    for name in ("one stream", "four streams", "batch 1", "batch 4"):
        r = report[name]
        print(f"  {name:<13} {r['fps']:7.1f} fps in all  fairness {r['fairness']:.3f}  "
              f"{r['frames_per_invoke']:.2f} frames/invoke  dropped {r['dropped']:.0f}")
    print(f"  MobileNet v2, XNNPACK: four cameras / one camera = x{report['four_over_one_fps']:.3f} aggregate fps")
    print(f"  Ultraface, OpenVINO CPU: batch 4 / batch 1 = x{report['batched_over_single_fps']:.3f} aggregate fps")


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""What does the live view cost the device per frame, watched and with nobody watching?

Runs the face detector (UltraFace, ONNX Runtime) over the tests' scene clip (640x480 MJPEG, ``policy=every``,
as fast as it goes) in three variants, interleaved in rotating order over ``--reps`` repetitions, in one process:

    off        the pipeline alone (the code path of a device nobody watches: one attribute test per frame)
    watched    a LiveViewFeed at --fps frames a second, 640 px, its sink dropping the JPEG (no network)

Reported, medians: the process's CPU time per inference frame (every thread: the copy, annotate() and the
JPEG encoding included), fps, their per-repetition ratios to ``off``, and the feed's frames sent.

    PYTHONPATH=. python bench/live_view.py [--reps 5] [--frames 400] [--fps 5]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "tests")]


def one(variant: str, clip: Path, model: Path, frames: int, fps: float) -> dict:
    from edgeinfer.pipeline.live_view import LiveViewFeed
    from edgeinfer.pipeline.multi import MultiPipeline

    sent = []
    with MultiPipeline(model, {"": str(clip)}, task="detect", policy="every", loop=True, max_frames=frames,
                       threads=1, lines=["door=320,470,320,10"]) as run:
        feed = LiveViewFeed(lambda: run, "", lambda jpeg, _r: sent.append(len(jpeg)) or True, fps=fps) \
            if variant == "watched" else None
        if feed is not None:
            feed.start()
            time.sleep(0.3)  # attached before the run starts
        cpu, wall = time.process_time(), time.perf_counter()
        run.start()
        run.wait()
        cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
        if feed is not None:
            feed.stop()
        done = sum(s.frames for s in run.stats().values())
    return {"cpu_ms_per_frame": cpu * 1e3 / done, "fps": done / wall, "sent": len(sent)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--frames", type=int, default=400)
    parser.add_argument("--fps", type=float, default=5.0)
    args = parser.parse_args()
    from support import scenes
    from support.pipeline import ULTRAFACE

    clip = scenes.make_scene_clip(Path(tempfile.mkdtemp()) / "scene.avi")
    variants = ["off", "watched"]
    results: dict[str, list[dict]] = {v: [] for v in variants}
    one("off", clip, ULTRAFACE, 60, args.fps)  # warm-up: model load, caches
    for rep in range(args.reps):
        for variant in variants[rep % 2:] + variants[:rep % 2]:
            results[variant].append(one(variant, clip, ULTRAFACE, args.frames, args.fps))
    ratios = [w["cpu_ms_per_frame"] / o["cpu_ms_per_frame"] for o, w in zip(results["off"], results["watched"])]
    fps_ratios = [w["fps"] / o["fps"] for o, w in zip(results["off"], results["watched"])]
    for variant in variants:
        rows = results[variant]
        print(f"{variant:8s} cpu/frame {statistics.median(r['cpu_ms_per_frame'] for r in rows):7.2f} ms  "
              f"fps {statistics.median(r['fps'] for r in rows):6.1f}  frames sent {[r['sent'] for r in rows]}")
    print(f"watched/off: cpu per frame x{statistics.median(ratios):.3f}, fps x{statistics.median(fps_ratios):.3f} "
          f"(medians of {args.reps} per-repetition ratios)")


if __name__ == "__main__":
    main()

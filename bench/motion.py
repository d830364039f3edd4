#!/usr/bin/env python3
"""What does motion gating save on a mostly static camera?

A generated clip: ``cat_720p.jpg`` (1280x720, or ``--size``) with camera-like noise (Gaussian
sensor noise, a JPEG re-encoding per frame), static except for ``--moving`` segments where a parrot
cut from ``parrot.jpg`` walks across (each 30 frames). Three variants, in the same process, on the
same frames, in rotating order over ``--reps`` repetitions; CPU time (``time.process_time``: every
thread of the process) per frame, medians:

    gate       MotionGate.changed() on every frame, nothing else
    every      Preprocessor + Engine.invoke() on every frame (MobileNet v2 quant, XNNPACK)
    gated      MotionGate.changed(), then Preprocessor + invoke only on the frames it lets through

Printed: the fraction of frames skipped, the frames that moved and whether every one of them went
through, and the CPU saved: 1 - gated / every.

    python bench/motion.py [--reps 5] [--frames 300] [--moving 2] [--threads 1] [--size 1280x720] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import cv2
import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import edgeinfer  # noqa: E402
from edgeinfer.pipeline.motion import MotionGate  # noqa: E402

SEGMENT = 30
VARIANTS = ("gate", "every", "gated")


def assets_dir() -> Path:
    return Path(os.environ.get("EDGEINFER_ASSETS", REPO.parent / "shared" / "assets")).resolve()


def make_clip(size: tuple[int, int], frames: int, moving: int, seed: int = 7) -> tuple[list[np.ndarray], list[bool]]:
    """(noisy frames, moved flags): ``moving`` segments of SEGMENT frames spread over a static clip."""
    width, height = size
    images = assets_dir() / "images"
    background = cv2.resize(cv2.imread(str(images / "cat_720p.jpg")), size, interpolation=cv2.INTER_AREA)
    ow = max(8, width // 4)
    parrot = cv2.resize(cv2.imread(str(images / "parrot.jpg")), (ow, min(height - 2, ow * 929 // 512)),
                        interpolation=cv2.INTER_AREA)
    rng = np.random.default_rng(seed)
    noise = (rng.standard_normal((4, height + 32, width + 32, 3), dtype=np.float32) * 4).round().astype(np.int16)
    starts = [round((k + 1) * frames / (moving + 1)) - SEGMENT // 2 for k in range(moving)]
    xs = np.linspace(-ow // 2, width - ow // 2, SEGMENT).round().astype(int)
    out, moved, previous = [], [], None
    for index in range(frames):
        clean = background.copy()
        for start in starts:
            if start <= index < start + SEGMENT:
                x, y = int(xs[index - start]), (height - parrot.shape[0]) // 2
                x0, x1 = max(x, 0), min(x + ow, width)
                clean[y:y + parrot.shape[0], x0:x1] = parrot[:, x0 - x:x1 - x]
        moved.append(previous is not None and not np.array_equal(clean, previous))
        previous = clean
        dy, dx = rng.integers(0, 32, 2)
        frame = cv2.add(clean, noise[rng.integers(4)][dy:dy + height, dx:dx + width], dtype=cv2.CV_8U)
        out.append(cv2.imdecode(cv2.imencode(".jpg", frame, [cv2.IMWRITE_JPEG_QUALITY, 85])[1], cv2.IMREAD_COLOR))
    return out, moved


def run_variant(variant: str, frames, engine, pre, view, gate_options: dict) -> tuple[float, MotionGate | None]:
    """CPU seconds per frame of one pass over the clip."""
    gate = MotionGate(**gate_options) if variant != "every" else None
    invoke = engine.invoke
    c0 = time.process_time()
    if variant == "gate":
        for frame in frames:
            gate.changed(frame)
    elif variant == "every":
        for frame in frames:
            pre(frame, view)
            invoke()
    else:
        for frame in frames:
            if gate.changed(frame):
                pre(frame, view)
                invoke()
    return (time.process_time() - c0) / len(frames), gate


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--frames", type=int, default=300)
    parser.add_argument("--moving", type=int, default=2, help=f"moving segments of {SEGMENT} frames")
    parser.add_argument("--threads", type=int, default=1, help="XNNPACK and OpenCV threads")
    parser.add_argument("--size", default="1280x720")
    parser.add_argument("--model", default="mobilenet_v2_1.0_224_quant.tflite")
    parser.add_argument("--threshold", type=float, default=20)
    parser.add_argument("--min-area", type=float, default=0.002)
    parser.add_argument("--max-skip", type=int, default=30)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

    cv2.setNumThreads(args.threads)
    size = tuple(int(v) for v in args.size.lower().split("x"))
    frames, moved = make_clip(size, args.frames, args.moving)
    gate_options = {"threshold": args.threshold, "min_area": args.min_area, "max_skip": args.max_skip}
    engine = edgeinfer.load(assets_dir() / "models" / args.model, "xnnpack", threads=args.threads)
    pre = edgeinfer.Preprocessor(engine.inputs[0], size)
    view = engine.input_view(0)
    for frame in frames[:5]:  # warm-up
        pre(frame, view)
        engine.invoke()
    samples: dict[str, list[float]] = {v: [] for v in VARIANTS}
    gate = None
    for rep in range(args.reps):
        for variant in VARIANTS[rep % 3:] + VARIANTS[:rep % 3]:
            seconds, used = run_variant(variant, frames, engine, pre, view, gate_options)
            samples[variant].append(seconds)
            gate = used if variant == "gated" else gate
    engine.close()
    # which frames the gated run let through (the same every repetition: the gate is deterministic)
    check = MotionGate(**gate_options)
    passed = [check.changed(f) for f in frames]
    median = {v: statistics.median(s) * 1e3 for v, s in samples.items()}
    report = {
        "size": f"{size[0]}x{size[1]}", "frames": len(frames), "reps": args.reps, "threads": args.threads,
        "model": args.model, "gate": gate_options, "gate_small_size": list(check.size),
        "moved_frames": sum(moved), "moved_frames_skipped": sum(1 for m, p in zip(moved, passed, strict=True)
                                                                 if m and not p),
        "inferences": sum(passed), "skipped_fraction": round(gate.skipped_fraction, 4), "forced": gate.forced,
        "cpu_ms_per_frame": {v: round(m, 3) for v, m in median.items()},
        "cpu_ms_per_frame_range": {v: [round(min(s) * 1e3, 3), round(max(s) * 1e3, 3)] for v, s in samples.items()},
        "gate_cost_of_inference": round(median["gate"] / median["every"], 4),
        "cpu_saved": round(1 - median["gated"] / median["every"], 4),
    }
    if args.json:
        print(json.dumps(report, indent=2))
        return
    print(f"{report['size']}, {report['frames']} frames ({report['moved_frames']} moved, "
          f"{report['moved_frames_skipped']} of them skipped), {args.reps} reps, {args.threads} thread(s), "
          f"{args.model}")
    print(f"gate: threshold {args.threshold:g}, min_area {args.min_area:g}, max_skip {args.max_skip}, "
          f"small copy {check.size[0]}x{check.size[1]}")
    print(f"skipped {report['skipped_fraction']:.1%} of frames ({report['inferences']} inferences, "
          f"{report['forced']} forced by max_skip)")
    for variant in VARIANTS:
        low, high = report["cpu_ms_per_frame_range"][variant]
        print(f"  {variant:6s} {median[variant]:8.3f} ms CPU/frame  (min {low:.3f}, max {high:.3f})")
    print(f"gate alone = {report['gate_cost_of_inference']:.2%} of inference; CPU saved {report['cpu_saved']:.1%}")


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""What does a multi-object tracker cost per frame on this CPU? The candidates of docs/analytics.md.

The same generated detections go to each tracker that is importable in the running interpreter:
N objects (5, 10, 20) walking straight lines with box noise, one detection in ten missing, one in
eight with a low score (ByteTrack's second stage), 300 frames. Each tracker runs the whole sequence
``--reps`` times from a fresh instance; reported is the median time per frame (µs) and how many
distinct ids it gave (the same walkers should give about N).

    trackers-bytetrack     trackers.ByteTrackTracker (Roboflow `trackers`, the one edgeinfer wraps)
    edgeinfer-tracker      edgeinfer.pipeline.tracking.Tracker (the wrapper: Detections in and out)
    supervision-bytetrack  supervision.ByteTrack (supervision < 0.31; removed in 0.31)
    norfair                norfair.Tracker, IoU distance on the box corners (needs numpy < 2)
    assign-scipy / -lap    the assignment step alone on an N x N IoU cost matrix

Libraries that cannot share one environment (norfair pins numpy < 2) are measured by running this
script in a virtual environment of their own; ``--json`` prints rows to merge.

    python bench/tracking.py [--reps 7] [--frames 300] [--sizes 5,10,20] [--json]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
import warnings
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def make_sequence(n: int, frames: int, seed: int = 7) -> list[tuple[np.ndarray, np.ndarray]]:
    """Per frame (boxes Nx4 float32, scores N float32) of n walkers in a 1280x720 frame."""
    rng = np.random.default_rng(seed)
    start = rng.uniform((50, 50), (1180, 620), size=(n, 2))
    velocity = rng.uniform(-4, 4, size=(n, 2))
    size = rng.uniform(40, 110, size=(n, 1)) * np.array([[0.8, 1.0]])
    sequence = []
    for f in range(frames):
        centre = start + velocity * f
        centre = np.mod(centre, (1230, 670)) + 25  # wrap round instead of leaving
        noise = rng.normal(0, 2.0, size=(n, 4))
        boxes = np.hstack([centre - size / 2, centre + size / 2]) + noise
        scores = np.where(rng.random(n) < 0.125, rng.uniform(0.2, 0.5, n), rng.uniform(0.7, 0.99, n))
        keep = rng.random(n) >= 0.1
        sequence.append((boxes[keep].astype(np.float32), scores[keep].astype(np.float32)))
    return sequence


def _iou(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    x1 = np.maximum(a[:, None, 0], b[None, :, 0])
    y1 = np.maximum(a[:, None, 1], b[None, :, 1])
    x2 = np.minimum(a[:, None, 2], b[None, :, 2])
    y2 = np.minimum(a[:, None, 3], b[None, :, 3])
    inter = np.clip(x2 - x1, 0, None) * np.clip(y2 - y1, 0, None)
    area = lambda r: (r[:, 2] - r[:, 0]) * (r[:, 3] - r[:, 1])  # noqa: E731
    return inter / (area(a)[:, None] + area(b)[None, :] - inter)


# -- one runner per candidate: (setup once per sequence) → step per frame → ids seen ------------------------

def runner_trackers(sequence):
    import supervision as sv
    import trackers

    inputs = [sv.Detections(xyxy=b, confidence=s, class_id=np.zeros(len(b), int)) for b, s in sequence]

    def run():
        tracker = trackers.ByteTrackTracker(minimum_consecutive_frames=3)
        ids = set()
        for detections in inputs:
            ids.update(tracker.update(detections).tracker_id.tolist())
        return ids - {-1}
    return run


def runner_edgeinfer(sequence):
    from edgeinfer.pipeline.postprocess import Detection, Detections
    from edgeinfer.pipeline.tracking import Tracker

    inputs = [Detections(tuple(Detection(tuple(map(float, box)), float(score), 0, "x")
                               for box, score in zip(b, s))) for b, s in sequence]

    def run():
        tracker = Tracker(min_hits=3)
        ids = set()
        for frame_id, detections in enumerate(inputs):
            ids.update(d.track_id for d in tracker.update(detections, frame_id))
        return ids - {None}
    return run


def runner_supervision(sequence):
    import supervision as sv

    if not hasattr(sv, "ByteTrack"):
        raise ImportError(f"supervision {sv.__version__} has no ByteTrack (removed in 0.31)")
    inputs = [sv.Detections(xyxy=b, confidence=s, class_id=np.zeros(len(b), int)) for b, s in sequence]

    def run():
        tracker = sv.ByteTrack(minimum_consecutive_frames=3)
        ids = set()
        for detections in inputs:
            ids.update(tracker.update_with_detections(detections).tracker_id.tolist())
        return ids - {-1}
    return run


def runner_norfair(sequence):
    import norfair

    inputs = [[norfair.Detection(points=box.reshape(2, 2).astype(np.float64), scores=np.array([score, score]))
               for box, score in zip(b, s)] for b, s in sequence]

    def run():
        tracker = norfair.Tracker(distance_function="iou", distance_threshold=0.9, initialization_delay=2)
        ids = set()
        for detections in inputs:
            ids.update(t.id for t in tracker.update(detections=detections) if t.id is not None)
        return ids
    return run


def _assignment(solve):
    def make(sequence):
        pairs = [(sequence[i][0], sequence[i + 1][0]) for i in range(len(sequence) - 1)]
        costs = [1.0 - _iou(a, b) for a, b in pairs]

        def run():
            for cost in costs:
                solve(cost)
            return set()
        return run
    return make


def _scipy_solve(cost):
    from scipy.optimize import linear_sum_assignment

    return linear_sum_assignment(cost)


def _lap_solve(cost):
    import lap

    return lap.lapjv(cost, extend_cost=True)


RUNNERS = {
    "trackers-bytetrack": runner_trackers,
    "edgeinfer-tracker": runner_edgeinfer,
    "supervision-bytetrack": runner_supervision,
    "norfair": runner_norfair,
    "assign-scipy": _assignment(_scipy_solve),
    "assign-lap": _assignment(_lap_solve),
}


def _version(name: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    module = {"trackers-bytetrack": "trackers", "edgeinfer-tracker": "trackers", "supervision-bytetrack": "supervision",
              "norfair": "norfair", "assign-scipy": "scipy", "assign-lap": "lap"}[name]
    try:
        return version(module)
    except PackageNotFoundError:
        return "?"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=7)
    parser.add_argument("--frames", type=int, default=300)
    parser.add_argument("--sizes", default="5,10,20")
    parser.add_argument("--json", action="store_true", help="print JSON rows")
    args = parser.parse_args(argv)
    warnings.simplefilter("ignore")
    rows = []
    for n in (int(s) for s in args.sizes.split(",")):
        sequence = make_sequence(n, args.frames)
        for name, make in RUNNERS.items():
            try:
                run = make(sequence)
                ids = run()  # warm-up (imports, caches)
            except ImportError as exc:
                rows.append({"tracker": name, "objects": n, "skipped": str(exc)})
                continue
            times = []
            for _ in range(args.reps):
                start = time.perf_counter()
                run()
                times.append((time.perf_counter() - start) / args.frames * 1e6)
            rows.append({"tracker": name, "version": _version(name), "objects": n,
                         "median_us_per_frame": round(statistics.median(times), 1),
                         "min_us_per_frame": round(min(times), 1), "ids": len(ids),
                         "numpy": np.__version__, "python": platform.python_version()})
    if args.json:
        print(json.dumps(rows, indent=1))
        return 0
    print(f"{platform.processor() or platform.machine()}, python {platform.python_version()}, numpy {np.__version__}; "
          f"{args.frames} frames x {args.reps} reps, median per frame")
    print(f"{'tracker':24} {'version':10} {'objects':>7} {'µs/frame':>10} {'ids':>5}")
    for row in rows:
        if "skipped" in row:
            print(f"{row['tracker']:24} {'-':10} {row['objects']:>7} skipped: {row['skipped']}")
        else:
            print(f"{row['tracker']:24} {row['version']:10} {row['objects']:>7} {row['median_us_per_frame']:>10.1f} "
                  f"{row['ids']:>5}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

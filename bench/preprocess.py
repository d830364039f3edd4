"""Preprocessing a frame into a float NCHW model input: edgeinfer's Preprocessor against the plain loop.

The plain loop is what a tutorial (and Ultralytics' ``LetterBox`` + ``np.transpose``) writes: resize,
``copyMakeBorder`` in grey 114, BGR -> RGB by slicing, transpose to CHW, ``astype(float32) / 255``.
edgeinfer writes the same values into the model's input buffer (the result is checked equal first).
The two alternate, block by block, in one run; medians per method and their ratio.

    PYTHONPATH=. python bench/preprocess.py [--reps 7] [--frames 100] [--json out.json]
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

from edgeinfer.pipeline.preprocess import Preprocessor  # noqa: E402
from edgeinfer.runtime.model import TensorSpec  # noqa: E402

ASSETS = Path(os.environ.get("EDGEINFER_ASSETS", REPO.parent / "shared" / "assets")).resolve()
#: (frame size, model input side): a 720p and a 1080p camera into a 640 YOLO, a 720p one into a 320 one
CASES = (((1280, 720), 640), ((1920, 1080), 640), ((1280, 720), 320))


def plain_letterbox(frame: np.ndarray, side: int) -> np.ndarray:
    """The plain loop's preprocessing (a new array per frame, as it is written)."""
    height, width = frame.shape[:2]
    ratio = min(side / width, side / height)
    new_w, new_h = round(width * ratio), round(height * ratio)
    image = cv2.resize(frame, (new_w, new_h), interpolation=cv2.INTER_LINEAR)
    top, left = (side - new_h) // 2, (side - new_w) // 2
    image = cv2.copyMakeBorder(image, top, side - new_h - top, left, side - new_w - left, cv2.BORDER_CONSTANT,
                               value=(114, 114, 114))
    return np.ascontiguousarray(image[:, :, ::-1].transpose(2, 0, 1))[None].astype(np.float32) / 255.0


def block_ms(step, frames: int) -> float:
    """Median milliseconds of ``step()`` over ``frames`` calls."""
    times = []
    for _ in range(frames):
        started = time.perf_counter()
        step()
        times.append((time.perf_counter() - started) * 1e3)
    return statistics.median(times)


def run_case(frame_size: tuple[int, int], side: int, reps: int, frames: int) -> dict:
    photo = cv2.imread(str(ASSETS / "images" / "kite_and_cold.jpg"))
    frame = cv2.resize(photo, frame_size, interpolation=cv2.INTER_AREA)
    spec = TensorSpec("images", (1, 3, side, side), "float32", "NCHW")
    preprocessor = Preprocessor(spec, frame_size, resize="letterbox", mean=0.0, std=255.0)
    tensor = np.empty(spec.shape, np.float32)
    preprocessor(frame, tensor)
    difference = float(np.abs(tensor - plain_letterbox(frame, side)).max())
    assert difference < 1e-5, f"the two disagree by {difference}"
    methods = {"edgeinfer": lambda: preprocessor(frame, tensor), "plain": lambda: plain_letterbox(frame, side)}
    medians: dict[str, list[float]] = {name: [] for name in methods}
    for rep in range(reps):
        order = list(methods) if rep % 2 == 0 else list(methods)[::-1]
        for name in order:
            medians[name].append(block_ms(methods[name], frames))
    ratios = [p / e for p, e in zip(medians["plain"], medians["edgeinfer"])]
    return {"frame": f"{frame_size[0]}x{frame_size[1]}", "input": f"{side}x{side}",
            "edgeinfer_ms": statistics.median(medians["edgeinfer"]), "plain_ms": statistics.median(medians["plain"]),
            "ratio_median": statistics.median(ratios), "ratio_min": min(ratios), "ratio_max": max(ratios),
            "max_difference": difference}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--reps", type=int, default=7)
    parser.add_argument("--frames", type=int, default=100)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    cv2.setNumThreads(1)  # as a pipeline runs it (opencv_threads)
    rows = [run_case(size, side, args.reps, args.frames) for size, side in CASES]
    print(f"{'frame':>10} {'input':>8} {'edgeinfer':>10} {'plain':>8}  plain/edgeinfer (min-max)")
    for row in rows:
        print(f"{row['frame']:>10} {row['input']:>8} {row['edgeinfer_ms']:>8.2f}ms {row['plain_ms']:>6.2f}ms  "
              f"{row['ratio_median']:.2f}x ({row['ratio_min']:.2f}-{row['ratio_max']:.2f})")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()

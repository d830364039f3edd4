#!/usr/bin/env python3
"""What keeping a YOLO detector's box-decode tail in float buys when it is quantised to INT8.

Each YOLO asset is quantised twice by ``edgeinfer.tools.optimize.optimize_model``, on the same
calibration frames: with the default (the decode tail after the head's last learned layers kept in
float) and with ``quantize_all`` (every node quantised, what a plain ``quantize_static`` gives). Each
INT8 model is judged against the float model on held-back frames by its boxes (same class, IoU >= 0.5:
recall, precision, mAP50, mean IoU of the matches) and timed against the float model in the same
process (interleaved blocks, medians). Then the two INT8 models are timed against each other, the
same way: what the float tail costs in speed.

The frames: the shared photos split in two, calibration and held-back, each photo augmented into
six frames (itself, mirrored, three 75% crops, half size mirrored) in a temporary folder. The split
puts people in both halves.

    python bench/int8_detectors.py [--models fall,pose] [--bench-seconds 6] [--threads N] [--json]

Ratios are what to read (same run, same machine); absolute milliseconds are not comparable across runs.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

MODELS = {"fall": "yolo_fall_detection.onnx", "pose": "yolo11n-pose.onnx"}
CALIBRATION = ("squat.bmp", "cat.bmp", "parrot.jpg", "dog_segmentation.bmp", "pets.jpg")
HELD_BACK = ("face.jpg", "grace_hopper.bmp", "kite_and_cold.jpg", "cat_720p.jpg")
VARIANTS = {"float tail (default)": False, "quantize all": True}


def assets_dir() -> Path:
    return Path(os.environ.get("EDGEINFER_ASSETS", REPO.parent / "shared" / "assets")).resolve()


def augmented(names: tuple[str, ...], folder: Path) -> Path:
    """Six frames per photo in ``folder``: itself, mirrored, three 75% crops, half size mirrored."""
    import cv2

    folder.mkdir()
    for name in names:
        image = cv2.imread(str(assets_dir() / "images" / name))
        h, w = image.shape[:2]
        ch, cw = h * 3 // 4, w * 3 // 4
        frames = {
            "": image,
            "flip": cv2.flip(image, 1),
            "centre": image[(h - ch) // 2:(h + ch) // 2, (w - cw) // 2:(w + cw) // 2],
            "topleft": image[:ch, :cw],
            "bottomright": image[h - ch:, w - cw:],
            "half": cv2.flip(cv2.resize(image, (w // 2, h // 2), interpolation=cv2.INTER_AREA), 1),
        }
        for suffix, frame in frames.items():
            cv2.imwrite(str(folder / f"{Path(name).stem}{'_' + suffix if suffix else ''}.png"), frame)
    return folder


def quantise(model: Path, out: Path, calibration: Path, validation: Path, quantize_all: bool,
             bench_seconds: float, threads: int | None) -> dict:
    """One INT8 model, judged and timed against the float model; written even when refused."""
    from edgeinfer.tools.optimize import OptimizeOptions, optimize_model

    options = OptimizeOptions(mode="int8", calibration=str(calibration), validation=str(validation),
                              quantize_all=quantize_all, force=True, bench_seconds=bench_seconds, threads=threads)
    report = optimize_model(model, out, options, progress=lambda line: print(f"  {line}", file=sys.stderr))
    art = report.onnx
    boxes = art.accuracy.boxes
    assert boxes is not None, f"{model.name} was not judged as a detector"
    return {
        "float_nodes": len(report.float_nodes), "size_ratio": round(art.size_ratio, 2),
        "recall": boxes.recall, "precision": boxes.precision, "map50": boxes.map50, "mean_iou": boxes.mean_iou,
        "boxes": [boxes.reference_boxes, boxes.candidate_boxes, boxes.matched],
        "verdict": "refused" if report.refused else "accepted", "refused": report.refused,
        "speedup_vs_float": round(art.latency.speedup, 2) if art.latency else None,
        "float_ms": art.latency.original_ms if art.latency else None,
        "int8_ms": art.latency.optimized_ms if art.latency else None,
    }


def tail_cost(tail: Path, everything: Path, seconds: float, threads: int | None) -> float:
    """Median latency of the float-tail INT8 model / the all-INT8 one, interleaved in one process."""
    import edgeinfer
    from edgeinfer.tools.optimize import compare_latency

    threads = threads or os.cpu_count() or 1
    with edgeinfer.load(tail, "onnxruntime", threads=threads) as a, \
            edgeinfer.load(everything, "onnxruntime", threads=threads) as b:
        latency = compare_latency(a, b, seconds=seconds, threads=threads)
    return round(latency.speedup, 3)  # the first model's median over the second's


def _pct(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.1%}"


def _num(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.3f}"


def print_table(results: dict) -> None:
    print("| model | variant | kept float | smaller | recall | precision | mAP50 | mean IoU | boxes o/q/m "
          "| verdict | INT8 speedup vs float |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for model, result in results.items():
        for variant, row in result["variants"].items():
            speed = f"{row['speedup_vs_float']:.2f}x" if row["speedup_vs_float"] else "–"
            print(f"| {model} | {variant} | {row['float_nodes']} nodes | {row['size_ratio']:.2f}x | "
                  f"{_pct(row['recall'])} | {_pct(row['precision'])} | {_num(row['map50'])} | "
                  f"{_num(row['mean_iou'])} | {'/'.join(map(str, row['boxes']))} | {row['verdict']} | {speed} |")
    for model, result in results.items():
        print(f"{model}: float-tail INT8 latency / all-INT8 latency = {result['tail_over_all']:.3f} "
              "(same run, interleaved, medians)")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="fall,pose", help="comma-separated: " + ", ".join(MODELS))
    parser.add_argument("--bench-seconds", type=float, default=6.0, help="timing budget per comparison")
    parser.add_argument("--threads", type=int, help="threads for every model (default: all cores)")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args()
    results: dict = {}
    with tempfile.TemporaryDirectory(prefix="int8_detectors_") as temp:
        root = Path(temp)
        calibration, validation = augmented(CALIBRATION, root / "calibration"), augmented(HELD_BACK, root / "held_back")
        for key in args.models.split(","):
            model = assets_dir() / "models" / MODELS[key]
            outs = {variant: root / f"{key}_{index}.onnx" for index, variant in enumerate(VARIANTS)}
            rows = {}
            for variant, quantize_all in VARIANTS.items():
                print(f"{model.name}: {variant}", file=sys.stderr)
                rows[variant] = quantise(model, outs[variant], calibration, validation, quantize_all,
                                         args.bench_seconds, args.threads)
            tail, everything = outs.values()
            results[model.name] = {"variants": rows,
                                   "tail_over_all": tail_cost(tail, everything, args.bench_seconds, args.threads)}
        frames = (len(os.listdir(calibration)), len(os.listdir(validation)))
    if args.json:
        document = {"calibration_frames": frames[0], "held_back_frames": frames[1], "results": results}
        print(json.dumps(document, indent=2))
    else:
        print(f"calibration frames {frames[0]}, held-back frames {frames[1]}")
        print_table(results)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""The end-to-end demo behind ``make demo``: the shared sample models and photos, nothing else."""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Callable
from pathlib import Path

from ..errors import EdgeInferError
from ..pipeline.classify import ImageClassifier
from ..pipeline.labels import Labels
from ..runtime.delegates.registry import get_delegate
from ..runtime.selection import load

DEMO_IMAGES = ("parrot.jpg", "cat.bmp", "grace_hopper.bmp", "dog_segmentation.bmp")


def default_assets() -> Path:
    """``$EDGEINFER_ASSETS``, else ``../shared/assets`` next to the current directory."""
    return Path(os.environ.get("EDGEINFER_ASSETS", Path.cwd().parent / "shared" / "assets")).resolve()


def run_demo(assets: Path, workdir: Path, echo: Callable[[str], None] = print) -> dict:
    """Classify the sample photos on every CPU delegate, then a generated clip; return a summary."""
    models, images = assets / "models", assets / "images"
    if not models.is_dir():
        raise EdgeInferError(f"demo assets not found at {assets} — set EDGEINFER_ASSETS")
    workdir.mkdir(parents=True, exist_ok=True)
    tflite = models / "mobilenet_v2_1.0_224_quant.tflite"
    onnx = models / "mobilenet_v2_1.0_224_quant.onnx"
    labels = Labels.load(assets / "labels" / "imagenet_labels.txt")
    summary: dict = {"photos": [], "clip": {}}

    echo("== 1. photos, every CPU delegate")
    for model, delegate in ((tflite, "xnnpack"), (onnx, "onnxruntime"), (tflite, "openvino"), (onnx, "openvino")):
        reason = get_delegate(delegate).unavailable_reason()
        if reason:
            echo(f"   {delegate:<12} skipped: {reason}")
            continue
        with load(model, delegate) as engine:
            classifier = ImageClassifier(engine, labels, top_k=1)
            tops = [classifier.classify_file(images / name)[0] for name in DEMO_IMAGES]
        cells = "  ".join(f"{t.label.split(',')[0]} {t.score:.2f}" for t in tops)
        echo(f"   {model.suffix[1:]:<6} {engine.description:<13} {cells}")
        summary["photos"].append({"model": model.name, "delegate": engine.description,
                                  "top1": [t.label for t in tops]})

    clip = workdir / "demo_clip.avi"
    from ..capture import make_test_clip

    make_test_clip(clip, [images / n for n in DEMO_IMAGES], size=(640, 480), fps=10, frames_per_image=10)
    frames = 10 * len(DEMO_IMAGES)
    echo(f"== 2. a generated clip through the zero-copy pipeline: {clip} ({frames} frames, 640x480 MJPEG)")
    from ..pipeline.core import Pipeline

    seen: Counter[str] = Counter()
    with Pipeline(tflite, clip, task="classify", labels=labels, policy="every") as pipeline:
        for result in pipeline:
            seen[result.result[0].label.split(",")[0]] += 1
        stats = pipeline.stats
    stages = "  ".join(f"{name} p50 {values['p50']:.1f} ms" for name, values in stats.stages.items())
    echo(f"   {stats.frames} frames at {stats.fps:.1f} fps on {stats.delegate}; {stages}")
    for label, count in seen.most_common():
        echo(f"   {label:<24} {count} frames")
    summary["clip"] = {"frames": stats.frames, "fps": stats.fps, "labels": dict(seen)}

    from .demo_fleet import run_fleet_demo

    bird_model = models / "mobilenet_v2_1.0_224_inat_bird_quant.tflite"
    summary["fleet"] = run_fleet_demo(clip, tflite, bird_model, workdir, echo)
    return summary

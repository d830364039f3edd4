"""An optimised model against its original: top-1/top-5 agreement, score differences, speedup, verdict.

- accuracy: top-1 agreement with the original and the mean absolute difference of the class
  scores, per image and overall;
- speed: both models timed in the same process, in alternating blocks, same thread count, medians.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from ...errors import OptimizeError
from .detectors import box_refusal
from .options import DEFAULT_AMBIGUOUS_MARGIN, OptimizeOptions, Progress
from .report import Accuracy, Artifact, ImageComparison, Latency

if TYPE_CHECKING:
    import numpy as np

    from ...runtime.engine import Engine
    from .images import ImageFeeder


def is_class_vector(shape: Sequence[int]) -> bool:
    """One dimension above 1: a vector of class scores."""
    return sum(1 for d in shape if d > 1) == 1


def _scores(engine: Engine, classify: bool) -> np.ndarray:
    import numpy as np

    from ...pipeline.postprocess import class_scores

    spec = engine.outputs[0]
    if classify:
        return class_scores(engine.output_view(0), spec).astype(np.float64)
    return spec.dequantize(engine.output_view(0)).astype(np.float64).reshape(-1)


def reference_outputs(engine: Engine, images: Sequence[Path], feeder: ImageFeeder) -> list[np.ndarray]:
    """The original model's outputs on ``images`` (class scores for a classifier), kept for comparison."""
    classify = is_class_vector(engine.outputs[0].shape)
    outputs = []
    for image in images:
        feeder(image, engine.input_view(0))
        engine.invoke()
        outputs.append(_scores(engine, classify).copy())
    return outputs


def compare_to_reference(reference: Sequence[np.ndarray], engine: Engine, images: Sequence[Path],
                         feeder: ImageFeeder, *, ambiguous_margin: float = DEFAULT_AMBIGUOUS_MARGIN,
                         say: Progress | None = None) -> Accuracy:
    """Run ``engine`` on every image and compare with the original's outputs: top-1/top-5, |diff|.

    A tie at the top of the optimised model's scores never counts as agreement: the model cannot
    tell the classes apart, and which one a user sees would depend on the sort.
    """
    import numpy as np

    classify = is_class_vector(engine.outputs[0].shape) and all(r.ndim == 1 for r in reference)
    classify = classify and all(is_class_vector(r.shape) for r in reference)
    rows: list[ImageComparison] = []
    diffs: list[float] = []
    max_diff = 0.0
    top5_hits = 0
    for number, (image, a) in enumerate(zip(images, reference), 1):
        feeder(image, engine.input_view(0))
        engine.invoke()
        b = _scores(engine, classify)
        if a.shape != b.shape:
            raise OptimizeError(f"the optimised model's output has {b.size} values, the original's {a.size}")
        if not np.all(np.isfinite(b)):
            raise OptimizeError(f"the optimised model produced NaN/inf on {image.name} — the conversion is broken")
        diff = np.abs(a - b)
        diffs.append(float(diff.mean()))
        max_diff = max(max_diff, float(diff.max()))
        if classify:
            row, in_top5 = _compare_ranks(image, a, b, float(diff.mean()), ambiguous_margin)
            top5_hits += int(in_top5)
            rows.append(row)
        if say:
            say(f"validating: image {number}/{len(images)} ({image.name})")
    count = len(images)
    if not classify:
        return Accuracy(count, 0, None, None, None, float(np.mean(diffs)), max_diff, ())
    decisive = [r for r in rows if not r.ambiguous]
    agreement = sum(r.agrees for r in decisive) / len(decisive) if decisive else None
    return Accuracy(
        images=count, decisive=len(decisive), top1_agreement=agreement,
        top1_agreement_all=sum(r.agrees for r in rows) / count, top5_agreement=top5_hits / count,
        mean_abs_diff=float(np.mean(diffs)), max_abs_diff=max_diff, per_image=tuple(rows),
    )


def _compare_ranks(image: Path, a: np.ndarray, b: np.ndarray, mean_abs_diff: float,
                   ambiguous_margin: float) -> tuple[ImageComparison, bool]:
    """One image's top-1 under the original scores ``a`` and the optimised ``b`` (margin, tie: the one
    judgement's :func:`~edgeinfer.pipeline.agreement.compare_top1`), and whether the original's top-1 is in the
    optimised top-5."""
    from ...pipeline.agreement import compare_top1

    top = compare_top1(a.tolist(), b.tolist())
    row = ImageComparison(
        image.name, top.reference, top.candidate, round(top.reference_score, 6), round(top.candidate_score, 6),
        round(top.margin, 6), top.ambiguous(ambiguous_margin), round(mean_abs_diff, 8),
    )
    return row, top.in_top5


def compare_models(original: Engine, optimized: Engine, images: Sequence[Path], feeder: ImageFeeder, *,
                   ambiguous_margin: float = DEFAULT_AMBIGUOUS_MARGIN, say: Progress | None = None) -> Accuracy:
    """Run both engines on every image; top-1 / top-5 agreement and score differences."""
    reference = reference_outputs(original, images, feeder)
    return compare_to_reference(reference, optimized, images, feeder, ambiguous_margin=ambiguous_margin, say=say)


def compare_latency(original: Engine, optimized: Engine, *, seconds: float, threads: int,
                    say: Progress | None = None) -> Latency:
    """Time both engines in alternating blocks (same process, same threads); medians."""
    from ...runtime.timing import DEFAULT_ROUNDS, interleaved_latency, percentile

    base, fast = interleaved_latency([original, optimized], seconds=seconds, rounds=DEFAULT_ROUNDS, progress=say)
    return Latency(
        delegate=original.description, threads=threads, rounds=DEFAULT_ROUNDS,
        original_ms=round(percentile(base, 50), 4), optimized_ms=round(percentile(fast, 50), 4),
        original_p95_ms=round(percentile(base, 95), 4), optimized_p95_ms=round(percentile(fast, 95), 4),
        samples=(len(base), len(fast)),
    )


def refusal_reason(artifacts: Sequence[Artifact], options: OptimizeOptions, *,
                   saturating: Sequence[str] = ()) -> str | None:
    """Why the first artifact that fails the accuracy check fails it; None when every one passes.

    An artifact validated on one of the ``saturating`` delegates (whose INT8 kernels saturate on this CPU) is
    refused for what this CPU computes: the reason says so.
    """
    for artifact in artifacts:
        reason = _artifact_refusal(artifact, options)
        if reason and artifact.delegate in saturating:
            reason += (f" (on this CPU, an x86 without VNNI, {artifact.delegate}'s INT8 kernels saturate; "
                       "one with VNNI computes the ONNX model's figures)")
        if reason:
            return reason
    return None


def _artifact_refusal(artifact: Artifact, options: OptimizeOptions) -> str | None:
    """Why ``artifact`` fails the accuracy check, or None."""
    acc = artifact.accuracy
    label = "the INT8 model" if options.mode == "int8" else "the FP16 model"
    if artifact.kind == "openvino-ir":
        label = "the OpenVINO IR"
    if acc.boxes is not None:  # a detector: judged by its boxes
        return box_refusal(label, acc, options)
    if acc.top1_agreement_all is None:
        return (f"cannot check {label}: its output is not a class-score vector, so there is no top-1 "
                f"to compare (mean |diff| {acc.mean_abs_diff:.3g})")
    if acc.top1_agreement is None:
        return (f"every validation image is ambiguous for the original model (top-1 beats top-2 by "
                f"< {options.ambiguous_margin:g}) — validate on images it classifies decisively")
    if acc.top1_agreement < options.min_agreement:
        agreeing = sum(r.agrees for r in acc.per_image if not r.ambiguous)
        return (f"{label} agrees with the original on top-1 for {acc.top1_agreement:.1%} of decisive "
                f"validation images ({agreeing}/{acc.decisive}), below the {options.min_agreement:.0%} threshold")
    return None

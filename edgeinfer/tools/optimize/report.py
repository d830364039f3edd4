"""What ``optimize_model`` found: accuracy, latency and size of each artifact, as frozen records."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from ...pipeline.agreement import BoxAgreement


@dataclass(frozen=True)
class ImageComparison:
    """One validation image: the original's and the optimised model's top-1, and how far apart."""

    image: str
    original_top1: int
    optimized_top1: int  # -1 when the optimised model's top scores are tied
    original_score: float
    optimized_score: float
    margin: float
    ambiguous: bool
    mean_abs_diff: float

    @property
    def agrees(self) -> bool:
        """Both models put the same class first."""
        return self.original_top1 == self.optimized_top1


@dataclass(frozen=True)
class Accuracy:
    """Agreement of an optimised model with the original over the validation images.

    ``top1_agreement`` counts only *decisive* images (the original's top-1 beats its top-2 by at
    least the ambiguity margin); ``top1_agreement_all`` counts every image. None when the output
    is not a class-score vector (no top-1 to compare). A detector is judged by ``boxes`` instead.
    """

    images: int
    decisive: int
    top1_agreement: float | None
    top1_agreement_all: float | None
    top5_agreement: float | None
    mean_abs_diff: float
    max_abs_diff: float
    per_image: tuple[ImageComparison, ...] = ()
    boxes: BoxAgreement | None = None

    @property
    def disagreements(self) -> list[ImageComparison]:
        """The images whose top-1 moved."""
        return [row for row in self.per_image if not row.agrees]


@dataclass(frozen=True)
class Latency:
    """Both models timed in the same run: alternating blocks, same delegate and thread count."""

    delegate: str
    threads: int
    rounds: int
    original_ms: float
    optimized_ms: float
    original_p95_ms: float
    optimized_p95_ms: float
    samples: tuple[int, int]

    @property
    def speedup(self) -> float:
        """Original median / optimised median; NaN when the optimised median is 0."""
        return self.original_ms / self.optimized_ms if self.optimized_ms > 0 else float("nan")


@dataclass(frozen=True)
class Artifact:
    """One optimised file (the ONNX model, or the OpenVINO IR) with its checks."""

    kind: str  # "onnx" | "openvino-ir"
    path: str
    size_bytes: int
    size_ratio: float
    delegate: str
    accuracy: Accuracy
    latency: Latency | None


@dataclass(frozen=True)
class OptimizeReport:
    """Everything ``edgeinfer optimize`` prints: sizes, accuracy and speed of each artifact."""

    model: str
    output: str
    mode: str
    original_bytes: int
    artifacts: tuple[Artifact, ...]
    calibration_images: int
    validation_images: int
    preprocessing: dict[str, Any]
    min_agreement: float
    ambiguous_margin: float
    written: bool
    refused: str | None = None
    forced: bool = False
    notes: tuple[str, ...] = field(default=())
    seconds: float = 0.0
    #: the task the pipeline reads the model for; a detector's artifacts carry ``accuracy.boxes``
    task: str = "classify"
    #: the layout a detector's outputs are read as (its decoder: a built-in's or a plug-in's; None for a classifier)
    layout: str | None = None
    #: a detector's thresholds (figure name -> minimum), the score its boxes are compared at and the NMS IoU they
    #: are kept at
    box_minimums: dict[str, float] = field(default_factory=dict)
    score_threshold: float | None = None
    iou_threshold: float | None = None
    #: nodes INT8 quantisation left in float (Softmax, a detector's decode tail): name -> op type
    float_nodes: dict[str, str] = field(default_factory=dict)
    #: INT8: how this CPU computes the model on the validating delegates (int8.int8_arithmetic)
    int8_arithmetic: dict[str, Any] = field(default_factory=dict)

    @property
    def onnx(self) -> Artifact:
        """The optimised ONNX model (always the first artifact)."""
        return self.artifacts[0]

    def to_dict(self) -> dict:
        """JSON-ready form (derived figures such as speedup included)."""
        data = asdict(self)
        for artifact, out in zip(self.artifacts, data["artifacts"]):
            if artifact.latency is not None:
                out["latency"]["speedup"] = round(artifact.latency.speedup, 3)
            for row, row_out in zip(artifact.accuracy.per_image, out["accuracy"]["per_image"]):
                row_out["agrees"] = row.agrees
        return data

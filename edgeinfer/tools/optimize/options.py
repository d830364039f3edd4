"""What ``optimize_model`` is asked to do: the options, their defaults and their validation."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

# the judgement's defaults are the one judgement's (pipeline/agreement.py), which the delegate probe judges by too:
# refuse an optimised model whose top-1 agrees with the original on fewer than DEFAULT_MIN_AGREEMENT of the
# decisive validation images, a detector whose boxes fall below any DEFAULT_MIN_* against the original's, the
# boxes compared at DEFAULT_SCORE_THRESHOLD after NMS at DEFAULT_NMS_IOU (``--iou``, within the pipeline option's
# bounds)
from ...pipeline.agreement import (
    DEFAULT_AMBIGUOUS_MARGIN,
    DEFAULT_MIN_AGREEMENT,
    DEFAULT_MIN_MAP50,
    DEFAULT_MIN_MEAN_IOU,
    DEFAULT_MIN_PRECISION,
    DEFAULT_MIN_RECALL,
    DEFAULT_NMS_IOU,
    DEFAULT_SCORE_THRESHOLD,
)
from ...pipeline.preprocess import RESIZE_MODES

MODES = ("int8", "fp16")
ACTIVATION_TYPES = ("uint8", "int8")
#: seconds of interleaved timing per comparison (original vs optimised); 0 skips timing
DEFAULT_BENCH_SECONDS = 4.0
DEFAULT_DELEGATE = "onnxruntime"

#: receives one line of progress at a time
Progress = Callable[[str], None]


@dataclass(frozen=True, kw_only=True)
class OptimizeOptions:
    """What to do to the model and how to check it. Validated on construction (ValueError)."""

    mode: str
    calibration: str | None = None
    validation: str | None = None
    min_agreement: float = DEFAULT_MIN_AGREEMENT
    ambiguous_margin: float = DEFAULT_AMBIGUOUS_MARGIN
    force: bool = False
    export_ir: bool = False
    mean: float | tuple[float, ...] | None = None
    std: float | tuple[float, ...] | None = None
    #: None: as inference reads the model (its metadata, its layout, else stretch)
    resize: str | None = None
    #: the layout a detector's outputs are read as (a built-in decoder's name or an installed plug-in's; None: chosen)
    decoder: str | None = None
    per_channel: bool = True
    activations: str = "uint8"
    #: 7-bit weights (ONNX Runtime's ``reduce_range``): what an x86 CPU without VNNI computes exactly with its fast
    #: U8S8 kernels (OpenVINO has no other way there), at some accuracy everywhere; see host.u8s8_saturates
    reduce_range: bool = False
    float_outputs: bool = True
    #: quantise every node: no Softmax, decode tail or output kept float (for comparison)
    quantize_all: bool = False
    min_recall: float = DEFAULT_MIN_RECALL
    min_precision: float = DEFAULT_MIN_PRECISION
    min_map50: float = DEFAULT_MIN_MAP50
    min_mean_iou: float = DEFAULT_MIN_MEAN_IOU
    score_threshold: float = DEFAULT_SCORE_THRESHOLD
    #: the NMS IoU both models' boxes are kept at (the pipeline's ``iou_threshold``)
    iou_threshold: float = DEFAULT_NMS_IOU
    threads: int | None = None
    delegate: str = DEFAULT_DELEGATE
    bench_seconds: float = DEFAULT_BENCH_SECONDS
    max_calibration_images: int | None = None

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, not {self.mode!r}")
        if self.mode == "int8" and not self.calibration:
            raise ValueError("INT8 quantisation needs calibration images: pass --calibration DIR")
        if self.mode == "fp16" and not (self.validation or self.calibration):
            raise ValueError("FP16 conversion is checked on images: pass --validation DIR")
        if not 0.0 <= self.min_agreement <= 1.0:
            raise ValueError(f"min_agreement must be within [0, 1], not {self.min_agreement}")
        for name in ("min_recall", "min_precision", "min_map50", "min_mean_iou"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"{name} must be within [0, 1], not {getattr(self, name)}")
        if not 0.0 < self.score_threshold < 1.0:
            raise ValueError(f"score_threshold must be within (0, 1), not {self.score_threshold}")
        from ...pipeline.options import PipelineOptions
        from ...util.config import out_of_bounds

        problem = out_of_bounds("iou_threshold", self.iou_threshold, PipelineOptions.option("iou_threshold").metadata)
        if problem:  # the pipeline's own bounds: the IoU a run could be given
            raise ValueError(problem)
        if not 0.0 <= self.ambiguous_margin < 1.0:
            raise ValueError(f"ambiguous_margin must be within [0, 1), not {self.ambiguous_margin}")
        if self.activations not in ACTIVATION_TYPES:
            raise ValueError(f"activations must be one of {ACTIVATION_TYPES}, not {self.activations!r}")
        if self.threads is not None and self.threads < 1:
            raise ValueError("threads must be >= 1")
        if self.bench_seconds < 0:
            raise ValueError("bench_seconds must be >= 0")
        if self.max_calibration_images is not None and self.max_calibration_images < 1:
            raise ValueError("max_calibration_images must be >= 1")
        if self.resize is not None and self.resize not in RESIZE_MODES:
            raise ValueError(f"resize must be stretch, letterbox or crop, not {self.resize!r}")

    @property
    def box_minimums(self) -> dict[str, float]:
        """The detector thresholds by figure name (agreement.FIGURES)."""
        return {"recall": self.min_recall, "precision": self.min_precision, "map50": self.min_map50,
                "mean_iou": self.min_mean_iou}

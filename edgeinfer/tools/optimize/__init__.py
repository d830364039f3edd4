"""Make an ONNX model smaller and faster, then prove it still answers like the original.

``optimize_model`` quantises (static INT8, QDQ, per-channel weights) or converts (FP16) a model,
optionally exports it to OpenVINO IR, and validates every artifact against the original on real
images before anything is written:

- accuracy: for a classifier, top-1 agreement with the original and the mean absolute difference of
  the class scores, per image and overall; for a detector (as the pipeline reads the model), its
  boxes against the original's: recall, precision, mAP50 and mean IoU of the matches;
- size: original bytes / optimised bytes;
- speed: both models timed in the same process, in alternating blocks, same thread count, medians.

A model below a threshold is refused (``AccuracyRejected``) unless the caller forces it. INT8 keeps
Softmax and, in a detector, the box-decode tail after the last learned layers in float. Everything
is written to a temporary file beside the output and renamed into place only at the end, so a
failure or a refusal never leaves a half-written model behind.

``optimizer`` runs the steps, one module each: ``options`` (what to do), ``images`` (calibration
and validation data, through the pipeline's Preprocessor), ``int8`` (INT8 quantisation),
``convert`` (FP16, OpenVINO IR), ``output`` (writability check, provenance stamp), ``validate``
(agreement, score difference, speedup, verdict), ``detectors`` (a detector run through the pipeline's
decoder, judged by ``agreement``: box matching, pure); ``report`` holds the records it returns.
"""

from __future__ import annotations

from ...pipeline.agreement import BoxAgreement, ImageBoxes, box_agreement
from .images import collect_images
from .int8 import float_outputs
from .optimizer import optimize_model
from .options import OptimizeOptions
from .output import METADATA_KEY
from .report import Accuracy, Artifact, ImageComparison, Latency, OptimizeReport
from .validate import compare_latency, compare_models, compare_to_reference, reference_outputs

__all__ = [
    "METADATA_KEY",
    "Accuracy",
    "Artifact",
    "BoxAgreement",
    "ImageBoxes",
    "ImageComparison",
    "Latency",
    "OptimizeOptions",
    "OptimizeReport",
    "box_agreement",
    "collect_images",
    "compare_latency",
    "compare_models",
    "compare_to_reference",
    "float_outputs",
    "optimize_model",
    "reference_outputs",
]

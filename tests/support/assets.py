"""The real models, photos and labels beside the repository (../shared/assets or $EDGEINFER_ASSETS)."""

from __future__ import annotations

import os
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
ASSETS = Path(os.environ.get("EDGEINFER_ASSETS", REPO.parent / "shared" / "assets")).resolve()
MODELS = ASSETS / "models"
IMAGES = ASSETS / "images"
LABELS = ASSETS / "labels"
DOCS = REPO / "docs"

MOBILENET_V2 = MODELS / "mobilenet_v2_1.0_224_quant.tflite"
MOBILENET_V2_ONNX = MODELS / "mobilenet_v2_1.0_224_quant.onnx"
MOBILENET_V2_FLOAT_ONNX = MODELS / "mobilenet_v2_1.0_224_float.onnx"
MOBILENET_TINY = MODELS / "mobilenet_v1_0.25_128_quant.tflite"
MOBILENET_TINY_ONNX = MODELS / "mobilenet_v1_0.25_128_quant.onnx"
IMAGENET_LABELS = LABELS / "imagenet_labels.txt"

#: the reference top-1 of MobileNet v2 quant (../shared/assets/README.md), label and score
REFERENCE_TOP1 = {
    "parrot.jpg": ("macaw", 1.00),
    "cat.bmp": ("Egyptian cat", 0.84),
    "grace_hopper.bmp": ("military uniform", 0.88),
    "cat_720p.jpg": ("Egyptian cat", 0.88),
    "dog_segmentation.bmp": ("Samoyed", 0.97),
    "squat.bmp": ("dumbbell", 0.95),
}

REFERENCES = ASSETS / "references"
#: MediaPipe BlazeFace short range and MediaPipe 0.10.21's own results on the shared photos
FACE_DETECTION = MODELS / "face_detection_short_range.tflite"
FACE_DETECTION_REFERENCE = REFERENCES / "face_detection_short_range_mediapipe.json"

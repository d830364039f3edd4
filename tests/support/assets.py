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

#: the reference top-1 of MobileNet v2 quant (../shared/assets/README.md), label and score
REFERENCE_TOP1 = {
    "parrot.jpg": ("macaw", 1.00),
    "cat.bmp": ("Egyptian cat", 0.84),
    "grace_hopper.bmp": ("military uniform", 0.88),
    "cat_720p.jpg": ("Egyptian cat", 0.88),
    "dog_segmentation.bmp": ("Samoyed", 0.97),
    "squat.bmp": ("dumbbell", 0.95),
}

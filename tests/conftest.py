"""Shared fixtures: the real assets beside the repository (../shared/assets or $EDGEINFER_ASSETS)."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
ASSETS = Path(os.environ.get("EDGEINFER_ASSETS", REPO.parent / "shared" / "assets")).resolve()
MODELS = ASSETS / "models"
IMAGES = ASSETS / "images"
LABELS = ASSETS / "labels"

#: the reference top-1 of MobileNet v2 quant (../shared/assets/README.md), label and score
REFERENCE_TOP1 = {
    "parrot.jpg": ("macaw", 1.00),
    "cat.bmp": ("Egyptian cat", 0.84),
    "grace_hopper.bmp": ("military uniform", 0.88),
    "cat_720p.jpg": ("Egyptian cat", 0.88),
    "dog_segmentation.bmp": ("Samoyed", 0.97),
    "squat.bmp": ("dumbbell", 0.95),
}

if not MODELS.is_dir():
    pytest.exit(f"test assets not found at {ASSETS}; set EDGEINFER_ASSETS", returncode=4)


@pytest.fixture(scope="session")
def assets() -> Path:
    return ASSETS


@pytest.fixture(scope="session")
def imagenet_labels() -> Path:
    return LABELS / "imagenet_labels.txt"


@pytest.fixture(scope="session")
def clip(tmp_path_factory) -> Path:
    """The MJPEG clip of the reference photos (pipeline_support.reference_clip), made once per run."""
    from pipeline_support import reference_clip

    return reference_clip(tmp_path_factory.mktemp("clips"))


def wait_until(condition, timeout: float = 10.0, interval: float = 0.02) -> bool:
    """Poll ``condition`` until it is true or ``timeout`` s pass; its last value."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(interval)
    return bool(condition())


def edgeinfer_cmd(*args: str) -> list[str]:
    """The CLI as a user runs it, in a subprocess."""
    return [sys.executable, "-m", "edgeinfer", *args]

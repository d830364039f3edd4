"""Session fixtures. Shared helpers live in the ``support`` package (tests/support/)."""

from __future__ import annotations

from pathlib import Path

import pytest
from support.assets import ASSETS, LABELS, MODELS

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
    """The MJPEG clip of the reference photos (support.pipeline.reference_clip), made once per run."""
    from support.pipeline import reference_clip

    return reference_clip(tmp_path_factory.mktemp("clips"))

"""Reading still images (OpenCV imported on first use)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import ImageError

if TYPE_CHECKING:
    import numpy as np

IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".bmp", ".webp", ".tif", ".tiff", ".ppm", ".pgm")


def read_image(path: str | os.PathLike) -> np.ndarray:
    """Decode an image file to an HxWx3 BGR uint8 array; ImageError if missing or undecodable."""
    import cv2

    image_path = Path(path)
    if not image_path.is_file():
        raise ImageError(f"image not found: {image_path}")
    image = cv2.imread(str(image_path), cv2.IMREAD_COLOR)
    if image is None:
        raise ImageError(f"cannot decode image {image_path} — is it a JPEG/PNG/BMP and complete?")
    return image


def list_images(folder: str | os.PathLike) -> list[Path]:
    """Image files directly inside ``folder``, sorted by name."""
    return sorted(p for p in Path(folder).iterdir() if p.suffix.lower() in IMAGE_SUFFIXES and p.is_file())

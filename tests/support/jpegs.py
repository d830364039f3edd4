"""Small real JPEGs of noise: evidence a test uploads (a snapshot is one, a clip several back to back)."""

from __future__ import annotations

import cv2
import numpy as np


def noise_jpeg(seed: int, width: int, height: int) -> bytes:
    """A real JPEG of noise (every seed encodes differently)."""
    image = np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8)
    ok, encoded = cv2.imencode(".jpg", image, [cv2.IMWRITE_JPEG_QUALITY, 80])
    assert ok
    return encoded.tobytes()


JPEGS = [noise_jpeg(seed, 16 + 8 * seed, 12 + 4 * seed) for seed in range(6)]

#: an MP4's head as the fleet manager checks it (its ftyp box): the manager stores an MP4 as it came, never decodes it
MP4_HEAD = b"\x00\x00\x00\x10ftypisom\x00\x00\x02\x00"

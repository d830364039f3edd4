"""The one-pass float NCHW path writes what the numpy path writes: letterbox (both ways round, its border centred or
bottom-right, grey or black), stretch and crop, RGB and BGR, per-channel mean and std — and it allocates nothing per
frame."""

from __future__ import annotations

import cv2
import numpy as np
import pytest
from support.assets import IMAGES
from support.pipeline import allocations_per_frame

from edgeinfer.pipeline.preprocess import Preprocessor
from edgeinfer.runtime.model import TensorSpec

SPEC = TensorSpec("images", (1, 3, 320, 320), "float32", "NCHW")


def both(size: tuple[int, int], **options) -> tuple[Preprocessor, Preprocessor]:
    fused, numpy_path = Preprocessor(SPEC, size, **options), Preprocessor(SPEC, size, **options)
    numpy_path._fused = None  # the path an input OpenCV cannot write whole channels of takes
    numpy_path._numpy_buffers()
    return fused, numpy_path


@pytest.mark.parametrize("size", [(640, 360), (360, 640), (320, 320)])
@pytest.mark.parametrize("options", [
    {"resize": "letterbox", "mean": 0.0, "std": 255.0},
    {"resize": "stretch", "mean": (123.7, 116.3, 103.5), "std": (58.4, 57.1, 57.4)},
    {"resize": "crop", "channels": "bgr"},
    {"resize": "letterbox", "channels": "bgr", "pad": "corner", "mean": 0.0, "std": 1.0, "pad_value": 114},
    {"resize": "letterbox", "pad": "corner", "pad_value": 0},
])
def test_the_fused_path_writes_what_the_numpy_path_writes(size, options):
    frame = cv2.resize(cv2.imread(str(IMAGES / "kite_and_cold.jpg")), size)
    fused, numpy_path = both(size, **options)
    assert fused._fused is not None
    got, want = np.empty(SPEC.shape, np.float32), np.empty(SPEC.shape, np.float32)
    assert fused(frame, got) == numpy_path(frame, want)
    np.testing.assert_allclose(got, want, atol=1e-5)


def test_the_fused_path_allocates_nothing_per_frame():
    frame = cv2.resize(cv2.imread(str(IMAGES / "kite_and_cold.jpg")), (360, 640))  # a pillarbox
    fused = Preprocessor(SPEC, (360, 640), resize="letterbox", mean=0.0, std=255.0)
    tensor = np.empty(SPEC.shape, np.float32)
    per_frame, growth = allocations_per_frame((fused(frame, tensor) for _ in range(60)), frames=60)
    assert per_frame < 1024 and growth < 4096, (per_frame, growth)

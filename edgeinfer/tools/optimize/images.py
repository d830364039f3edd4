"""Calibration and validation data: folders of images, fed to a model exactly as inference feeds frames.

Images go through :class:`~edgeinfer.pipeline.preprocess.Preprocessor`, the same code that prepares
frames at inference time, so the quantiser sees exactly what the model will see in production.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ...errors import OptimizeError
from .options import OptimizeOptions

if TYPE_CHECKING:
    import numpy as np

    from ...pipeline.preprocess import Transform
    from ...pipeline.tasks import ModelReading
    from ...runtime.engine import Engine

#: preprocessors kept per image size before the cache is cleared (folders rarely mix many sizes)
MAX_CACHED_SIZES = 16


def collect_images(folder: str | os.PathLike, what: str, limit: int | None = None) -> list[Path]:
    """Image files directly inside ``folder``; OptimizeError if it is missing or holds none."""
    from ...capture.images import IMAGE_SUFFIXES, list_images

    path = Path(folder)
    if not path.exists():
        raise OptimizeError(f"{what} folder not found: {path} — pass a folder of images")
    if not path.is_dir():
        raise OptimizeError(f"{what} path {path} is not a folder — pass a folder of images")
    images = list_images(path)
    if not images:
        raise OptimizeError(
            f"{what} folder {path} holds no images ({', '.join(IMAGE_SUFFIXES)}) — "
            "put a few hundred representative frames from the target camera there"
        )
    return images[:limit] if limit else images


def image_sets(options: OptimizeOptions) -> tuple[list[Path], list[Path], list[str]]:
    """The calibration and validation images the options name, and a note when they are the same set.

    Validation falls back to the calibration images (the same list object, so the note can tell).
    """
    calibration = (
        collect_images(options.calibration, "calibration", options.max_calibration_images)
        if options.calibration and options.mode == "int8" else []
    )
    if options.validation:
        validation = collect_images(options.validation, "validation")
    elif calibration:
        validation = calibration
    else:
        validation = collect_images(options.calibration, "validation") if options.calibration else []
    notes = []
    if calibration and validation is calibration:
        notes.append("validated on the calibration images themselves; pass --validation DIR with held-out "
                     "images for an unbiased check")
    return calibration, validation, notes


def normalisation_value(value: float | tuple[float, ...] | None) -> float | tuple[float, ...] | None:
    """A mean or std as the Preprocessor takes it: one number, or a tuple of floats per channel."""
    if value is None or isinstance(value, int | float):
        return value
    return tuple(float(v) for v in value)


class ImageFeeder:
    """Reads an image and writes it into an input buffer exactly as inference does.

    The resize and normalisation are the options' where given, else how the pipeline reads the model
    (``reading``: its metadata, its output layout's family), else stretch and the float default.
    """

    def __init__(self, engine: Engine, options: OptimizeOptions, reading: ModelReading | None = None) -> None:
        from ...pipeline.preprocess import LETTERBOX_PAD, input_geometry

        spec = engine.inputs[0] if engine.inputs else None
        if len(engine.inputs) != 1 or spec is None:
            raise OptimizeError(
                f"{engine.model.path} has {len(engine.inputs)} inputs; optimize calibrates models with one image input"
            )
        try:
            input_geometry(spec)
        except ValueError as exc:
            raise OptimizeError(f"cannot calibrate {engine.model.path} on images: {exc}") from None
        self.spec = spec
        self.resize = options.resize or (reading.resize if reading else None) or "stretch"
        self.mean, self.std = normalisation_value(options.mean), normalisation_value(options.std)
        if reading is not None and options.mean is None and options.std is None:
            self.mean, self.std = normalisation_value(reading.mean), normalisation_value(reading.std)
        # the channel order and the letterbox's border as the pipeline feeds the model (its family's: YOLOX BGR)
        self.channels, self.pad, self.pad_value = (reading.channels, reading.pad, reading.pad_value) if reading \
            else ("rgb", "centre", LETTERBOX_PAD)
        self._preprocessors: dict[tuple[int, int], Any] = {}

    def __call__(self, image_path: Path, dst: np.ndarray) -> Transform:
        """Write ``image_path`` into ``dst``; the transform from model-input to image pixels."""
        from ...capture.images import read_image
        from ...pipeline.preprocess import Preprocessor
        from ...util.native import captured_native_stderr

        with captured_native_stderr("OpenCV"):  # libjpeg prints "Premature end of JPEG file" itself
            frame = read_image(image_path)
        size = (frame.shape[1], frame.shape[0])
        preprocess = self._preprocessors.get(size)
        if preprocess is None:
            if len(self._preprocessors) > MAX_CACHED_SIZES:
                self._preprocessors.clear()
            preprocess = self._preprocessors[size] = Preprocessor(
                self.spec, size, resize=self.resize, mean=self.mean, std=self.std, channels=self.channels,
                pad=self.pad, pad_value=self.pad_value,
            )
        return preprocess(frame, dst)

    def describe(self) -> dict[str, Any]:
        """The preprocessing applied, as recorded in the report and the optimised model's metadata."""
        from ...pipeline.preprocess import DEFAULT_FLOAT_MEAN, DEFAULT_FLOAT_STD

        return {
            "resize": self.resize,
            "rgb": self.channels == "rgb",
            "channels": self.channels,
            "pad": self.pad,
            "pad_value": self.pad_value,
            "mean": DEFAULT_FLOAT_MEAN if self.mean is None else self.mean,
            "std": DEFAULT_FLOAT_STD if self.std is None else self.std,
            "input": self.spec.name,
            "shape": list(self.spec.shape),
            "dtype": self.spec.dtype,
        }

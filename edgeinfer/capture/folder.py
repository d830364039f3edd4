"""Still images as a frame source: a folder, a glob pattern or a list of paths, JPEGs decoded reduced on request."""

from __future__ import annotations

import glob
import logging
import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import CaptureError
from .base import FramePacer, FrameSource
from .images import IMAGE_SUFFIXES, list_images
from .jpeg import IMREAD_REDUCED_FLAGS, DecodeFloor, JpegHeaderReader, reduction_for
from .media import SOURCE_HELP

if TYPE_CHECKING:
    import numpy as np

log = logging.getLogger(__name__)


class ImageFolderSource(FrameSource):
    """Still images from a folder, a glob pattern or a list of paths, in name order."""

    def __init__(self, images: str | os.PathLike | Sequence[str | os.PathLike], *, loop: bool = False,
                 fps: float | None = None) -> None:
        if isinstance(images, (str, os.PathLike)):
            self.pattern = str(images)
            description = f"images {self.pattern}"
        else:
            self.pattern = None
            description = f"{len(images)} image(s)"
        super().__init__(description)
        self._given = None if isinstance(images, (str, os.PathLike)) else [Path(p) for p in images]
        self.loop = loop
        self._pacer = FramePacer(fps)
        self._fps = fps
        self.paths: list[Path] = []
        self._next = 0
        self.skipped = 0
        self._min_size: tuple[int, int] | DecodeFloor | None = None
        self._native: tuple[int, int] | None = None
        self._reduction = 1
        self._jpeg_headers: JpegHeaderReader | None = None  # made by prefer_min_size

    def prefer_min_size(self, size: tuple[int, int] | DecodeFloor | None) -> bool:
        """JPEGs then decode at 1/2, 1/4 or 1/8 scale (OpenCV's IMREAD_REDUCED_*, libjpeg's DCT
        scaling), never below ``size``; needs simplejpeg to read the size first. Other formats: full."""
        if self._jpeg_headers is None:
            try:
                self._jpeg_headers = JpegHeaderReader()
            except ImportError:
                return False
        self._min_size = size
        return True

    @property
    def native_size(self) -> tuple[int, int] | None:
        return self._native

    @property
    def reduction(self) -> int:
        return self._reduction

    @property
    def fps(self) -> float | None:
        return self._fps

    def _open(self) -> None:
        paths = self._given if self._given is not None else self._find_paths(self.pattern or "")
        missing = [p for p in paths if not p.is_file()]
        if missing:
            raise CaptureError(f"image not found: {missing[0]}")
        if not paths:
            raise CaptureError("the image list is empty")
        self.paths = list(paths)

    @staticmethod
    def _find_paths(pattern: str) -> list[Path]:
        """The images a folder, a file or a glob pattern names; CaptureError when there are none."""
        folder = Path(pattern)
        if folder.is_dir():
            paths = list_images(folder)
            if not paths:
                raise CaptureError(f"no images in folder {folder} (looked for {', '.join(IMAGE_SUFFIXES)})")
            return paths
        if folder.is_file():
            return [folder]
        if any(ch in pattern for ch in "*?["):
            paths = sorted(Path(p) for p in glob.glob(pattern) if Path(p).is_file())
            if not paths:
                raise CaptureError(f"no files match {pattern!r}")
            return paths
        raise CaptureError(f"image source not found: {pattern} — {SOURCE_HELP}")

    def _read(self, out: np.ndarray | None) -> np.ndarray | None:
        failures = 0
        while True:
            if self._next >= len(self.paths):
                if not self.loop:
                    return None
                self._next = 0
            path = self.paths[self._next]
            self._next += 1
            if not self._pacer.wait(self):
                return None
            headers = self._jpeg_headers
            header = headers.size(path) if headers is not None and self._min_size is not None else None
            frame = self._decode(path, out, header)
            if frame is not None:
                return frame
            self.skipped += 1
            failures += 1
            log.warning("skipping %s: not a decodable image", path)
            if failures >= len(self.paths):
                raise CaptureError(f"none of the images in {self.description} can be decoded")

    def _decode(self, path: Path, out: np.ndarray | None, header: tuple[int, int] | None) -> np.ndarray | None:
        """imread into ``out`` when it fits; reduced when the JPEG ``header`` (w, h) allows it."""
        import cv2

        factor = 1
        if header is not None:  # EXIF may rotate the picture: the reduction must suit both ways round
            factor = min(reduction_for(header, self._min_size), reduction_for(header[::-1], self._min_size))
        flags = IMREAD_REDUCED_FLAGS.get(factor, cv2.IMREAD_COLOR)
        frame = None
        if out is not None and cv2.haveImageReader(str(path)):
            try:  # OpenCV >= 4.10 decodes into a buffer of the right size
                frame = cv2.imread(str(path), out, flags)
            except (cv2.error, TypeError):
                frame = None
        if frame is None:
            frame = cv2.imread(str(path), flags)
        self._native, self._reduction = None, 1
        if frame is not None and factor > 1 and header is not None:
            width, height = header
            shape = frame.shape[:2]
            if shape == (-(-height // factor), -(-width // factor)):
                self._native, self._reduction = (width, height), factor
            elif shape == (-(-width // factor), -(-height // factor)):  # rotated by its EXIF orientation
                self._native, self._reduction = (height, width), factor
            else:  # not what libjpeg's scaling gives: do not guess the mapping, decode it whole
                frame = cv2.imread(str(path), cv2.IMREAD_COLOR)
        return frame

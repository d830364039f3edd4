"""Frame sources: cameras, streams, files, image folders and a synthetic pattern.

Every source reads a frame into a buffer the caller owns (``source.read(out)``) so that a
pipeline can cycle a ring of preallocated frames and allocate nothing per frame. ``read`` returns
the array holding the frame (``out`` itself unless the frame size changed), or ``None`` when the
source has ended (end of a file, or :meth:`FrameSource.interrupt`).

Live sources (V4L2 cameras, GStreamer pipelines, picamera2, RTSP/HTTP streams) reconnect with
exponential backoff and jitter when the device or stream drops; they raise :class:`CaptureError`
only when a reconnect deadline passes. Files end cleanly, or restart with ``loop=True``. A source
that cannot be opened raises :class:`CaptureError` at :meth:`FrameSource.open` with a message
that says what to check.

OpenCV (and picamera2, PyAV, simplejpeg) are imported when a source is opened, never at
``import edgeinfer``.

This package's own module is the factory (:func:`open_source`): it picks a source for what the
user named. The sources live in their own modules, which never import this one:

* :mod:`.base` — the :class:`FrameSource` contract and the :class:`FramePacer`;
* :mod:`.reconnect` — how every live source drops and comes back (:class:`Backoff`);
* :mod:`.media` — stream URLs and video files: recognising them, what to check when they fail;
* :mod:`.opencv` — cameras, streams, GStreamer pipelines and video files through OpenCV;
* :mod:`.hwdecode` — RTSP on the board's hardware decoder that the device profile names, else FFmpeg;
* :mod:`.mjpeg` — MJPEG files and HTTP MJPEG streams through PyAV, decoded by :mod:`.jpeg`;
* :mod:`.jpeg` — JPEG decoded at 1/2, 1/4 or 1/8 scale (libjpeg-turbo);
* :mod:`.folder`, :mod:`.synthetic`, :mod:`.picamera2` — still images, generated frames, Pi cameras;
* :mod:`.clips` — test clips from real photos; :mod:`.images` — reading one image.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from ..errors import CaptureError, NotMjpeg
from ..util.backoff import Backoff
from . import mjpeg
from .base import FrameSource
from .clips import cached_test_clip, make_test_clip
from .folder import ImageFolderSource
from .images import IMAGE_SUFFIXES
from .media import SOURCE_HELP, STREAM_SCHEMES, is_mjpeg_avi
from .opencv import CameraSource, GStreamerSource, OpenCVSource, StreamSource, VideoFileSource, gstreamer_available
from .picamera2 import PiCamera2Source
from .reconnect import DEFAULT_BACKOFF
from .synthetic import SyntheticSource


def parse_size(text: str) -> tuple[int, int]:
    """``"640x480"`` -> ``(640, 480)``; ValueError otherwise."""
    width, sep, height = text.lower().partition("x")
    try:
        size = (int(width), int(height))
    except ValueError:
        size = (0, 0)
    if not sep or size[0] <= 0 or size[1] <= 0:
        raise ValueError(f"size must look like 640x480, not {text!r}")
    return size


def _parse_synthetic(spec: str) -> tuple[tuple[int, int] | None, float | None]:
    """``synthetic[:WxH][@FPS]``."""
    rest = spec[len("synthetic"):].lstrip(":")
    size_text, _, fps_text = rest.partition("@")
    size = parse_size(size_text) if size_text else None
    try:
        fps = float(fps_text) if fps_text else None
    except ValueError:
        raise ValueError(f"synthetic fps must be a number: {spec!r}") from None
    return size, fps


def open_source(
    source: str | int | os.PathLike | FrameSource,
    *,
    size: tuple[int, int] | None = None,
    fps: float | None = None,
    fourcc: str | None = None,
    loop: bool = False,
    backoff: Backoff = DEFAULT_BACKOFF,
    open_now: bool = True,
    reduced: bool = True,
) -> FrameSource:
    """Make (and by default open) the frame source that ``source`` names.

    ``0`` / ``"/dev/video0"``: V4L2 camera (``size``, ``fps``, ``fourcc`` requested from the driver);
    ``rtsp://`` / ``http://`` …: network stream; text containing ``!``: GStreamer pipeline;
    ``"picamera2[:N]"``; ``"synthetic[:WxH[@FPS]]"``; a folder, a glob or an image file: still images;
    any other path: a video file (``loop`` restarts it at the end). ``reduced=False``: the caller wants
    full-size frames, so MJPEG is read by OpenCV rather than PyAV (which is only worth its memory for
    decoding at 1/2-1/8 scale).
    """
    if isinstance(source, FrameSource):
        if open_now:
            source.open()
        return source
    made = _make_source(source, size=size, fps=fps, fourcc=fourcc, loop=loop, backoff=backoff, probe=open_now,
                        reduced=reduced)
    if open_now:
        try:
            made.open()
        except NotMjpeg:  # an HTTP stream of another codec (HLS, MP4): OpenCV's FFmpeg reads it
            assert isinstance(made, mjpeg.MjpegStreamSource)
            made = StreamSource(made.url, backoff=backoff).open()
    return made


def _make_source(source: str | int | os.PathLike, *, size, fps, fourcc, loop, backoff, probe,
                 reduced: bool = True) -> FrameSource:
    if isinstance(source, bool):
        raise TypeError("source must be a path, URL, camera index or FrameSource, not a bool")
    if isinstance(source, int):
        return CameraSource(source, size=size, fps=fps, fourcc=fourcc, backoff=backoff)
    text = os.fspath(source).strip() if isinstance(source, os.PathLike) else str(source).strip()
    if not text:
        raise ValueError(f"empty source — {SOURCE_HELP}")
    lower = text.lower()
    camera_only = {"fourcc": fourcc}
    if text.isdigit():
        return CameraSource(int(text), size=size, fps=fps, fourcc=fourcc, backoff=backoff)
    if lower.startswith("/dev/video"):
        return CameraSource(text, size=size, fps=fps, fourcc=fourcc, backoff=backoff)
    if lower.startswith("picamera2"):
        _reject(text, **camera_only)
        index = text.partition(":")[2]
        return PiCamera2Source(int(index) if index.isdigit() else 0, size=size, fps=fps, backoff=backoff)
    if lower.startswith("synthetic"):
        _reject(text, **camera_only)
        parsed_size, parsed_fps = _parse_synthetic(text)
        return SyntheticSource(size or parsed_size or (640, 480), fps=fps or parsed_fps)
    if lower.startswith(STREAM_SCHEMES):
        _reject(text, size=size, fps=fps, **camera_only)
        # HTTP MJPEG through PyAV (it can decode reduced) when opening now can tell whether it is MJPEG
        if probe and reduced and lower.startswith(("http://", "https://")) and mjpeg.available():
            return mjpeg.MjpegStreamSource(text, backoff=backoff)
        if lower.startswith(("rtsp://", "rtsps://")):
            from .hwdecode import rtsp_source  # the board's hardware decoder for the codec the URL states

            return rtsp_source(text, backoff=backoff)
        return StreamSource(text, backoff=backoff)
    if "!" in text:
        _reject(text, size=size, fps=fps, **camera_only)
        return GStreamerSource(text, backoff=backoff)
    path = Path(text).expanduser()
    if path.is_dir() or any(ch in text for ch in "*?[") or (path.is_file() and path.suffix.lower() in IMAGE_SUFFIXES):
        _reject(text, size=size, **camera_only)
        return ImageFolderSource(str(path) if path.exists() else text, loop=loop, fps=fps)
    if not path.exists():
        raise CaptureError(f"source not found: {text} — {SOURCE_HELP}")
    _reject(text, size=size, fps=fps, **camera_only)
    return video_file_source(path, loop=loop, reduced=reduced)


def video_file_source(path: str | os.PathLike, *, loop: bool = False, pace: bool = False,
                      reduced: bool = True) -> VideoFileSource | mjpeg.MjpegFileSource:
    """The best reader for a video file: MJPEG AVIs through PyAV + libjpeg-turbo when installed
    (they can decode at reduced scale, see :mod:`edgeinfer.capture.mjpeg`), anything else through OpenCV.
    ``reduced=False`` (full-size frames wanted) reads MJPEG through OpenCV too: PyAV's own FFmpeg would
    cost ~18 MiB of memory for nothing."""
    if reduced and is_mjpeg_avi(Path(path)) and mjpeg.available():
        return mjpeg.MjpegFileSource(path, loop=loop, pace=pace)
    return VideoFileSource(path, loop=loop, pace=pace)


def _reject(source: str, **given: Any) -> None:
    """ValueError when a camera-only option is given for a source that cannot honour it."""
    for name, value in given.items():
        if value:
            raise ValueError(f"{name} cannot be set for source {source!r} (it applies to cameras)")


__all__ = [
    "DEFAULT_BACKOFF",
    "Backoff",
    "CameraSource",
    "FrameSource",
    "GStreamerSource",
    "ImageFolderSource",
    "OpenCVSource",
    "PiCamera2Source",
    "StreamSource",
    "SyntheticSource",
    "VideoFileSource",
    "cached_test_clip",
    "gstreamer_available",
    "make_test_clip",
    "open_source",
    "parse_size",
]

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

OpenCV (and picamera2) are imported when a source is opened, never at ``import edgeinfer``.
"""

from __future__ import annotations

import glob as _glob
import hashlib
import logging
import os
import random
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import CaptureError
from .images import IMAGE_SUFFIXES

if TYPE_CHECKING:
    import numpy as np

log = logging.getLogger("edgeinfer.capture")

STREAM_SCHEMES = ("rtsp://", "rtsps://", "rtmp://", "http://", "https://", "udp://", "tcp://", "srt://")
#: how long opening a network stream may take before it counts as failed
DEFAULT_OPEN_TIMEOUT_S = 10.0
#: a live stream that delivers nothing for this long counts as dropped
DEFAULT_READ_TIMEOUT_S = 5.0
SOURCE_HELP = (
    "give a video file, an image folder or glob, a camera index or /dev/videoN, an rtsp:// or http:// URL, "
    "a GStreamer pipeline (… ! appsink), 'picamera2' or 'synthetic[:WxH[@FPS]]'"
)


@dataclass(frozen=True, kw_only=True)
class Backoff:
    """Reconnect schedule of a live source: delays grow ``factor``-fold from ``initial_s`` to ``max_s``."""

    initial_s: float = 0.25
    max_s: float = 5.0
    factor: float = 2.0
    #: each delay is multiplied by a random factor in [1 - jitter, 1 + jitter]
    jitter: float = 0.2
    #: give up (CaptureError) after this long without a frame; None keeps trying for ever
    give_up_s: float | None = None

    def __post_init__(self) -> None:
        if self.initial_s <= 0 or self.max_s < self.initial_s or self.factor < 1.0 or not 0 <= self.jitter < 1:
            raise ValueError(f"invalid backoff {self!r}: need 0 < initial_s <= max_s, factor >= 1, 0 <= jitter < 1")
        if self.give_up_s is not None and self.give_up_s < 0:
            raise ValueError("backoff give_up_s must be >= 0 or None")

    def delays(self) -> Iterator[float]:
        """The successive delays (endless)."""
        delay = self.initial_s
        while True:
            yield delay * random.uniform(1.0 - self.jitter, 1.0 + self.jitter)
            delay = min(delay * self.factor, self.max_s)


DEFAULT_BACKOFF = Backoff()


class FrameSource(ABC):
    """Something that yields BGR uint8 frames into caller-owned buffers; open, read, close."""

    #: True for cameras and streams: they reconnect when they drop, and frames come at their own pace
    live: bool = False

    def __init__(self, description: str) -> None:
        self.description = description
        #: frames delivered so far
        self.frames_read = 0
        #: successful reconnects (live sources)
        self.reconnects = 0
        #: frames that did not decode and were skipped
        self.corrupt_frames = 0
        self._opened = False
        self._closed = False
        self._interrupted = threading.Event()

    # -- lifetime ----------------------------------------------------------------------------
    def open(self) -> FrameSource:
        """Open the device / file / stream; CaptureError with what to check when it fails. Idempotent."""
        if self._closed:
            raise CaptureError(f"{self.description} is closed — open a new source")
        if not self._opened:
            self._open()
            self._opened = True
        return self

    def close(self) -> None:
        """Release the device / file / stream. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._interrupted.set()
        self._release()

    def interrupt(self) -> None:
        """Make a blocked or pacing ``read`` return None soon (used by a pipeline's stop())."""
        self._interrupted.set()

    def resume(self) -> None:
        """Undo :meth:`interrupt` so that reading can continue."""
        if not self._closed:
            self._interrupted.clear()

    @property
    def interrupted(self) -> bool:
        return self._interrupted.is_set()

    def __enter__(self) -> FrameSource:
        return self.open()

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.description}>"

    # -- frames ------------------------------------------------------------------------------
    @property
    def fps(self) -> float | None:
        """Nominal frame rate, when the source knows one."""
        return None

    def read(self, out: np.ndarray | None = None) -> np.ndarray | None:
        """The next frame (written into ``out`` when its shape fits), or None when the source ended."""
        if not self._opened:
            self.open()
        if self._interrupted.is_set():
            return None
        frame = self._read(out)
        if frame is not None:
            self.frames_read += 1
        return frame

    #: read_encoded() / decode() split reading a frame from decoding it (MJPEG files and streams):
    #: two threads can decode consecutive frames at once, and a frame dropped before it is
    #: decoded costs no decode. Frames come in order; keeping them in order is the caller's job.
    defers_decode: bool = False

    def read_encoded(self) -> Any | None:
        """The next frame still compressed (pass it to :meth:`decode`), or None at the end."""
        raise NotImplementedError(f"{type(self).__name__} cannot hand out undecoded frames")

    def decode(self, encoded: Any, out: np.ndarray | None = None) -> np.ndarray | None:
        """Decode what :meth:`read_encoded` gave (into ``out`` when it fits); None when it is damaged.

        Thread-safe: consecutive frames may be decoded by different threads at the same time.
        """
        raise NotImplementedError(f"{type(self).__name__} cannot hand out undecoded frames")

    def prefer_min_size(self, size: tuple[int, int] | None) -> bool:
        """Allow frames smaller than the source's own, down to ``size`` (w, h); None: full size again.

        Sources that can decode less than the whole frame (MJPEG at 1/2, 1/4, 1/8 scale) do so
        from the next frame on and return True; the others ignore it and return False.
        """
        return False

    @property
    def native_size(self) -> tuple[int, int] | None:
        """(width, height) of the source's own frames when they are delivered reduced; else None."""
        return None

    @property
    def reduction(self) -> int:
        """The last frame was decoded at 1/reduction of the source's own size (1: full size)."""
        return 1

    def frames(self) -> Iterator[np.ndarray]:
        """Iterate over frames, reusing one buffer (copy a frame you keep)."""
        buffer = None
        while True:
            frame = self.read(buffer)
            if frame is None:
                return
            buffer = frame
            yield frame

    # -- for subclasses ----------------------------------------------------------------------
    @abstractmethod
    def _open(self) -> None:
        """Open or raise CaptureError."""

    @abstractmethod
    def _read(self, out: np.ndarray | None) -> np.ndarray | None:
        """One frame or None at the end."""

    def _release(self) -> None:  # noqa: B027 - optional hook, most sources hold nothing
        """Drop device handles (may be called more than once)."""

    def _sleep(self, seconds: float) -> bool:
        """Sleep unless interrupted; False when interrupted. Allocates nothing (no Event.wait)."""
        deadline = time.monotonic() + seconds
        while not self._interrupted.is_set():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return True
            time.sleep(min(remaining, 0.05))
        return False


class _Pacer:
    """Holds a source to ``fps`` frames per second (no allocation per frame)."""

    def __init__(self, fps: float | None) -> None:
        self.period = 1.0 / fps if fps else 0.0
        self.next_due = 0.0

    def wait(self, source: FrameSource) -> bool:
        if not self.period:
            return True
        now = time.monotonic()
        if self.next_due > now:
            if not source._sleep(self.next_due - now):
                return False
            self.next_due += self.period
        else:  # late (or first frame): restart the schedule from now
            self.next_due = now + self.period
        return True


# ----------------------------------------------------------------------------------- OpenCV

def _cv2() -> Any:
    import cv2

    return cv2


class OpenCVSource(FrameSource):
    """A ``cv2.VideoCapture`` over a file, camera, stream or GStreamer pipeline."""

    def __init__(self, target: str | int, description: str, *, api: int | None = None,
                 params: Sequence[int] = (), loop: bool = False, live: bool = False,
                 backoff: Backoff = DEFAULT_BACKOFF) -> None:
        super().__init__(description)
        self.target = target
        self.api = api
        self.params = tuple(params)
        self.loop = loop
        self.live = live
        self.backoff = backoff
        self._cap: Any = None
        self._fps: float | None = None
        self.backend = ""

    @property
    def fps(self) -> float | None:
        return self._fps

    def _open(self) -> None:
        self._cap = self._open_capture()

    def _open_capture(self) -> Any:
        cv2 = _cv2()
        api = cv2.CAP_ANY if self.api is None else self.api
        try:
            cap = cv2.VideoCapture(self.target, api, list(self.params))
        except cv2.error as exc:
            raise CaptureError(f"cannot open {self.description}: {' '.join(str(exc).split())}") from exc
        if not cap.isOpened():
            cap.release()
            raise CaptureError(self._open_failure())
        self._configure(cap)
        fps = cap.get(cv2.CAP_PROP_FPS)
        self._fps = float(fps) if fps and 0 < fps < 1000 else None
        self.backend = cap.getBackendName()
        log.debug("opened %s with OpenCV %s", self.description, self.backend)
        return cap

    def _configure(self, cap: Any) -> None:
        """Apply device settings after opening (cameras)."""

    def _open_failure(self) -> str:
        return f"cannot open {self.description} — {SOURCE_HELP}"

    def _release(self) -> None:
        cap, self._cap = self._cap, None
        if cap is not None:
            cap.release()

    def _grab(self, out: np.ndarray | None) -> np.ndarray | None:
        cap = self._cap
        if cap is None:
            return None
        ok, frame = cap.read() if out is None else cap.read(out)
        return frame if ok else None

    def _read(self, out: np.ndarray | None) -> np.ndarray | None:
        frame = self._grab(out)
        if frame is not None:
            return frame
        if self.live:
            return self._reconnect(out)
        if self.loop and self.frames_read and not self._interrupted.is_set():
            return self._restart(out)
        return None

    def _restart(self, out: np.ndarray | None) -> np.ndarray | None:
        cv2 = _cv2()
        if self._cap is not None and self._cap.set(cv2.CAP_PROP_POS_FRAMES, 0):
            frame = self._grab(out)
            if frame is not None:
                return frame
        self._release()  # the backend cannot seek: open the file again
        self._cap = self._open_capture()
        return self._grab(out)

    def _reconnect(self, out: np.ndarray | None, grab: Callable[[Any], Any] | None = None) -> Any:
        """Reopen with backoff until ``grab(out)`` (default ``self._grab``) gives something; None when
        interrupted; CaptureError after ``backoff.give_up_s``."""
        grab = grab or self._grab
        started = time.monotonic()
        give_up = self.backoff.give_up_s
        last_error = "it stopped delivering frames"
        log.warning("%s dropped; reconnecting", self.description)
        for delay in self.backoff.delays():
            self._release()
            if give_up is not None:
                left = give_up - (time.monotonic() - started)
                if left <= 0:
                    break
                delay = min(delay, left)
            if not self._sleep(delay):
                return None
            try:
                self._cap = self._open_capture()
            except CaptureError as exc:
                last_error = str(exc)
                log.debug("reconnect to %s failed: %s", self.description, exc)
                continue
            frame = grab(out)
            if frame is not None:
                self.reconnects += 1
                log.warning("%s reconnected after %.1f s", self.description, time.monotonic() - started)
                return frame
            last_error = "it opened but delivered no frame"
        if self._interrupted.is_set():
            return None
        raise CaptureError(
            f"{self.description} dropped and did not come back within {give_up:g} s ({last_error}) — "
            "check the cable / network and that the device is powered"
        )


class CameraSource(OpenCVSource):
    """A V4L2 camera (``0`` or ``/dev/video0``) with optional size, fps and FOURCC (e.g. ``MJPG``)."""

    def __init__(self, device: int | str, *, size: tuple[int, int] | None = None, fps: float | None = None,
                 fourcc: str | None = None, buffers: int | None = None, backoff: Backoff = DEFAULT_BACKOFF) -> None:
        if fourcc is not None and len(fourcc) != 4:
            raise ValueError(f"fourcc must be 4 characters (MJPG, YUYV, …), not {fourcc!r}")
        super().__init__(device, f"camera {device}", api=None, live=True, backoff=backoff)
        self.device = device
        self.requested_size = size
        self.requested_fps = fps
        self.fourcc = fourcc
        self.buffers = buffers

    def _open_capture(self) -> Any:
        cv2 = _cv2()
        if isinstance(self.device, str):
            path = Path(self.device)
            if not path.exists():
                raise CaptureError(
                    f"cannot open {self.description}: {path} does not exist — list cameras with "
                    "`v4l2-ctl --list-devices` (or `ls /dev/video*`) and check the cable"
                )
            if not os.access(path, os.R_OK | os.W_OK):
                raise CaptureError(
                    f"cannot open {self.description}: permission denied on {path} — add the user to the "
                    "'video' group (sudo usermod -aG video $USER) and log in again"
                )
        self.api = cv2.CAP_V4L2
        return super()._open_capture()

    def _configure(self, cap: Any) -> None:
        cv2 = _cv2()
        # FOURCC first: many UVC cameras only offer large sizes at high rates in MJPG.
        if self.fourcc:
            cap.set(cv2.CAP_PROP_FOURCC, cv2.VideoWriter_fourcc(*self.fourcc))
        if self.requested_size:
            cap.set(cv2.CAP_PROP_FRAME_WIDTH, self.requested_size[0])
            cap.set(cv2.CAP_PROP_FRAME_HEIGHT, self.requested_size[1])
        if self.requested_fps:
            cap.set(cv2.CAP_PROP_FPS, self.requested_fps)
        if self.buffers:
            cap.set(cv2.CAP_PROP_BUFFERSIZE, self.buffers)
        got = (int(cap.get(cv2.CAP_PROP_FRAME_WIDTH)), int(cap.get(cv2.CAP_PROP_FRAME_HEIGHT)))
        if self.requested_size and got != tuple(self.requested_size):
            log.warning("%s: asked for %dx%d, the driver gave %dx%d", self.description, *self.requested_size, *got)

    def _open_failure(self) -> str:
        return (f"cannot open {self.description} — is it connected and not used by another program "
                "(`fuser /dev/video*`)? list cameras with `v4l2-ctl --list-devices`")


class StreamSource(OpenCVSource):
    """An RTSP / HTTP (MJPEG, HLS) / RTMP / UDP stream through OpenCV's FFmpeg backend."""

    def __init__(self, url: str, *, open_timeout_s: float = DEFAULT_OPEN_TIMEOUT_S,
                 read_timeout_s: float = DEFAULT_READ_TIMEOUT_S, backoff: Backoff = DEFAULT_BACKOFF) -> None:
        self.url = url
        cv2 = _cv2()
        params = (cv2.CAP_PROP_OPEN_TIMEOUT_MSEC, int(open_timeout_s * 1000),
                  cv2.CAP_PROP_READ_TIMEOUT_MSEC, int(read_timeout_s * 1000))
        super().__init__(url, f"stream {_redact(url)}", api=cv2.CAP_FFMPEG, params=params, live=True,
                         backoff=backoff)

    def _open_capture(self) -> Any:
        # RTSP over TCP survives lossy Wi-Fi; FFmpeg's default (UDP) tears frames. A user setting wins.
        if self.url.lower().startswith(("rtsp://", "rtsps://")) and "OPENCV_FFMPEG_CAPTURE_OPTIONS" not in os.environ:
            os.environ["OPENCV_FFMPEG_CAPTURE_OPTIONS"] = "rtsp_transport;tcp"
        return super()._open_capture()

    def _open_failure(self) -> str:
        return (f"cannot open {self.description} — check the URL, that the server is up and reachable "
                "(try `ffprobe URL`), and credentials")


class GStreamerSource(OpenCVSource):
    """A GStreamer pipeline string ending in ``appsink`` (``nvarguscamerasrc``, ``libcamerasrc``, …)."""

    def __init__(self, pipeline: str, *, backoff: Backoff = DEFAULT_BACKOFF) -> None:
        text = pipeline.strip()
        if "appsink" not in text:
            text += " ! videoconvert ! video/x-raw,format=BGR ! appsink drop=true max-buffers=2"
        super().__init__(text, f"GStreamer pipeline {text!r}", live=True, backoff=backoff)

    def _open_capture(self) -> Any:
        cv2 = _cv2()
        if not gstreamer_available():
            raise CaptureError(
                f"cannot open {self.description}: this OpenCV build has no GStreamer support "
                "(see cv2.getBuildInformation()) — install the distribution's OpenCV (apt install python3-opencv) "
                "or build opencv-python with GStreamer"
            )
        self.api = cv2.CAP_GSTREAMER
        return super()._open_capture()


def gstreamer_available() -> bool:
    """True when the installed OpenCV can read GStreamer pipelines."""
    cv2 = _cv2()
    for line in cv2.getBuildInformation().splitlines():
        if line.strip().startswith("GStreamer:"):
            return "YES" in line
    return False


class VideoFileSource(OpenCVSource):
    """A video file; ends at its end, or restarts with ``loop=True``.

    MJPEG AVI files are read with OpenCV's own MJPEG reader (libjpeg-turbo straight to BGR),
    which is faster than FFmpeg's decode-then-convert; anything else goes through FFmpeg.
    """

    def __init__(self, path: str | os.PathLike, *, loop: bool = False, pace: bool = False) -> None:
        self.path = Path(path)
        super().__init__(str(self.path), f"video file {self.path}", loop=loop)
        #: play at the file's frame rate (like a camera) instead of as fast as possible
        self.pace = pace
        self._pacer = _Pacer(None)

    def _open_capture(self) -> Any:
        cv2 = _cv2()
        if not self.path.is_file():
            raise CaptureError(f"video file not found: {self.path} — {SOURCE_HELP}")
        if self.api is None:
            self.api = cv2.CAP_OPENCV_MJPEG if _is_mjpeg_avi(self.path) else cv2.CAP_ANY
        try:
            cap = super()._open_capture()
        except CaptureError:
            if self.api == cv2.CAP_ANY:
                raise
            self.api = cv2.CAP_ANY
            cap = super()._open_capture()
        if self.pace and self._fps:
            self._pacer = _Pacer(self._fps)
        return cap

    def _read(self, out: np.ndarray | None) -> np.ndarray | None:
        if self.pace and not self._pacer.wait(self):
            return None
        return super()._read(out)

    def _open_failure(self) -> str:
        return f"cannot decode video file {self.path} — is it a complete video in a format FFmpeg reads?"

    @property
    def frame_count(self) -> int | None:
        """Frames in the file, when the container says."""
        if self._cap is None:
            return None
        count = int(self._cap.get(_cv2().CAP_PROP_FRAME_COUNT))
        return count if count > 0 else None


def _is_mjpeg_avi(path: Path) -> bool:
    """An AVI whose first video stream is MJPG (read from the RIFF header, no decoder needed)."""
    try:
        with path.open("rb") as handle:
            head = handle.read(4096)
    except OSError:
        return False
    if head[:4] != b"RIFF" or head[8:12] != b"AVI ":
        return False
    at = head.find(b"strh")
    return at >= 0 and head[at + 8:at + 12] == b"vids" and head[at + 12:at + 16].upper() == b"MJPG"


def _redact(url: str) -> str:
    """URL without a password, for logs and errors."""
    scheme, sep, rest = url.partition("://")
    if sep and "@" in rest.split("/", 1)[0]:
        credentials, _, host = rest.partition("@")
        user = credentials.split(":", 1)[0]
        return f"{scheme}://{user}:***@{host}"
    return url


# ------------------------------------------------------------------------------ image folders

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
        self._pacer = _Pacer(fps)
        self._fps = fps
        self.paths: list[Path] = []
        self._next = 0
        self.skipped = 0
        self._min_size: tuple[int, int] | None = None
        self._native: tuple[int, int] | None = None
        self._reduction = 1
        self._header: bytearray | None = None  # reused for reading JPEG headers
        self._simplejpeg: Any = None  # reads them; imported by prefer_min_size

    def prefer_min_size(self, size: tuple[int, int] | None) -> bool:
        """JPEGs then decode at 1/2, 1/4 or 1/8 scale (OpenCV's IMREAD_REDUCED_*, libjpeg's DCT
        scaling), never below ``size``; needs simplejpeg to read the size first. Other formats: full."""
        if self._simplejpeg is None:
            try:
                import simplejpeg
            except ImportError:
                return False
            self._simplejpeg = simplejpeg
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
        if self._given is not None:
            paths = self._given
        else:
            pattern = self.pattern or ""
            folder = Path(pattern)
            if folder.is_dir():
                paths = sorted(p for p in folder.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES and p.is_file())
                if not paths:
                    raise CaptureError(f"no images in folder {folder} (looked for {', '.join(IMAGE_SUFFIXES)})")
            elif folder.is_file():
                paths = [folder]
            elif any(ch in pattern for ch in "*?["):
                paths = sorted(Path(p) for p in _glob.glob(pattern) if Path(p).is_file())
                if not paths:
                    raise CaptureError(f"no files match {pattern!r}")
            else:
                raise CaptureError(f"image source not found: {pattern} — {SOURCE_HELP}")
        missing = [p for p in paths if not p.is_file()]
        if missing:
            raise CaptureError(f"image not found: {missing[0]}")
        if not paths:
            raise CaptureError("the image list is empty")
        self.paths = list(paths)

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
            header = self._jpeg_size(path) if self._min_size is not None else None
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
        cv2 = _cv2()
        factor = 1
        if header is not None:  # EXIF may rotate the picture: the reduction must suit both ways round
            factor = min(reduction_for(header, self._min_size), reduction_for(header[::-1], self._min_size))
        flags = _IMREAD_REDUCED.get(factor, cv2.IMREAD_COLOR)
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

    def _jpeg_size(self, path: Path) -> tuple[int, int] | None:
        """(width, height) from a JPEG's header (the first 256 KB, read into a reused buffer), or None."""
        if path.suffix.lower() not in (".jpg", ".jpeg") or self._simplejpeg is None:
            return None
        if self._header is None:
            self._header = bytearray(256 * 1024)
        try:
            with path.open("rb") as handle:
                count = handle.readinto(self._header)
            height, width, _, _ = self._simplejpeg.decode_jpeg_header(memoryview(self._header)[:count])
        except (OSError, ValueError):
            return None
        return width, height


#: the DCT-domain reductions libjpeg-turbo does fastest, largest first
REDUCTIONS = (8, 4, 2)


def reduction_for(native: tuple[int, int], minimum: tuple[int, int] | None) -> int:
    """The largest of 8, 4, 2 that keeps both sides of ``native`` (w, h) at or above ``minimum``; else 1."""
    if minimum is None:
        return 1
    (width, height), (min_width, min_height) = native, minimum
    for factor in REDUCTIONS:
        if -(-width // factor) >= min_width and -(-height // factor) >= min_height:
            return factor
    return 1


#: cv2.imread flags for decoding a JPEG at 1/factor scale
_IMREAD_REDUCED = {2: 17, 4: 33, 8: 65}  # IMREAD_REDUCED_COLOR_2/4/8 (no cv2 import at module load)


# ---------------------------------------------------------------------------------- synthetic

class SyntheticSource(FrameSource):
    """Generated frames: moving colour bars, or a still image; paced at ``fps`` like a camera.

    ``frames`` bounds the run (None: endless). Useful for tests, soak runs and demos without a camera.
    """

    def __init__(self, size: tuple[int, int] = (640, 480), *, fps: float | None = 30.0,
                 image: str | os.PathLike | None = None, frames: int | None = None) -> None:
        width, height = size
        if width <= 0 or height <= 0:
            raise ValueError(f"synthetic frame size must be positive, not {width}x{height}")
        if fps is not None and fps <= 0:
            raise ValueError(f"synthetic fps must be positive, not {fps}")
        what = f"image {image}" if image else "colour bars"
        super().__init__(f"synthetic {width}x{height}" + (f"@{fps:g}" if fps else "") + f" ({what})")
        self.live = fps is not None
        self.size = (width, height)
        self.image = image
        self.limit = frames
        self._fps = fps
        self._pacer = _Pacer(fps)
        self._base: Any = None

    @property
    def fps(self) -> float | None:
        return self._fps

    def _open(self) -> None:
        import numpy as np

        cv2 = _cv2()
        width, height = self.size
        if self.image is not None:
            from .images import read_image

            try:
                still = read_image(self.image)
            except Exception as exc:  # ImageError: say it is about the synthetic source
                raise CaptureError(f"cannot open {self.description}: {exc}") from exc
            self._base = cv2.resize(still, (width, height), interpolation=cv2.INTER_AREA)
            return
        # bars twice as wide as the frame; each frame is a shifted window (a copy, no allocation)
        bar = max(1, width // 8)
        hsv = np.empty((height, 2 * width, 3), np.uint8)
        hsv[..., 0] = ((np.arange(2 * width) // bar) % 8 * 22).astype(np.uint8)
        hsv[..., 1] = 200
        hsv[..., 2] = np.linspace(80, 255, height, dtype=np.uint8)[:, None]
        self._base = cv2.cvtColor(hsv, cv2.COLOR_HSV2BGR)

    def _read(self, out: np.ndarray | None) -> np.ndarray | None:
        import numpy as np

        if self.limit is not None and self.frames_read >= self.limit:
            return None
        if not self._pacer.wait(self):
            return None
        width, height = self.size
        if out is None or out.shape != (height, width, 3) or out.dtype != np.uint8:
            out = np.empty((height, width, 3), np.uint8)
        base = self._base
        if base.shape[1] == width:
            np.copyto(out, base)
        else:
            offset = (self.frames_read * 4) % width
            np.copyto(out, base[:, offset:offset + width])
        return out


# ---------------------------------------------------------------------------------- picamera2

class PiCamera2Source(FrameSource):
    """A Raspberry Pi camera through picamera2 (libcamera); frames are copied out of its DMA buffers."""

    live = True

    def __init__(self, camera: int = 0, *, size: tuple[int, int] | None = None, fps: float | None = None,
                 backoff: Backoff = DEFAULT_BACKOFF) -> None:
        super().__init__(f"picamera2 camera {camera}")
        self.camera = camera
        self.requested_size = size
        self.requested_fps = fps
        self.backoff = backoff
        self._picam: Any = None

    @property
    def fps(self) -> float | None:
        return self.requested_fps

    def _open(self) -> None:
        try:
            from picamera2 import Picamera2
        except ImportError as exc:
            raise CaptureError(
                f"cannot open {self.description}: picamera2 is not installed ({exc}) — on Raspberry Pi OS "
                "`sudo apt install python3-picamera2` (and create the venv with --system-site-packages)"
            ) from exc
        try:
            picam = Picamera2(self.camera)
            main: dict[str, Any] = {"format": "RGB888"}  # libcamera's RGB888 is B,G,R in memory: OpenCV order
            if self.requested_size:
                main["size"] = tuple(self.requested_size)
            controls = {"FrameRate": float(self.requested_fps)} if self.requested_fps else {}
            picam.configure(picam.create_video_configuration(main=main, controls=controls, buffer_count=4))
            picam.start()
        except Exception as exc:  # picamera2 raises RuntimeError/IndexError/OSError from libcamera
            raise CaptureError(f"cannot open {self.description}: {exc} — is the camera enabled and connected?") from exc
        self._picam = picam

    def _read(self, out: np.ndarray | None) -> np.ndarray | None:
        import numpy as np

        started = time.monotonic()
        delays = self.backoff.delays()
        while not self._interrupted.is_set():
            try:
                from picamera2 import MappedArray

                request = self._picam.capture_request()
                try:  # borrow the DMA buffer only for the copy, then hand it back to libcamera
                    with MappedArray(request, "main") as mapped:
                        view = mapped.array[..., :3]
                        if out is None or out.shape != view.shape:
                            out = np.empty(view.shape, np.uint8)
                        np.copyto(out, view)
                finally:
                    request.release()
                return out
            except Exception as exc:  # the camera went away: back off, reopen
                give_up = self.backoff.give_up_s
                if give_up is not None and time.monotonic() - started > give_up:
                    raise CaptureError(f"{self.description} stopped delivering frames: {exc}") from exc
                log.warning("%s failed (%s); reopening", self.description, exc)
                self._release()
                if not self._sleep(next(delays)):
                    return None
                try:
                    self._open()
                    self.reconnects += 1
                except CaptureError as reopen_error:
                    log.debug("reopen failed: %s", reopen_error)
        return None

    def _release(self) -> None:
        picam, self._picam = self._picam, None
        if picam is not None:
            try:
                picam.stop()
            finally:
                picam.close()


# ------------------------------------------------------------------------------------ opening

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
) -> FrameSource:
    """Make (and by default open) the frame source that ``source`` names.

    ``0`` / ``"/dev/video0"``: V4L2 camera (``size``, ``fps``, ``fourcc`` requested from the driver);
    ``rtsp://`` / ``http://`` …: network stream; text containing ``!``: GStreamer pipeline;
    ``"picamera2[:N]"``; ``"synthetic[:WxH[@FPS]]"``; a folder, a glob or an image file: still images;
    any other path: a video file (``loop`` restarts it at the end).
    """
    if isinstance(source, FrameSource):
        if open_now:
            source.open()
        return source
    made = _make_source(source, size=size, fps=fps, fourcc=fourcc, loop=loop, backoff=backoff, probe=open_now)
    if open_now:
        from .mjpeg import MjpegStreamSource, NotMjpeg

        try:
            made.open()
        except NotMjpeg:  # an HTTP stream of another codec (HLS, MP4): OpenCV's FFmpeg reads it
            assert isinstance(made, MjpegStreamSource)
            made = StreamSource(made.url, backoff=backoff).open()
    return made


def _make_source(source: str | int | os.PathLike, *, size, fps, fourcc, loop, backoff, probe) -> FrameSource:
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
        from . import mjpeg

        # HTTP MJPEG through PyAV (it can decode reduced) when opening now can tell whether it is MJPEG
        if probe and lower.startswith(("http://", "https://")) and mjpeg.available():
            return mjpeg.MjpegStreamSource(text, backoff=backoff)
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
    return video_file_source(path, loop=loop)


def video_file_source(path: str | os.PathLike, *, loop: bool = False, pace: bool = False) -> VideoFileSource:
    """The best reader for a video file: MJPEG AVIs through PyAV + libjpeg-turbo when installed
    (they can decode at reduced scale, see :mod:`edgeinfer.mjpeg`), anything else through OpenCV."""
    from . import mjpeg

    if _is_mjpeg_avi(Path(path)) and mjpeg.available():
        return mjpeg.MjpegFileSource(path, loop=loop, pace=pace)
    return VideoFileSource(path, loop=loop, pace=pace)


def _reject(source: str, **given: Any) -> None:
    """ValueError when a camera-only option is given for a source that cannot honour it."""
    for name, value in given.items():
        if value:
            raise ValueError(f"{name} cannot be set for source {source!r} (it applies to cameras)")


# ----------------------------------------------------------------------------------- test clips

def make_test_clip(
    path: str | os.PathLike,
    images: Sequence[str | os.PathLike],
    *,
    size: tuple[int, int] = (640, 480),
    fps: float = 30.0,
    frames_per_image: int = 30,
    quality: int = 90,
) -> Path:
    """Write an MJPEG ``.avi`` showing each image (stretched to ``size``) for ``frames_per_image`` frames.

    The clips of the tests, benchmarks and demo: real photos, a real codec, a known frame count.
    """
    cv2 = _cv2()
    from .images import read_image

    if not images:
        raise ValueError("make_test_clip needs at least one image")
    if frames_per_image < 1 or fps <= 0 or not 1 <= quality <= 100:
        raise ValueError("frames_per_image >= 1, fps > 0 and 1 <= quality <= 100 are required")
    width, height = size
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(f".{target.stem}.partial{target.suffix}")  # OpenCV picks the container by suffix
    writer = cv2.VideoWriter(str(partial), cv2.CAP_OPENCV_MJPEG, cv2.VideoWriter_fourcc(*"MJPG"), float(fps),
                             (width, height))
    if not writer.isOpened():
        raise CaptureError(f"cannot write an MJPEG clip to {target}")
    try:
        writer.set(cv2.VIDEOWRITER_PROP_QUALITY, quality)
        for image in images:
            frame = cv2.resize(read_image(image), (width, height), interpolation=cv2.INTER_AREA)
            for _ in range(frames_per_image):
                writer.write(frame)
    finally:
        writer.release()
    os.replace(partial, target)  # readers never see a half-written clip
    return target


def cached_test_clip(
    images: Sequence[str | os.PathLike],
    *,
    size: tuple[int, int] = (640, 480),
    fps: float = 30.0,
    frames_per_image: int = 30,
    quality: int = 90,
    cache_dir: str | os.PathLike | None = None,
) -> Path:
    """:func:`make_test_clip` into a cache folder (``$EDGEINFER_CACHE`` or ``~/.cache/edgeinfer``), made once."""
    folder = Path(cache_dir or os.environ.get("EDGEINFER_CACHE") or Path.home() / ".cache" / "edgeinfer") / "clips"
    key = "|".join([*(f"{Path(p).name}:{Path(p).stat().st_size}" for p in images),
                    f"{size[0]}x{size[1]}", f"{fps:g}", str(frames_per_image), str(quality)])
    digest = hashlib.sha256(key.encode()).hexdigest()[:12]
    target = folder / f"clip-{size[0]}x{size[1]}-{digest}.avi"
    if target.is_file():
        return target
    return make_test_clip(target, images, size=size, fps=fps, frames_per_image=frames_per_image, quality=quality)


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

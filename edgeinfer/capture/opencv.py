"""Sources read through ``cv2.VideoCapture``: V4L2 cameras, network streams, GStreamer pipelines and
video files. OpenCV is imported when a source is made or opened, never at module load."""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import CaptureError
from ..util.backoff import Backoff
from .base import FramePacer, FrameSource
from .media import (
    DEFAULT_OPEN_TIMEOUT_S,
    DEFAULT_READ_TIMEOUT_S,
    SOURCE_HELP,
    check_transport,
    check_video_file,
    ffmpeg_capture_options,
    is_mjpeg_avi,
    parse_stream_url,
    stream_description,
    stream_open_failure,
    video_file_failure,
)
from .reconnect import DEFAULT_BACKOFF, reconnect

if TYPE_CHECKING:
    import numpy as np

log = logging.getLogger(__name__)


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
        #: how its frames are decoded and why (RTSP: the profile's hardware decoder, or why not)
        self.decode_reason = ""

    @property
    def fps(self) -> float | None:
        return self._fps

    def _open(self) -> None:
        self._cap = self._open_capture()

    def _open_capture(self) -> Any:
        import cv2

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
            return reconnect(self, self.backoff, release=self._release, reopen=self._open,
                             fetch=lambda: self._grab(out))
        if self.loop and self.frames_read and not self.interrupted:
            return self._restart(out)
        return None

    def _restart(self, out: np.ndarray | None) -> np.ndarray | None:
        import cv2

        if self._cap is not None and self._cap.set(cv2.CAP_PROP_POS_FRAMES, 0):
            frame = self._grab(out)
            if frame is not None:
                return frame
        self._release()  # the backend cannot seek: open the file again
        self._cap = self._open_capture()
        return self._grab(out)


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
        import cv2

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
        import cv2

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
    """An RTSP / HTTP (MJPEG, HLS) / RTMP / UDP stream through OpenCV's FFmpeg backend (H.264, H.265, …).

    ``transport`` (``tcp`` / ``udp``, or ``#transport=`` after an rtsp:// URL) picks how RTSP carries the
    media; TCP unless the environment's ``OPENCV_FFMPEG_CAPTURE_OPTIONS`` names one. The stall watchdog is
    OpenCV's own read timeout (``read_timeout_s``, or ``#stall_s=``): a stream whose connection stays open
    but that delivers no frame for that long fails the read, counts in ``stalls``, and is reopened on the
    backoff like any drop (``reconnects``).
    """

    def __init__(self, url: str, *, transport: str | None = None, open_timeout_s: float = DEFAULT_OPEN_TIMEOUT_S,
                 read_timeout_s: float | None = None, backoff: Backoff = DEFAULT_BACKOFF) -> None:
        import cv2

        parsed = parse_stream_url(url)
        self.url = parsed.url
        self.transport = check_transport(transport) or parsed.transport
        self.read_timeout_s = read_timeout_s or parsed.stall_s or DEFAULT_READ_TIMEOUT_S
        #: reads abandoned because the stream stalled with its connection open
        self.stalls = 0
        params = (cv2.CAP_PROP_OPEN_TIMEOUT_MSEC, int(open_timeout_s * 1000),
                  cv2.CAP_PROP_READ_TIMEOUT_MSEC, int(self.read_timeout_s * 1000))
        super().__init__(self.url, stream_description(self.url), api=cv2.CAP_FFMPEG, params=params, live=True,
                         backoff=backoff)

    def _open_capture(self) -> Any:
        if not self.url.lower().startswith(("rtsp://", "rtsps://")):
            return super()._open_capture()
        # OpenCV reads its FFmpeg options from the environment when it opens: set them for this open only
        with _FFMPEG_OPTIONS_LOCK:
            saved = os.environ.get(FFMPEG_OPTIONS_ENV)
            os.environ[FFMPEG_OPTIONS_ENV] = ffmpeg_capture_options(saved, self.transport)
            try:
                return super()._open_capture()
            finally:
                if saved is None:
                    del os.environ[FFMPEG_OPTIONS_ENV]
                else:
                    os.environ[FFMPEG_OPTIONS_ENV] = saved

    def _grab(self, out: np.ndarray | None) -> np.ndarray | None:
        started = time.monotonic()
        frame = super()._grab(out)
        if frame is None and self._cap is not None and time.monotonic() - started >= 0.9 * self.read_timeout_s:
            self.stalls += 1
            log.warning("%s stalled: no frame for %.1f s with the connection open", self.description,
                        time.monotonic() - started)
        return frame

    def _open_failure(self) -> str:
        return stream_open_failure(self.description)


#: OpenCV's FFmpeg backend reads its capture options from this variable at each open
FFMPEG_OPTIONS_ENV = "OPENCV_FFMPEG_CAPTURE_OPTIONS"
_FFMPEG_OPTIONS_LOCK = threading.Lock()


class GStreamerSource(OpenCVSource):
    """A GStreamer pipeline string ending in ``appsink`` (``nvarguscamerasrc``, ``libcamerasrc``, …)."""

    def __init__(self, pipeline: str, *, read_timeout_s: float | None = None, description: str | None = None,
                 backoff: Backoff = DEFAULT_BACKOFF) -> None:
        import cv2

        text = pipeline.strip()
        if "appsink" not in text:
            text += " ! videoconvert ! video/x-raw,format=BGR ! appsink drop=true max-buffers=2"
        # OpenCV's GStreamer backend bounds its wait for a sample by the same property as FFmpeg's
        params = (cv2.CAP_PROP_READ_TIMEOUT_MSEC, int(read_timeout_s * 1000)) if read_timeout_s else ()
        super().__init__(text, description or f"GStreamer pipeline {text!r}", params=params, live=True,
                         backoff=backoff)

    def _open_capture(self) -> Any:
        import cv2

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
    import cv2

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
        self._pacer = FramePacer(None)

    def _open_capture(self) -> Any:
        import cv2

        check_video_file(self.path)
        if self.api is None:
            self.api = cv2.CAP_OPENCV_MJPEG if is_mjpeg_avi(self.path) else cv2.CAP_ANY
        try:
            cap = super()._open_capture()
        except CaptureError:
            if self.api == cv2.CAP_ANY:
                raise
            self.api = cv2.CAP_ANY
            cap = super()._open_capture()
        if self.pace and self._fps:
            self._pacer = FramePacer(self._fps)
        return cap

    def _read(self, out: np.ndarray | None) -> np.ndarray | None:
        if self.pace and not self._pacer.wait(self):
            return None
        return super()._read(out)

    def _open_failure(self) -> str:
        return video_file_failure(self.path)

    @property
    def frame_count(self) -> int | None:
        """Frames in the file, when the container says."""
        if self._cap is None:
            return None
        import cv2

        count = int(self._cap.get(cv2.CAP_PROP_FRAME_COUNT))
        return count if count > 0 else None

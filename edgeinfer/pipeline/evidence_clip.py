"""An event's clip on disk: H.264 in MP4 where the device can encode it, the kept JPEGs as MJPEG otherwise.

Browsers play H.264/MP4 in a ``<video>`` element and play no MJPEG file at all, so MP4 is the clip a person
opens from the dashboard. The encoder is PyAV's FFmpeg (the ``mjpeg`` extra already installs PyAV, and its
wheels carry libx264): a well-kept binding rather than frames piped to an ``ffmpeg`` process, and unlike
OpenCV's ``VideoWriter`` (whose pip wheels cannot write ``avc1``: no H.264 encoder) it says what it has.
Frames keep their source times (``pts`` in milliseconds): the clip lasts what the event lasted, whatever
rate the source was read at. Without PyAV or an H.264 encoder — or when encoding fails — the clip is the
JPEGs back to back, never re-encoded (``ffplay -f mjpeg``, VLC, the fleet manager's ``?play=1``).
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Sequence
from fractions import Fraction
from pathlib import Path
from typing import Protocol

from ..forms.evidence import CLIP_NAME, MP4_CLIP_NAME
from ..util.fs import atomic_path


class KeptFrame(Protocol):
    """What a clip is made of (evidence.EncodedFrame): a JPEG and its time in the source."""

    @property
    def jpeg(self) -> bytes: ...

    @property
    def timestamp(self) -> float: ...


log = logging.getLogger(__name__)

#: H.264 encoders in the order tried (FFmpeg's names)
H264_ENCODERS = ("libx264", "libopenh264")
_MS = Fraction(1, 1000)


@functools.cache
def h264_encoder() -> str | None:
    """The H.264 encoder PyAV's FFmpeg offers, or None (no PyAV, or an FFmpeg built without one)."""
    try:
        import av
    except ImportError:
        return None
    for name in H264_ENCODERS:
        try:
            av.codec.Codec(name, "w")
        except Exception:  # PyAV's UnknownCodecError and friends: this build lacks it
            continue
        return name
    return None


def write_clip(folder: Path, frames: Sequence[KeptFrame], *, mp4: bool = True) -> tuple[str, int]:
    """Write ``frames`` (oldest first) as the event's clip in ``folder``, atomically: ``clip.mp4`` when
    ``mp4`` and an encoder allow, else ``clip.mjpeg``. Returns the file's name and size. OSError when the
    disk refuses."""
    encoder = h264_encoder() if mp4 else None
    if encoder is not None:
        import av

        try:
            with atomic_path(folder / MP4_CLIP_NAME) as temp:
                _encode_mp4(temp, frames, encoder)
            return MP4_CLIP_NAME, (folder / MP4_CLIP_NAME).stat().st_size
        except (av.FFmpegError, ValueError) as exc:  # an encoder that refuses; a first frame that is no JPEG
            log.warning("clip not encoded as MP4 (%s); kept as MJPEG", exc)
    with atomic_path(folder / CLIP_NAME) as temp, open(temp, "wb") as out:
        for frame in frames:
            out.write(frame.jpeg)
    return CLIP_NAME, (folder / CLIP_NAME).stat().st_size


def _encode_mp4(path: Path, frames: Sequence[KeptFrame], encoder: str) -> None:
    import av
    import cv2
    import numpy as np

    first = cv2.imdecode(np.frombuffer(frames[0].jpeg, np.uint8), cv2.IMREAD_COLOR)
    if first is None:
        raise ValueError("the clip's first frame is not a JPEG")
    # 4:2:0 needs even sizes: an odd row or column is cropped
    height, width = first.shape[0] & ~1, first.shape[1] & ~1
    start, last_pts = frames[0].timestamp, -1
    with av.open(str(path), "w", format="mp4", options={"movflags": "+faststart"}) as container:
        stream = container.add_stream(encoder, rate=5)
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        stream.time_base = stream.codec_context.time_base = _MS
        # one thread: the evidence thread must not take the cores inference runs on
        stream.options = {"preset": "veryfast", "crf": "26", "threads": "1"} if encoder == "libx264" else {}
        for index, kept in enumerate(frames):
            image = first if index == 0 else cv2.imdecode(np.frombuffer(kept.jpeg, np.uint8), cv2.IMREAD_COLOR)
            if image is None:
                continue  # a damaged frame: the clip goes on without it
            if image.shape[:2] != (height, width):
                image = cv2.resize(image, (width, height), interpolation=cv2.INTER_AREA)
            frame = av.VideoFrame.from_ndarray(np.ascontiguousarray(image), format="bgr24")
            frame.pts = last_pts = max(round((kept.timestamp - start) * 1000), last_pts + 1)
            frame.time_base = _MS
            for packet in stream.encode(frame):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)

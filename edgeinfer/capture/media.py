"""What sources read — stream URLs and video files — and what to tell the user when one cannot be read.

Shared by the OpenCV and the PyAV readers of the same media, so that both recognise the same
inputs and give the same advice.
"""

from __future__ import annotations

import os
from pathlib import Path

from ..errors import CaptureError

SOURCE_HELP = (
    "give a video file, an image folder or glob, a camera index or /dev/videoN, an rtsp:// or http:// URL, "
    "a GStreamer pipeline (… ! appsink), 'picamera2' or 'synthetic[:WxH[@FPS]]'"
)

# ------------------------------------------------------------------------------------ streams

STREAM_SCHEMES = ("rtsp://", "rtsps://", "rtmp://", "http://", "https://", "udp://", "tcp://", "srt://")
#: how long opening a network stream may take before it counts as failed
DEFAULT_OPEN_TIMEOUT_S = 10.0
#: a live stream that delivers nothing for this long counts as dropped
DEFAULT_READ_TIMEOUT_S = 5.0


def stream_description(url: str) -> str:
    """How a stream is named in logs and errors (without its password)."""
    return f"stream {redact_url(url)}"


def stream_open_failure(description: str) -> str:
    """The message for a stream that cannot be opened."""
    return (f"cannot open {description} — check the URL, that the server is up and reachable "
            "(try `ffprobe URL`), and credentials")


def redact_url(url: str) -> str:
    """URL without a password, for logs and errors."""
    scheme, sep, rest = url.partition("://")
    if sep and "@" in rest.split("/", 1)[0]:
        credentials, _, host = rest.partition("@")
        user = credentials.split(":", 1)[0]
        return f"{scheme}://{user}:***@{host}"
    return url


# -------------------------------------------------------------------------------- video files

def check_video_file(path: Path) -> None:
    """CaptureError unless ``path`` is a file."""
    if not path.is_file():
        raise CaptureError(f"video file not found: {path} — {SOURCE_HELP}")


def video_file_failure(path: str | os.PathLike) -> str:
    """The message for a video file that exists but cannot be decoded."""
    return f"cannot decode video file {path} — is it a complete video in a format FFmpeg reads?"


def is_mjpeg_avi(path: Path) -> bool:
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

"""What sources read — stream URLs and video files — and what to tell the user when one cannot be read.

Shared by the OpenCV and the PyAV readers of the same media, so that both recognise the same
inputs and give the same advice.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from .._redact import redact
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


#: how RTSP may carry the media: interleaved in the RTSP connection, or in UDP datagrams beside it
RTSP_TRANSPORTS = ("tcp", "udp")
#: the options a stream URL may carry after ``#`` (the client's part of a URL, never sent to the camera)
STREAM_URL_OPTIONS = ("transport", "stall_s", "codec")
#: the codecs a stream URL may state (``#codec=h265``): what picks the board's hardware decoder
STREAM_CODECS = ("h264", "h265")


@dataclass(frozen=True)
class StreamUrl:
    """A stream URL split into what goes to the server and edgeinfer's own options from its ``#`` fragment."""

    url: str
    transport: str | None = None
    stall_s: float | None = None
    #: the stream's codec as the URL states it (``#codec=h264``): the board's hardware decoder for it is used
    codec: str | None = None


def parse_stream_url(text: str) -> StreamUrl:
    """``rtsp://cam/live#transport=udp&stall_s=3`` -> the URL without the fragment, and the options.

    Only rtsp:// URLs carry options (an HTTP fragment belongs to its page); ValueError names a bad one.
    """
    url, sep, fragment = text.partition("#")
    if not sep or not url.lower().startswith(("rtsp://", "rtsps://")):
        return StreamUrl(text)
    options: dict[str, str] = {}
    for item in filter(None, fragment.split("&")):
        key, eq, value = item.partition("=")
        if not eq or key not in STREAM_URL_OPTIONS:
            raise ValueError(f"{redact_url(url)}: #{item} is not a stream option — use "
                             f"{' or '.join(k + '=…' for k in STREAM_URL_OPTIONS)}")
        options[key] = value
    codec = options.get("codec")
    if codec is not None and codec.lower() not in STREAM_CODECS:
        raise ValueError(f"{redact_url(url)}: #codec must be {' or '.join(STREAM_CODECS)}, not {codec!r}")
    return StreamUrl(url, check_transport(options.get("transport")), _seconds(options.get("stall_s"), url),
                     codec.lower() if codec else None)


def check_transport(transport: str | None) -> str | None:
    """The transport lower-cased, None for FFmpeg's choice; ValueError unless tcp or udp."""
    if transport is None:
        return None
    if transport.lower() not in RTSP_TRANSPORTS:
        raise ValueError(f"RTSP transport must be {' or '.join(RTSP_TRANSPORTS)}, not {transport!r}")
    return transport.lower()


def _seconds(text: str | None, url: str) -> float | None:
    if text is None:
        return None
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not 0 < value < 3600:
        raise ValueError(f"{redact_url(url)}: stall_s must be a number of seconds above 0, not {text!r}")
    return value


def ffmpeg_capture_options(current: str | None, transport: str | None) -> str:
    """``OPENCV_FFMPEG_CAPTURE_OPTIONS`` (``key;value|key;value``) with the RTSP transport set: the one given,
    else the environment's, else TCP (FFmpeg's UDP default tears frames on a lossy link)."""
    pairs = [item.split(";", 1) for item in (current or "").split("|") if ";" in item]
    if transport is None and any(key == "rtsp_transport" for key, _ in pairs):
        return current or ""
    kept = [f"{key};{value}" for key, value in pairs if key != "rtsp_transport"]
    return "|".join([*kept, f"rtsp_transport;{transport or 'tcp'}"])


def stream_description(url: str) -> str:
    """How a stream is named in logs and errors (without its password)."""
    return f"stream {redact_url(url)}"


def stream_open_failure(description: str) -> str:
    """The message for a stream that cannot be opened."""
    return (f"cannot open {description} — check the URL, that the server is up and reachable "
            "(try `ffprobe URL`), and credentials")


def redact_url(url: str) -> str:
    """URL without a password, for logs and errors (``_redact.redact``, the one redaction)."""
    return redact(url)


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

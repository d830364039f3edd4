"""RTSP decoded by the board's own hardware: a GStreamer pipeline built from the decoder elements the device
profile names (``stream_decode`` in ``device_profiles/*.yaml``), used only when those elements are installed
and OpenCV can read GStreamer; otherwise FFmpeg decodes in software (:class:`StreamSource`) and the reason is
said.

The profiles' elements are written against the vendors' documented GStreamer elements (NVIDIA's
``nvv4l2decoder``, Raspberry Pi's ``v4l2h264dec`` / ``v4l2slh265dec``, Intel's ``vah264dec`` /
``vaapih264dec``); docs/hardware.md says which ran where. This module takes the profile's mapping as plain
data: capture sits below ``device/``.
"""

from __future__ import annotations

import logging
import re
import shutil
import subprocess
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from ..util.backoff import Backoff
from .media import DEFAULT_READ_TIMEOUT_S, check_transport, parse_stream_url, redact_url
from .opencv import GStreamerSource, OpenCVSource, StreamSource, gstreamer_available
from .reconnect import DEFAULT_BACKOFF

log = logging.getLogger(__name__)

#: the codecs a profile may name a decoder for, and how their RTP is unpacked and parsed
CODECS = {"h264": "rtph264depay ! h264parse", "h265": "rtph265depay ! h265parse"}
#: the board's decoders (its device profile's ``stream_decode``), set once by who knows the profile (the agent,
#: ``edgeinfer run``): process-wide, because the board is; empty = software decoding
_BOARD_DECODERS: dict[str, tuple[str, ...]] = {}


def use_board_decoders(decoders: Mapping[str, Sequence[str]]) -> None:
    """RTSP cameras whose URL states its codec (``#codec=h264``) are decoded with these GStreamer fragments
    (the device profile's ``stream_decode``), when the elements exist here."""
    _BOARD_DECODERS.clear()
    _BOARD_DECODERS.update({codec: tuple(fragments) for codec, fragments in decoders.items()})


def rtsp_source(url: str, *, backoff: Backoff = DEFAULT_BACKOFF) -> OpenCVSource:
    """The source for an RTSP URL: the board's hardware decoder for the codec it states, else FFmpeg."""
    parsed = parse_stream_url(url)
    if parsed.codec is None or not _BOARD_DECODERS:
        return StreamSource(url, backoff=backoff)
    return open_rtsp(url, parsed.codec, _BOARD_DECODERS, backoff=backoff)
_ELEMENT = re.compile(r"^\s*([A-Za-z0-9_-]+)")


@dataclass(frozen=True)
class DecodeChoice:
    """The GStreamer pipeline to read with (None: FFmpeg in software) and why."""

    pipeline: str | None
    reason: str


def element_exists(name: str) -> bool:
    """``gst-inspect-1.0 --exists NAME``: the element is installed (False without GStreamer's tools)."""
    tool = shutil.which("gst-inspect-1.0")
    if tool is None:
        return False
    try:
        return subprocess.run([tool, "--exists", name], capture_output=True, timeout=20).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def fragment_elements(fragment: str) -> list[str]:
    """The element names of a pipeline fragment (``nvv4l2decoder ! nvvidconv ! video/x-raw,…`` -> the two
    elements; caps are not elements)."""
    names = []
    for part in fragment.split("!"):
        if "/" in part.split(",")[0]:  # caps such as video/x-raw,format=BGRx
            continue
        found = _ELEMENT.match(part)
        if found:
            names.append(found.group(1))
    return names


def choose_decoder(url: str, codec: str, decoders: Mapping[str, Sequence[str]], *, transport: str | None = None,
                   exists: Callable[[str], bool] = element_exists,
                   opencv_reads_gstreamer: Callable[[], bool] = gstreamer_available) -> DecodeChoice:
    """The first of the profile's fragments for ``codec`` whose elements are all installed, as a whole
    pipeline from ``rtspsrc`` to ``appsink``; else no pipeline and the reason."""
    codec = codec.lower()
    if codec not in CODECS:
        raise ValueError(f"codec must be one of {', '.join(CODECS)}, not {codec!r}")
    fragments = list(decoders.get(codec) or ())
    if not fragments:
        return DecodeChoice(None, f"the device profile names no hardware decoder for {codec}")
    missing: list[str] = []
    for fragment in fragments:
        absent = [name for name in fragment_elements(fragment) if not exists(name)]
        if not absent:
            break
        missing += absent
    else:
        return DecodeChoice(None, f"the profile's {codec} decoder is not installed (gst-inspect-1.0 finds no "
                                  f"{', '.join(missing)})")
    if not opencv_reads_gstreamer():
        return DecodeChoice(None, "this OpenCV build cannot read GStreamer pipelines")
    return DecodeChoice(rtsp_pipeline(url, codec, fragment, transport=transport),
                        f"{codec} decoded by {' ! '.join(fragment_elements(fragment))}")


def rtsp_pipeline(url: str, codec: str, fragment: str, *, transport: str | None = None) -> str:
    """``rtspsrc`` → depayload → parse → the decoder ``fragment`` → BGR → ``appsink`` (newest frame kept)."""
    if '"' in url or "!" in url:
        raise ValueError(f"{redact_url(url)}: a URL with '\"' or '!' cannot go into a GStreamer pipeline")
    protocols = check_transport(transport) or "tcp"
    return (f'rtspsrc location="{url}" protocols={protocols} latency=200 ! {CODECS[codec]} ! {fragment} ! '
            "videoconvert ! video/x-raw,format=BGR ! appsink drop=true max-buffers=2 sync=false")


def open_rtsp(url: str, codec: str | None, decoders: Mapping[str, Sequence[str]], *,
              read_timeout_s: float | None = None, backoff: Backoff = DEFAULT_BACKOFF) -> OpenCVSource:
    """An unopened source for an RTSP camera: the profile's hardware decoder when it can be used, else
    :class:`StreamSource`; the choice and its reason are logged and kept in ``source.decode_reason``."""
    parsed = parse_stream_url(url)
    if codec is None:
        choice = DecodeChoice(None, "the stream's codec was not given (h264 or h265)")
    else:
        choice = choose_decoder(parsed.url, codec, decoders, transport=parsed.transport)
    timeout = read_timeout_s or parsed.stall_s or DEFAULT_READ_TIMEOUT_S
    source: OpenCVSource
    if choice.pipeline is None:
        source = StreamSource(url, read_timeout_s=timeout, backoff=backoff)
        log.info("%s: software decoding — %s", source.description, choice.reason)
    else:
        source = GStreamerSource(choice.pipeline, read_timeout_s=timeout, backoff=backoff,
                                 description=f"stream {redact_url(parsed.url)} (GStreamer)")
        log.info("%s: %s", source.description, choice.reason)
    source.decode_reason = choice.reason
    return source

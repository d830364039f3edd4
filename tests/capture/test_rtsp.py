"""RTSP cameras as they are in the field, against a real gst-rtsp-server (tests/support/rtsp.py): H.264 and
H.265, TCP and UDP, a server killed and restarted, a stream that stalls with its connection open."""

from __future__ import annotations

import logging
import os
import threading
import time

import pytest
from support.rtsp import SIZE, RtspServer, running_rtsp_server

from edgeinfer.capture import Backoff, StreamSource, open_source
from edgeinfer.capture.media import ffmpeg_capture_options, parse_stream_url

FAST_BACKOFF = Backoff(initial_s=0.05, max_s=0.5, jitter=0.1, give_up_s=30.0)
FRAME_SHAPE = (SIZE[1], SIZE[0], 3)


@pytest.fixture(scope="module")
def rtsp(tmp_path_factory) -> RtspServer:
    with running_rtsp_server(tmp_path_factory.mktemp("rtsp")) as server:
        yield server


def _read_frames(source, count: int) -> None:
    buffer = None
    for _ in range(count):
        buffer = source.read(buffer)
        assert buffer is not None and buffer.shape == FRAME_SHAPE


@pytest.mark.parametrize(("mount", "transport"), [("h264", "tcp"), ("h264", "udp"), ("h265", "tcp")])
def test_codecs_and_transports(rtsp, mount, transport):
    with open_source(f"{rtsp.url(mount)}#transport={transport}", backoff=FAST_BACKOFF) as source:
        assert isinstance(source, StreamSource) and source.transport == transport
        assert source.url == rtsp.url(mount)  # the fragment is edgeinfer's, never sent to the camera
        _read_frames(source, 5)
        assert source.reconnects == 0 and source.stalls == 0
    assert "OPENCV_FFMPEG_CAPTURE_OPTIONS" not in os.environ  # set for the open only


def test_h265_over_udp_by_keyword(rtsp):
    with StreamSource(rtsp.url("h265"), transport="UDP", backoff=FAST_BACKOFF) as source:
        assert source.transport == "udp"
        _read_frames(source, 3)


def test_a_stalled_stream_is_abandoned_and_reopened_within_the_watchdog_bound(rtsp, caplog):
    """/stall delivers for 4 s, then its valve drops every buffer while RTSP and RTP stay open."""
    stall_s = 1.0
    with StreamSource(f"{rtsp.url('stall')}#stall_s={stall_s:g}", backoff=FAST_BACKOFF) as source:
        assert source.read_timeout_s == stall_s
        buffer = source.read()
        last_frame = time.monotonic()
        with caplog.at_level(logging.WARNING, logger="edgeinfer.capture"):
            while source.reconnects == 0:
                now = time.monotonic()
                buffer = source.read(buffer)
                assert buffer is not None  # the read that stalls comes back with the reopened stream's frame
                gap = time.monotonic() - now
                if source.reconnects == 0:
                    last_frame = time.monotonic()
                assert time.monotonic() - last_frame < 30
        assert source.stalls == 1 and source.reconnects == 1
        assert gap >= stall_s  # not before the bound: a slow frame is not a stall
        assert "stalled: no frame for" in caplog.text
        _read_frames(source, 3)  # frames flow again


def test_the_server_killed_and_restarted_on_the_same_port(tmp_path):
    server = RtspServer(tmp_path).start()
    try:
        with StreamSource(server.url("h264"), read_timeout_s=2.0, backoff=FAST_BACKOFF) as source:
            _read_frames(source, 3)
            server.kill()
            restart = threading.Timer(2.0, server.start)
            restart.start()
            killed = time.monotonic()
            frame = None
            while source.reconnects == 0:  # the frames FFmpeg had buffered before the kill come first
                frame = source.read(frame)
                assert frame is not None and frame.shape == FRAME_SHAPE
                assert time.monotonic() - killed < 30
            waited = time.monotonic() - killed
            restart.join()
            assert source.reconnects == 1 and source.stalls == 0  # a closed connection is a drop, not a stall
            assert waited >= 2.0  # it came back from the new server
            _read_frames(source, 3)
    finally:
        server.kill()


def test_stream_url_options():
    assert parse_stream_url("rtsp://cam/live#transport=UDP&stall_s=2.5").__dict__ == {
        "url": "rtsp://cam/live", "transport": "udp", "stall_s": 2.5}
    assert parse_stream_url("http://cam/page#top").url == "http://cam/page#top"  # an HTTP fragment is its page's
    for bad, words in (("#transport=sctp", "tcp or udp"), ("#stall_s=0", "above 0"), ("#stall_s=x", "above 0"),
                       ("#fps=5", "not a stream option"), ("#transport", "not a stream option")):
        with pytest.raises(ValueError, match=words):
            open_source("rtsp://user:secret@cam/live" + bad, open_now=False)
    with pytest.raises(ValueError, match="tcp or udp"):
        StreamSource("rtsp://cam/live", transport="http")


def test_ffmpeg_options_keep_the_users_own():
    assert ffmpeg_capture_options(None, None) == "rtsp_transport;tcp"
    assert ffmpeg_capture_options("rtsp_transport;udp|stimeout;5", None) == "rtsp_transport;udp|stimeout;5"
    assert ffmpeg_capture_options("rtsp_transport;udp|stimeout;5", "tcp") == "stimeout;5|rtsp_transport;tcp"
    assert ffmpeg_capture_options("", "udp") == "rtsp_transport;udp"

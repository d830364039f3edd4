"""RTSP cameras as they are in the field, against a real gst-rtsp-server (tests/support/rtsp.py): H.264 and
H.265, TCP and UDP, a server killed and restarted, a stream that stalls with its connection open."""

from __future__ import annotations

import logging
import os
import shlex
import subprocess
import threading
import time

import pytest
from support.rtsp import SIZE, RtspServer, running_rtsp_server

from edgeinfer.capture import Backoff, StreamSource, gstreamer_available, open_source
from edgeinfer.capture.hwdecode import choose_decoder, open_rtsp, rtsp_pipeline
from edgeinfer.capture.media import ffmpeg_capture_options, parse_stream_url
from edgeinfer.device.profiles import load_profile, load_profiles
from edgeinfer.errors import ProfileError

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
        "url": "rtsp://cam/live", "transport": "udp", "stall_s": 2.5, "codec": None}
    assert parse_stream_url("rtsp://cam/live#codec=H265").codec == "h265"
    assert parse_stream_url("http://cam/page#top").url == "http://cam/page#top"  # an HTTP fragment is its page's
    for bad, words in (("#transport=sctp", "tcp or udp"), ("#stall_s=0", "above 0"), ("#stall_s=x", "above 0"),
                       ("#codec=mjpeg", "h264 or h265"),
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


# ------------------------------------------------------------------ hardware decoding per device profile

def test_each_board_profile_names_its_vendors_decoders():
    profiles = load_profiles()
    assert profiles["jetson-orin-nano"].decoders()["h265"] == ("nvv4l2decoder ! nvvidconv ! video/x-raw,format=BGRx",)
    assert profiles["raspberry-pi-4"].decoders() == {"h264": ("v4l2h264dec",), "h265": ("v4l2slh265dec",)}
    assert "h264" not in profiles["raspberry-pi-5-coral-usb"].decoders()  # the Pi 5 has no H.264 decoder
    assert profiles["intel-core-ultra-npu"].decoders()["h264"] == ("vah264dec", "vaapih264dec")
    assert profiles["generic-x86-64"].decoders() == {}


def test_bad_stream_decode_keys_name_the_file_and_key(tmp_path):
    base = "schema: 1\nname: board\nmatch: {arch: [x86_64]}\ndelegates: [xnnpack]\n"
    for body, words in (("stream_decode: {vp9: x}", "vp9"), ("stream_decode: {h264: [1]}", "h264"),
                        ("stream_decode: {h264: 'x ! appsink'}", "decoder only")):
        path = tmp_path / "board.yaml"
        path.write_text(base + body + "\n")
        with pytest.raises(ProfileError, match=words):
            load_profile(path)


def test_the_first_installed_decoder_is_chosen_else_software_with_the_reason():
    jetson = {"h264": ["nvv4l2decoder ! nvvidconv ! video/x-raw,format=BGRx", "openh264dec"]}
    # this machine has no NVDEC; openh264dec (gstreamer1.0-plugins-bad) stands in for the board's decoder
    choice = choose_decoder("rtsp://cam/live", "h264", jetson, transport="udp", opencv_reads_gstreamer=lambda: True)
    assert choice.pipeline is not None and "! openh264dec !" in choice.pipeline and "protocols=udp" in choice.pipeline
    assert "nvv4l2decoder" not in choice.pipeline
    assert "no hardware decoder for h265" in choose_decoder("rtsp://cam/live", "h265", jetson).reason
    only_jetson = {"h264": [jetson["h264"][0]]}
    assert "finds no nvv4l2decoder, nvvidconv" in choose_decoder("rtsp://cam/live", "h264", only_jetson).reason
    if not gstreamer_available():  # the pip wheel's OpenCV: the stated reason, and FFmpeg decodes
        source = open_rtsp("rtsp://cam/live", "h264", jetson)
        assert isinstance(source, StreamSource) and "cannot read GStreamer" in source.decode_reason
    with pytest.raises(ValueError, match="codec must be"):
        choose_decoder("rtsp://cam/live", "vp8", jetson)
    assert "not given" in open_rtsp("rtsp://cam/live", None, jetson).decode_reason


def test_the_built_pipeline_decodes_the_real_stream_in_gstreamer(rtsp):
    """The pipeline open_rtsp would hand OpenCV, run by gst-launch-1.0 (this OpenCV has no GStreamer): it
    reaches its sink with BGR frames of the stream's size. (H.264 only: Debian's libde265dec crashes.)"""
    pipeline = rtsp_pipeline(rtsp.url("h264"), "h264", "openh264dec", transport="tcp")
    pipeline = pipeline.replace("appsink drop=true max-buffers=2 sync=false", "fakesink num-buffers=3")
    pipeline = pipeline.replace("format=BGR", f"format=BGR,width={SIZE[0]},height={SIZE[1]}")
    done = subprocess.run(["gst-launch-1.0", *shlex.split(pipeline)], capture_output=True, text=True, timeout=30)
    # the frames reached the sink (EOS after num-buffers); a server that closes first makes the RTSP teardown
    # that follows fail ("Could not send message"), which says nothing of the decoding
    torn_down_late = 'Got EOS from element "pipeline0"' in done.stdout and all(
        "Could not send message" in error or "Could not write to resource" in error
        for error in done.stderr.split("ERROR: ")[1:])
    assert done.returncode == 0 or torn_down_late, done.stdout[-2000:] + done.stderr[-2000:]


def test_the_boards_decoders_are_used_for_a_camera_that_states_its_codec():
    """What the agent and ``edgeinfer run`` set from the device profile: an RTSP URL with ``#codec=`` goes to
    the board's decoder when it can run (this OpenCV reads no GStreamer: software, with the reason); one without
    a codec, or a board with no decoders, is FFmpeg's as before."""
    from edgeinfer.capture.hwdecode import use_board_decoders

    try:
        use_board_decoders({"h264": ("nvv4l2decoder ! nvvidconv", "openh264dec")})
        chosen = open_source("rtsp://cam/live#codec=h264", open_now=False)
        assert isinstance(chosen, StreamSource) and chosen.decode_reason
        plain = open_source("rtsp://cam/live", open_now=False)
        assert isinstance(plain, StreamSource) and not getattr(plain, "decode_reason", None)
    finally:
        use_board_decoders({})
    assert not getattr(open_source("rtsp://cam/live#codec=h264", open_now=False), "decode_reason", None)

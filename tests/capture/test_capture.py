"""Frame sources on real files, a real HTTP MJPEG server in a subprocess, and real failures."""

from __future__ import annotations

import sys
import threading
import time
import types

import cv2
import numpy as np
import pytest
from support.pipeline import CLIP_IMAGES, FRAMES_PER_IMAGE, IMAGES, MjpegServer, free_port

from edgeinfer.capture import (
    Backoff,
    CameraSource,
    ImageFolderSource,
    StreamSource,
    SyntheticSource,
    VideoFileSource,
    cached_test_clip,
    gstreamer_available,
    make_test_clip,
    open_source,
)
from edgeinfer.capture.mjpeg import MjpegStreamSource
from edgeinfer.capture.picamera2 import PiCamera2Source
from edgeinfer.capture.reconnect import reconnect
from edgeinfer.errors import CaptureError, ClosedError

FAST_BACKOFF = Backoff(initial_s=0.05, max_s=0.3, jitter=0.1, give_up_s=20.0)


def test_make_test_clip_writes_an_mjpeg_avi(tmp_path):
    path = make_test_clip(tmp_path / "two.avi", [IMAGES / "parrot.jpg", IMAGES / "cat.bmp"], size=(320, 240),
                          fps=15, frames_per_image=3)
    cap = cv2.VideoCapture(str(path))
    assert cap.isOpened()
    fourcc = int(cap.get(cv2.CAP_PROP_FOURCC)).to_bytes(4, "little").decode()
    assert fourcc == "MJPG"
    assert cap.get(cv2.CAP_PROP_FPS) == pytest.approx(15)
    frames = []
    while True:
        ok, frame = cap.read()
        if not ok:
            break
        frames.append(frame)
    assert len(frames) == 6 and frames[0].shape == (240, 320, 3)
    # the photos really are in there: the parrot frames differ from the cat frames
    assert np.abs(frames[0].astype(int) - frames[3].astype(int)).mean() > 20
    assert [p.name for p in tmp_path.iterdir()] == ["two.avi"]  # no temporary file left behind


def test_cached_test_clip_is_made_once(tmp_path):
    first = cached_test_clip([IMAGES / "cat.bmp"], size=(64, 48), frames_per_image=2, cache_dir=tmp_path)
    stamp = first.stat().st_mtime_ns
    again = cached_test_clip([IMAGES / "cat.bmp"], size=(64, 48), frames_per_image=2, cache_dir=tmp_path)
    other = cached_test_clip([IMAGES / "cat.bmp"], size=(64, 48), frames_per_image=3, cache_dir=tmp_path)
    assert again == first and again.stat().st_mtime_ns == stamp and other != first


def test_video_file_reads_into_the_callers_buffers_and_ends_cleanly(clip):
    with VideoFileSource(clip) as source:
        assert source.backend == "CV_MJPEG"  # MJPEG AVI: OpenCV's own reader, straight to BGR
        ring = [source.read(None), source.read(None)]
        assert ring[0].shape == (480, 640, 3) and ring[0] is not ring[1]
        count = 2
        while True:
            slot = ring[count % 2]
            frame = source.read(slot)
            if frame is None:
                break
            assert frame is slot  # decoded in place, no new array
            count += 1
        assert count == len(CLIP_IMAGES) * FRAMES_PER_IMAGE == source.frames_read
        assert source.read(ring[0]) is None  # stays ended


def test_video_file_loop_restarts(clip):
    total = len(CLIP_IMAGES) * FRAMES_PER_IMAGE
    with VideoFileSource(clip, loop=True) as source:
        first = source.read().copy()
        buffer = None
        for _ in range(total - 1):
            buffer = source.read(buffer)
        again = source.read(buffer)
        assert again is not None and np.array_equal(again, first)


def test_image_glob_and_folder(tmp_path):
    bmps = sorted(IMAGES.glob("*.bmp"))
    with open_source(str(IMAGES / "*.bmp")) as source:
        assert isinstance(source, ImageFolderSource)
        shapes = [frame.shape for frame in source.frames()]
    assert shapes == [cv2.imread(str(p)).shape for p in bmps]
    folder = tmp_path / "shots"
    folder.mkdir()
    (folder / "a.jpg").write_bytes((IMAGES / "parrot.jpg").read_bytes())
    (folder / "b.jpg").write_bytes(b"not a jpeg at all")
    (folder / "c.bmp").write_bytes((IMAGES / "cat.bmp").read_bytes())
    (folder / "notes.txt").write_text("ignored")
    with open_source(folder, loop=True) as source:
        frames = [source.read().shape for _ in range(4)]
        assert frames == [(929, 512, 3), (341, 512, 3), (929, 512, 3), (341, 512, 3)]
        assert source.skipped == 2  # the broken JPEG, once per pass


def _with_exif_orientation(jpeg: bytes, orientation: int) -> bytes:
    """``jpeg`` with an APP1 EXIF segment whose IFD0 holds only Orientation (0x0112) = ``orientation``."""
    entry = b"\x01\x12\x00\x03\x00\x00\x00\x01" + orientation.to_bytes(2, "big") + b"\x00\x00"
    tiff = b"MM\x00\x2a\x00\x00\x00\x08" + b"\x00\x01" + entry + b"\x00\x00\x00\x00"
    app1 = b"Exif\x00\x00" + tiff
    return jpeg[:2] + b"\xff\xe1" + (len(app1) + 2).to_bytes(2, "big") + app1 + jpeg[2:]


def test_jpegs_decode_reduced_when_asked_and_say_their_own_size(tmp_path):
    rotated = tmp_path / "z_rotated.jpg"  # the kite photo, marked "rotate 90° clockwise" by EXIF
    rotated.write_bytes(_with_exif_orientation((IMAGES / "kite_and_cold.jpg").read_bytes(), 6))
    paths = [*sorted(IMAGES.glob("*.jpg")), rotated, IMAGES / "cat.bmp"]
    full = [cv2.imread(str(p)) for p in paths]
    assert full[-2].shape == (1352, 900, 3)  # OpenCV applies the EXIF orientation
    with ImageFolderSource(paths) as source:
        assert source.prefer_min_size((224, 224)) is True
        seen = [(frame.copy(), source.native_size, source.reduction) for frame in source.frames()]
    assert len(seen) == len(paths)
    for (frame, native, reduction), whole, path in zip(seen, full, paths):
        height, width = whole.shape[:2]
        if reduction == 1:
            assert native is None and frame.shape == whole.shape, path
            continue
        assert native == (width, height), path  # the picture's own size, rotation included
        assert frame.shape == (-(-height // reduction), -(-width // reduction), 3), path
        assert min(frame.shape[:2]) >= 224  # never below what was asked
        shrunk = cv2.resize(whole, (frame.shape[1], frame.shape[0]), interpolation=cv2.INTER_AREA)
        assert np.abs(frame.astype(np.int16) - shrunk).mean() < 4.0, path  # the same picture
    reductions = {path.name: reduction for (_, _, reduction), path in zip(seen, paths)}
    assert reductions["kite_and_cold.jpg"] == reductions["z_rotated.jpg"] == 4 and reductions["cat.bmp"] == 1


def test_image_reads_reuse_a_matching_buffer():
    with ImageFolderSource([IMAGES / "cat.bmp", IMAGES / "cat.bmp"]) as source:
        first = source.read(None)
        second = source.read(first)
        assert second is first


def test_synthetic_source_is_paced_and_moves():
    with SyntheticSource((64, 48), fps=50, frames=11) as source:
        started = time.monotonic()
        frames = [frame.copy() for frame in source.frames()]
        elapsed = time.monotonic() - started
    assert len(frames) == 11 and frames[0].shape == (48, 64, 3)
    assert elapsed >= 0.15  # 10 periods of 20 ms
    assert not np.array_equal(frames[0], frames[5])


def test_a_closed_source_refuses_to_open_again():
    source = SyntheticSource((64, 48), fps=None).open()
    assert source.read() is not None
    source.close()
    source.close()  # idempotent
    with pytest.raises(ClosedError, match="closed"):
        source.open()


def test_synthetic_spec_string():
    source = open_source("synthetic:32x24@200", open_now=False)
    assert isinstance(source, SyntheticSource) and source.size == (32, 24) and source.fps == 200


def _bad_sources(tmp_path):
    text = tmp_path / "clip.mp4"
    text.write_text("this is not a video")
    empty = tmp_path / "empty"
    empty.mkdir()
    return {
        "missing file": (str(tmp_path / "absent.mp4"), "source not found"),
        "not a video": (str(text), "cannot decode video file"),
        "empty folder": (str(empty), "no images in folder"),
        "glob without match": (str(tmp_path / "*.png"), "no files match"),
        "missing device": ("/dev/video97", "does not exist"),
        "no camera at index": (7, "cannot open camera 7"),
        "refused stream": (f"http://127.0.0.1:{free_port()}/stream.mjpg", "check the URL"),
    }


@pytest.mark.parametrize("case", ["missing file", "not a video", "empty folder", "glob without match",
                                  "missing device", "no camera at index", "refused stream"])
def test_a_source_that_fails_to_open_says_why(tmp_path, case):
    source, expected = _bad_sources(tmp_path)[case]
    started = time.monotonic()
    with pytest.raises(CaptureError) as info:
        open_source(source)
    assert expected in str(info.value)
    assert time.monotonic() - started < 15


def test_gstreamer_without_support_says_so():
    if gstreamer_available():
        pytest.skip("this OpenCV has GStreamer")
    with pytest.raises(CaptureError, match="no GStreamer support"):
        open_source("videotestsrc ! appsink")


def test_picamera2_missing_says_how_to_install():
    try:
        import picamera2  # noqa: F401
        pytest.skip("picamera2 is installed here")
    except ImportError:
        pass
    with pytest.raises(CaptureError, match="python3-picamera2"):
        open_source("picamera2")


def test_camera_options_are_checked():
    with pytest.raises(ValueError, match="fourcc"):
        CameraSource(0, fourcc="MJPEG")
    with pytest.raises(ValueError, match="applies to cameras"):
        open_source(str(IMAGES / "cat.bmp"), fourcc="MJPG")
    with pytest.raises(ValueError):
        Backoff(initial_s=0)


#: both readers of HTTP MJPEG: OpenCV's FFmpeg backend, and PyAV + libjpeg-turbo (what open_source picks)
STREAM_READERS = pytest.mark.parametrize("reader", [StreamSource, MjpegStreamSource], ids=["opencv", "pyav"])


@STREAM_READERS
def test_live_stream_reconnects_after_the_server_dies(tmp_path, reader):
    """Kill the real server mid-stream; it comes back 1 s later with another picture."""
    server = MjpegServer(IMAGES / "parrot.jpg").start()
    try:
        with reader(server.url, backoff=FAST_BACKOFF) as source:
            buffer = None
            for _ in range(5):
                buffer = source.read(buffer)
                assert buffer is not None and buffer.shape == (929, 512, 3)
            server.kill()
            restart = threading.Timer(1.0, server.start, kwargs={"image": IMAGES / "cat.bmp"})
            restart.start()
            started = time.monotonic()
            frame, old = source.read(buffer), 0
            # frames the dead server had sent that were still buffered (the socket's, FFmpeg's): a loaded machine
            # reads behind the server, so a few may come before the reconnect
            while frame is not None and frame.shape == (929, 512, 3) and old < 100:
                frame, old = source.read(frame), old + 1
            waited = time.monotonic() - started
            restart.join()
            assert frame is not None and frame.shape == (341, 512, 3), old  # the new stream's picture
            assert source.reconnects == 1
            assert 0.8 < waited < 15
            assert source.read(frame) is frame  # and it keeps going, into the caller's buffer
    finally:
        server.kill()


@STREAM_READERS
def test_live_stream_gives_up_after_the_deadline(reader):
    server = MjpegServer(IMAGES / "cat.bmp").start()
    backoff = Backoff(initial_s=0.05, max_s=0.2, give_up_s=1.0)
    try:
        with reader(server.url, backoff=backoff) as source:
            assert source.read() is not None
            server.kill()
            started = time.monotonic()
            with pytest.raises(CaptureError, match="did not come back within 1 s"):
                while source.read() is not None:
                    pass
            assert time.monotonic() - started < 10
    finally:
        server.kill()


@STREAM_READERS
def test_interrupt_cuts_a_reconnect_short(reader):
    server = MjpegServer(IMAGES / "cat.bmp").start()
    try:
        source = reader(server.url, backoff=Backoff(initial_s=5.0, max_s=5.0)).open()
        source.read()
        server.kill()
        threading.Timer(0.3, source.interrupt).start()
        started = time.monotonic()
        assert source.read() is None
        assert time.monotonic() - started < 3
        source.close()
        source.close()  # idempotent
    finally:
        server.kill()


def test_http_mjpeg_opens_through_pyav_and_decodes_at_the_asked_size():
    server = MjpegServer(IMAGES / "parrot.jpg").start()
    try:
        with open_source(server.url) as source:
            assert isinstance(source, MjpegStreamSource) and source.live
            assert source.read().shape == (929, 512, 3)
            source.prefer_min_size((224, 224))
            frame = source.read()
            assert frame.shape == (465, 256, 3) and source.native_size == (512, 929) and source.reduction == 2
    finally:
        server.kill()


def test_an_http_stream_that_is_not_mjpeg_falls_back_to_opencv(tmp_path):
    """An MPEG-4 file served over HTTP: PyAV says it is not MJPEG, OpenCV's FFmpeg reads it."""
    import functools
    import http.server

    clip = tmp_path / "clip.mp4"
    writer = cv2.VideoWriter(str(clip), cv2.VideoWriter_fourcc(*"mp4v"), 10.0, (160, 120))
    assert writer.isOpened()
    for _ in range(10):
        writer.write(cv2.resize(cv2.imread(str(IMAGES / "cat.bmp")), (160, 120)))
    writer.release()
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(tmp_path))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        with open_source(f"http://127.0.0.1:{server.server_address[1]}/clip.mp4") as source:
            assert type(source) is StreamSource
            assert source.read().shape == (120, 160, 3)
    finally:
        server.shutdown()
        server.server_close()


def test_reconnect_reopens_until_a_fetch_succeeds():
    source = SyntheticSource((8, 8), fps=None)
    calls = []

    def reopen():
        calls.append("reopen")
        if calls.count("reopen") < 3:
            raise CaptureError("refused")

    fetched = reconnect(source, Backoff(initial_s=0.01, max_s=0.02), release=lambda: calls.append("release"),
                        reopen=reopen, fetch=lambda: "frame")
    assert fetched == "frame" and source.reconnects == 1
    assert calls == ["release", "reopen"] * 3


def test_reconnect_gives_up_with_the_last_reason():
    source = SyntheticSource((8, 8), fps=None)
    with pytest.raises(CaptureError, match=r"within 0.2 s \(it opened but delivered no frame\)"):
        reconnect(source, Backoff(initial_s=0.01, max_s=0.02, give_up_s=0.2), release=lambda: None,
                  reopen=lambda: None, fetch=lambda: None)
    assert source.reconnects == 0
    source.interrupt()
    assert reconnect(source, Backoff(initial_s=0.01), release=lambda: None, reopen=lambda: None,
                     fetch=lambda: None) is None


def _fake_picamera2(failures: list[int]) -> types.ModuleType:
    """A stand-in for the picamera2 package (no camera here): capture fails while ``failures[0] > 0``."""
    module = types.ModuleType("picamera2")

    class Request:
        def release(self):
            pass

    class Picamera2:
        opened = 0

        def __init__(self, camera):
            Picamera2.opened += 1

        def create_video_configuration(self, **config):
            return config

        def configure(self, config):
            pass

        def start(self):
            pass

        def stop(self):
            pass

        def close(self):
            pass

        def capture_request(self):
            if failures[0] > 0:
                failures[0] -= 1
                raise RuntimeError("the camera went away")
            return Request()

    class MappedArray:
        def __init__(self, request, stream):
            self.array = np.full((4, 6, 4), 7, np.uint8)  # XBGR: the source keeps the first three

        def __enter__(self):
            return self

        def __exit__(self, *exc_info):
            return False

    module.Picamera2, module.MappedArray = Picamera2, MappedArray
    return module


def test_picamera2_copies_into_the_callers_buffer_and_reconnects(monkeypatch):
    failures = [0]
    fake = _fake_picamera2(failures)
    monkeypatch.setitem(sys.modules, "picamera2", fake)
    with open_source("picamera2", backoff=Backoff(initial_s=0.01, max_s=0.02)) as source:
        assert isinstance(source, PiCamera2Source) and source.live
        frame = source.read()
        assert frame.shape == (4, 6, 3) and (frame == 7).all()
        failures[0] = 2  # fails, and fails once more after the first reopen
        assert source.read(frame) is frame
        assert source.reconnects == 1 and fake.Picamera2.opened == 3

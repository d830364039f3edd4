"""MJPEG files through PyAV + libjpeg-turbo, at full and reduced scale, on real clips of the shared photos."""

from __future__ import annotations

import cv2
import numpy as np
import pytest
from support.assets import IMAGENET_LABELS, MOBILENET_TINY, MOBILENET_V2
from support.pipeline import (
    CLIP_FRAMES,
    CLIP_IMAGES,
    FRAMES_PER_IMAGE,
    GRACE_HOPPER_FACE,
    IMAGES,
    REFERENCE_TOP1,
    STEADY_WATCHDOG_FLOOR_S,
    ULTRAFACE,
    allocations_per_frame,
    reference_clip,
)
from support.processes import wait_until

import edgeinfer
from edgeinfer import Pipeline
from edgeinfer.capture import VideoFileSource, cached_test_clip, mjpeg, open_source, video_file_source
from edgeinfer.capture.jpeg import reduction_for
from edgeinfer.capture.mjpeg import MjpegFileSource
from edgeinfer.errors import CaptureError


def _opencv_frames(path) -> list[np.ndarray]:
    with VideoFileSource(path) as source:
        return [frame.copy() for frame in source.frames()]


def _avi_chunks(data: bytes) -> list[tuple[int, int]]:
    """(offset of the JPEG, its length) for each video chunk of an AVI."""
    chunks, at, end = [], data.find(b"movi"), data.rfind(b"idx1")
    while 0 <= (at := data.find(b"00dc", at + 4)) < end:
        size = int.from_bytes(data[at + 4:at + 8], "little")
        chunks.append((at + 8, size))
        at += 8 + size - 4
    return chunks


def test_mjpeg_avis_open_through_pyav_and_match_opencv_at_full_size(clip):
    assert mjpeg.available()
    reference = _opencv_frames(clip)
    with open_source(clip) as source:
        assert isinstance(source, MjpegFileSource) and source.backend == "PyAV+libjpeg-turbo"
        assert source.fps == 30 and source.frame_count == CLIP_FRAMES
        ring = [source.read(), source.read()]
        frames = [ring[0].copy(), ring[1].copy()]
        while (frame := source.read(ring[len(frames) % 2])) is not None:
            assert frame is ring[len(frames) % 2]  # decoded into the caller's buffer
            frames.append(frame.copy())
        assert source.native_size == (640, 480) and source.corrupt_frames == 0
    assert len(frames) == len(reference) == CLIP_FRAMES
    for ours, theirs in zip(frames, reference):
        assert ours.shape == theirs.shape == (480, 640, 3)
        assert np.abs(ours.astype(np.int16) - theirs).mean() < 1.0  # both libjpeg-turbo; IDCTs may differ by 1


@pytest.mark.parametrize(("native", "minimum", "factor"), [
    ((640, 480), None, 1), ((640, 480), (224, 224), 2), ((640, 480), (100, 100), 4), ((640, 480), (80, 60), 8),
    ((640, 480), (400, 100), 1), ((1920, 1080), (128, 128), 8), ((1920, 1080), (224, 224), 4),
    ((1001, 751), (126, 94), 8), ((1001, 751), (127, 94), 4),
])
def test_reduction_never_goes_below_the_minimum(native, minimum, factor):
    assert reduction_for(native, minimum) == factor


def test_reduced_frames_are_a_downscaled_frame_and_the_size_can_change_mid_stream(clip):
    full = _opencv_frames(clip)
    with open_source(clip) as source:
        source.prefer_min_size((224, 224))
        half = source.read()
        assert half.shape == (240, 320, 3) and source.native_size == (640, 480)
        expected = cv2.resize(full[0], (320, 240), interpolation=cv2.INTER_AREA)
        assert np.abs(half.astype(np.int16) - expected).mean() < 3.0  # the same picture, averaged down
        assert source.read(half) is half
        source.prefer_min_size((100, 100))
        quarter = source.read(half)
        assert quarter is not half and quarter.shape == (120, 160, 3)  # a new size gets a new buffer
        source.prefer_min_size(None)
        assert source.read(quarter).shape == (480, 640, 3)


def test_damaged_frames_are_skipped_and_a_truncated_file_ends_cleanly(clip, tmp_path):
    data = bytearray(clip.read_bytes())
    chunks = _avi_chunks(bytes(data))
    assert len(chunks) == CLIP_FRAMES
    start, size = chunks[2]
    data[start + size // 2:start + size // 2 + 64] = np.random.default_rng(1).integers(0, 256, 64, np.uint8).tobytes()
    damaged = tmp_path / "damaged.avi"
    damaged.write_bytes(data)
    with open_source(damaged) as source:
        count = sum(1 for _ in source.frames())
        assert source.corrupt_frames == 1 and count == CLIP_FRAMES - 1

    start, size = chunks[CLIP_FRAMES // 2]
    truncated = tmp_path / "truncated.avi"
    truncated.write_bytes(clip.read_bytes()[:start + size // 2])  # cut inside a frame
    with open_source(truncated) as source:
        count = sum(1 for _ in source.frames())
    assert CLIP_FRAMES // 2 - 1 <= count <= CLIP_FRAMES // 2


def test_files_that_are_not_mjpeg_videos_give_a_clear_error(tmp_path):
    empty = tmp_path / "empty.avi"
    empty.write_bytes(b"")
    garbage = tmp_path / "garbage.avi"
    garbage.write_bytes(b"RIFF\x00\x00\x00\x00AVI " + bytes(range(256)) * 8)
    for path in (empty, garbage, tmp_path / "missing.avi"):
        with pytest.raises(CaptureError, match=str(path.name)):
            MjpegFileSource(path).open()


def test_without_pyav_mjpeg_files_fall_back_to_opencv(clip, monkeypatch):
    monkeypatch.setattr(mjpeg, "available", lambda: False)
    source = video_file_source(clip)
    assert type(source) is VideoFileSource
    with source:
        assert source.prefer_min_size((224, 224)) is False and source.read().shape == (480, 640, 3)
        assert source.native_size is None


def test_loop_restarts_the_file(clip):
    with video_file_source(clip, loop=True) as source:
        first = source.read().copy()
        buffer = None
        for _ in range(CLIP_FRAMES - 1):
            buffer = source.read(buffer)
        assert np.array_equal(source.read(buffer), first)


def _grace_hopper_twice(kind: str, folder) -> str:
    """Three frames of grace_hopper at twice its size (1024x1200): an MJPEG clip or a folder of JPEGs."""
    if kind == "clip":
        return str(cached_test_clip([IMAGES / "grace_hopper.bmp"], size=(1024, 1200), frames_per_image=3,
                                    cache_dir=folder))
    big = cv2.resize(cv2.imread(str(IMAGES / "grace_hopper.bmp")), (1024, 1200), interpolation=cv2.INTER_CUBIC)
    for index in range(3):
        cv2.imwrite(str(folder / f"{index}.jpg"), big, [cv2.IMWRITE_JPEG_QUALITY, 95])
    return str(folder)


@pytest.mark.parametrize("kind", ["clip", "jpegs"])
def test_pipeline_results_stay_in_source_pixels_when_frames_decode_reduced(tmp_path, kind):
    """Ultraface (320x240 input, letterboxed) on 1024x1200 frames of grace_hopper: the letterbox shows them at
    204x240, so they decode at 1/4 scale (256x300), and the face box still comes out in the frames' own pixels
    (twice the photo's)."""
    source = _grace_hopper_twice(kind, tmp_path)
    boxes = {}
    for reduced in (True, False):
        with Pipeline(ULTRAFACE, source, task="detect", reduced_decode=reduced) as pipeline:
            results = [r.result for r in pipeline]
            boxes[reduced] = [face.box for faces in results for face in faces]
            assert pipeline.source.reduction == (4 if reduced else 1)
            if reduced:
                assert pipeline.source.native_size == (1024, 1200)
    assert len(boxes[True]) == len(boxes[False]) == 3
    expected = [2 * v for v in GRACE_HOPPER_FACE]
    for reduced_box, full_box in zip(boxes[True], boxes[False]):
        assert reduced_box == pytest.approx(expected, abs=24)
        assert reduced_box == pytest.approx(full_box, abs=10)


def test_full_size_frames_read_mjpeg_through_opencv_without_pyav(clip):
    """``reduced=False`` (keep_frames, events with evidence, reduced_decode off): PyAV's own FFmpeg would
    cost ~18 MiB for nothing, so OpenCV reads the MJPEG AVI; a pipeline does the same."""
    from edgeinfer.capture import VideoFileSource

    with open_source(clip, reduced=False) as source:
        assert isinstance(source, VideoFileSource) and source.read().shape == (480, 640, 3)
    with Pipeline(MOBILENET_TINY, clip, reduced_decode=False, max_frames=2) as pipeline:
        assert isinstance(pipeline.source, VideoFileSource) and len(list(pipeline)) == 2
    with Pipeline(MOBILENET_TINY, clip, max_frames=2) as pipeline:
        assert isinstance(pipeline.source, MjpegFileSource)


def test_keep_frames_keeps_full_size_frames(clip):
    with Pipeline(MOBILENET_TINY, clip, keep_frames=True, max_frames=2) as pipeline:
        frames = [r.frame for r in pipeline]
    assert [f.shape for f in frames] == [(480, 640, 3)] * 2


def test_reduced_decode_allocates_under_1_kib_per_frame(clip):
    with Pipeline(MOBILENET_TINY, clip, loop=True, max_frames=300, top_k=5,
                  watchdog_floor_s=STEADY_WATCHDOG_FLOOR_S) as pipeline:
        results = iter(pipeline)
        for _ in range(40):
            next(results)
        assert pipeline.source.native_size == (640, 480)
        per_frame, growth = allocations_per_frame(results)
    assert per_frame < 1024, f"{per_frame:.0f} B per frame"
    assert growth < 16 * 1024


def test_a_decode_bound_run_decodes_on_both_threads_in_frame_order(tmp_path):
    """A 1280x960 clip into the 128x128 model: decoding dominates, so the inference thread decodes
    frames too while it would wait; the results still come in frame order, each photo's answer steady."""
    big = reference_clip(tmp_path, size=(1280, 960))
    with Pipeline(MOBILENET_TINY, big, labels=IMAGENET_LABELS, threads=1) as pipeline:
        results = list(pipeline)
        helped = pipeline.decoded_by_inference
        assert pipeline.source.reduction == 4  # 320x240: 1/8 would be 160x120, below 128x128
    assert [r.frame_id for r in results] == list(range(CLIP_FRAMES))
    assert helped > 0
    for index in range(0, CLIP_FRAMES, FRAMES_PER_IMAGE):
        tops = {r.result[0].label for r in results[index:index + FRAMES_PER_IMAGE]}
        assert len(tops) == 1  # the same picture gives the same answer whichever thread decoded it


def test_damaged_frames_are_skipped_by_the_pipeline_too(clip, tmp_path):
    data = bytearray(clip.read_bytes())
    for number in (1, 7):
        start, size = _avi_chunks(bytes(data))[number]
        noise = np.random.default_rng(number).integers(0, 256, 64, np.uint8).tobytes()
        data[start + size // 2:start + size // 2 + 64] = noise
    damaged = tmp_path / "damaged.avi"
    damaged.write_bytes(data)
    with Pipeline(MOBILENET_TINY, damaged) as pipeline:
        ids = [r.frame_id for r in pipeline]
        assert pipeline.source.corrupt_frames == 2 and pipeline.error is None
        assert pipeline.stats.corrupt_frames == 2 and pipeline.stats.reduction == 2  # 320x240 for 128x128
    assert ids == [i for i in range(CLIP_FRAMES) if i not in (1, 7)]


def test_stopping_early_leaves_no_thread_behind(tmp_path):
    big = reference_clip(tmp_path, size=(1280, 960))
    for stop_after in (1, 3, 10):
        with Pipeline(MOBILENET_TINY, big, threads=1) as pipeline:
            for count, _ in enumerate(pipeline, 1):
                if count == stop_after:
                    break
        assert not pipeline.running


def test_swapping_in_a_model_with_a_larger_input_decodes_larger_frames(tmp_path):
    """128x128 → 224x224 mid-run on a 1080p clip: 1/8 scale (240x135) becomes 1/4 (480x270) from the
    next frames on, and the swapped-in model still gets the reference answers."""
    big = reference_clip(tmp_path, size=(1920, 1080))
    seen: list[tuple[int, int, str]] = []  # (frame id, reduction, label)

    def callback(result) -> None:
        seen.append((result.frame_id, pipeline.source.reduction, result.result[0].label))

    larger = edgeinfer.load(MOBILENET_V2, "xnnpack")  # loaded first: the swap must come while frames remain
    with Pipeline(MOBILENET_TINY, big, labels=IMAGENET_LABELS, max_fps=10) as pipeline:
        pipeline.start(callback)
        assert wait_until(lambda: len(seen) >= 3, 30)
        assert pipeline.source.reduction == 8
        pipeline.swap_engine(larger).close()
        assert pipeline.wait(60) and pipeline.error is None
        assert pipeline.source.reduction == 4
    assert [frame_id for frame_id, _, _ in seen] == list(range(CLIP_FRAMES))
    # the last photo's frames all came after the swap: the 224x224 model's reference answer
    last = CLIP_IMAGES[-1]
    for _, reduction, label in seen[-FRAMES_PER_IMAGE:]:
        assert reduction == 4 and label.startswith(REFERENCE_TOP1[last][0])


def test_frames_of_one_decoded_size_from_different_sized_pictures_map_back_to_their_own(tmp_path):
    """grace_hopper at 4x (decoded at 1/4) and at 2x (decoded at 1/2) both arrive as 512x600 frames;
    each face box must still come out in its own picture's pixels."""
    photo = cv2.imread(str(IMAGES / "grace_hopper.bmp"))
    scales = [4, 2, 4, 2, 2, 4]
    for index, scale in enumerate(scales):
        big = cv2.resize(photo, (512 * scale, 600 * scale), interpolation=cv2.INTER_CUBIC)
        cv2.imwrite(str(tmp_path / f"{index}.jpg"), big, [cv2.IMWRITE_JPEG_QUALITY, 90])
    with Pipeline(ULTRAFACE, str(tmp_path), task="detect") as pipeline:
        results = [r.result for r in pipeline]
    assert [len(faces) for faces in results] == [1] * len(scales)
    for faces, scale in zip(results, scales):
        assert faces[0].box == pytest.approx([scale * v for v in GRACE_HOPPER_FACE], abs=12 * scale)


def test_latest_policy_on_an_http_stream_decodes_only_the_frames_it_keeps():
    """A 60 fps MJPEG camera in front of a pipeline held to 10 fps: ~5 of every 6 frames are dropped,
    still compressed — read, never decoded — and the ones kept are right."""
    from support.pipeline import MjpegServer

    server = MjpegServer(IMAGES / "parrot.jpg", fps=60).start()
    try:
        with Pipeline(MOBILENET_V2, server.url, labels=IMAGENET_LABELS, policy="latest", max_fps=10,
                      max_frames=10) as pipeline:
            assert type(pipeline.source).__name__ == "MjpegStreamSource"
            labels = [r.result[0].label for r in pipeline]
            stats = pipeline.stats
            read, decoded = pipeline.source.frames_read, pipeline.source.frames_decoded
    finally:
        server.kill()
    assert labels == ["macaw"] * 10
    assert read >= 3 * len(labels) and stats.dropped >= 2 * len(labels)
    assert decoded <= len(labels) + 3, (read, decoded)  # the dropped frames cost no decode


def test_a_letterboxed_model_takes_frames_decoded_down_to_the_side_that_limits_them(tmp_path):
    """YOLO11n-pose (640x640, letterboxed) on 1280x720 MJPEG frames: the letterbox scales them by 1/2 (its smaller
    ratio), so they decode at 1/2 scale — 640x360, every pixel the model sees — where a rule of "both sides at
    least the input's" kept them whole; the people are found where the whole frames find them."""
    from support.optimize import YOLO_POSE

    clip = str(cached_test_clip([IMAGES / "pets.jpg", IMAGES / "squat.bmp"], size=(1280, 720), frames_per_image=2,
                                cache_dir=tmp_path))
    boxes = {}
    for reduced in (True, False):
        with Pipeline(YOLO_POSE, clip, task="pose", reduced_decode=reduced) as pipeline:
            boxes[reduced] = [[person.box for person in people] for people in (r.result for r in pipeline)]
            assert pipeline.source.reduction == (2 if reduced else 1)
    assert [len(frame) for frame in boxes[True]] == [len(frame) for frame in boxes[False]]
    assert sum(map(len, boxes[True])) >= 2
    for reduced_frame, full_frame in zip(boxes[True], boxes[False]):
        for reduced_box, full_box in zip(reduced_frame, full_frame):
            assert reduced_box == pytest.approx(full_box, abs=12)  # in the frames' own 1280x720 pixels


def test_a_letterbox_floor_needs_one_side_a_stretch_both():
    from edgeinfer.capture.jpeg import DecodeFloor

    assert reduction_for((1280, 720), (640, 640)) == 1
    assert reduction_for((1280, 720), DecodeFloor(640, 640, either=True)) == 2
    assert reduction_for((720, 1280), DecodeFloor(640, 640, either=True)) == 2  # portrait: the height limits it
    assert reduction_for((1920, 1080), DecodeFloor(640, 640, either=True)) == 2  # 960x540: 1/4 would be 480 wide
    assert reduction_for((5120, 2880), DecodeFloor(640, 640, either=True)) == 8

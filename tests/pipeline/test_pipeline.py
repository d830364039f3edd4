"""The pipeline end to end: real models, generated clips, a real MJPEG server, the CLI in a subprocess."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time

import pytest
from support.assets import IMAGENET_LABELS, MOBILENET_TINY, MOBILENET_V2, MOBILENET_V2_ONNX, REPO
from support.pipeline import (
    CLIP_FRAMES,
    CLIP_IMAGES,
    DEEPLAB,
    FACE_IDS,
    FACES,
    FRAMES_PER_IMAGE,
    GRACE_HOPPER_FACE,
    IMAGES,
    MOVENET,
    PASCAL_DOG,
    PASCAL_LABELS,
    REFERENCE_TOP1,
    STEADY_WATCHDOG_FLOOR_S,
    ULTRAFACE,
    MjpegServer,
    allocations_per_frame,
)

import edgeinfer
from edgeinfer import FrameResult, Pipeline, PipelineStats
from edgeinfer.capture import Backoff, SyntheticSource
from edgeinfer.errors import CaptureError, ClosedError
from edgeinfer.pipeline.stats import STAGES


def _check_stats(stats: PipelineStats, frames: int) -> None:
    assert stats.frames == frames
    assert set(stats.stages) == set(STAGES)
    for stage, values in stats.stages.items():
        assert set(values) == {"p50", "p95", "p99", "mean"}
        assert 0.0 <= values["p50"] <= values["p95"] <= values["p99"], (stage, values)
    assert stats.stages["infer"]["p50"] > 0 and stats.stages["latency"]["p50"] >= stats.stages["infer"]["p50"]
    json.dumps(stats.to_dict())


@pytest.mark.parametrize(("model", "delegate"), [(MOBILENET_V2, "xnnpack"), (MOBILENET_V2_ONNX, "onnxruntime")])
def test_classification_over_a_clip_gives_the_reference_top1(clip, model, delegate):
    with Pipeline(model, clip, labels=IMAGENET_LABELS, delegate=delegate, threads=2, top_k=3) as pipeline:
        results = list(pipeline)
        stats = pipeline.stats
        assert not pipeline.running and pipeline.error is None
    assert [r.frame_id for r in results] == list(range(CLIP_FRAMES))  # every frame, in order
    for index, result in enumerate(results):
        assert isinstance(result, FrameResult) and len(result.result) == 3
        expected = REFERENCE_TOP1[CLIP_IMAGES[index // FRAMES_PER_IMAGE]][0]
        assert result.result[0].label.startswith(expected), (index, result.result[0])
        t = result.timings
        assert t.capture >= 0 and t.infer > 0 and t.latency >= t.preprocess + t.infer + t.postprocess
    assert results[-1].timestamp >= results[0].timestamp > time.time() - 120
    _check_stats(stats, CLIP_FRAMES)
    assert stats.dropped == 0 and stats.fps > 0 and stats.delegate == delegate


def test_detection_pose_and_segmentation_through_the_pipeline():
    with Pipeline(ULTRAFACE, IMAGES / "grace_hopper.bmp", task="detect") as pipeline:
        (face,) = [r.result for r in pipeline]
    assert len(face) == 1 and face[0].score > 0.99
    assert face[0].box == pytest.approx(GRACE_HOPPER_FACE, abs=12)

    with Pipeline(MOVENET, IMAGES / "squat.bmp", task="pose") as pipeline:
        ((pose,),) = [r.result for r in pipeline]  # single-pose: a list of one person
    nose = pose.keypoint("nose")
    assert pose.score > 0.3 and 0 < nose.x < 500 and 0 < nose.y < 610 and pose.label == "person"

    with Pipeline(DEEPLAB, IMAGES / "dog_segmentation.bmp", task="segment", labels=PASCAL_LABELS,
                  threads=2) as pipeline:
        (segmentation,) = [r.result for r in pipeline]
    assert segmentation.mask.shape == (128, 128) and PASCAL_DOG in segmentation.class_ids


def test_latest_policy_drops_and_counts_frames_under_a_slow_model():
    """A 200 fps source in front of a model held to 20 fps: the newest frame wins, drops are counted."""
    source = SyntheticSource((320, 240), fps=200)
    with Pipeline(MOBILENET_TINY, source, policy="latest", max_fps=20, max_frames=10, queue_size=1) as pipeline:
        results = list(pipeline)
        stats = pipeline.stats
        read = source.frames_read
    assert len(results) == 10
    assert stats.dropped >= 30  # ~10 frames arrive per inference at 200 vs 20 fps
    assert stats.dropped + len(results) <= read
    ids = [r.frame_id for r in results]
    assert ids == sorted(ids) and ids[-1] - ids[0] >= 30  # frames were skipped, not queued
    assert max(r.timings.queue for r in results) < 40.0  # never a stale frame (period 5 ms)
    source.close()


def test_latest_policy_drops_frames_while_a_slow_model_runs():
    """Slowness is part of the setup (every invoke sleeps 50 ms, five frame periods), not a claim about the host."""
    source = SyntheticSource((320, 240), fps=100)
    engine = edgeinfer.load(MOBILENET_TINY, "xnnpack", threads=1)
    invoke = engine.invoke

    def slow_invoke() -> None:
        time.sleep(0.05)
        invoke()

    engine.invoke = slow_invoke  # type: ignore[method-assign]
    with engine, Pipeline(engine, source, policy="latest", max_frames=3) as pipeline:
        results = list(pipeline)
        dropped = pipeline.dropped
    source.close()
    assert [r.frame_id for r in results] == sorted(r.frame_id for r in results) and len(results) == 3
    assert dropped >= 2
    assert results[-1].frame_id - results[0].frame_id >= 2 * 2  # later frames replaced the stale ones


def test_every_policy_applies_back_pressure(clip):
    with Pipeline(MOBILENET_TINY, clip, policy="every", max_fps=100, max_frames=12) as pipeline:
        started = time.monotonic()
        results = list(pipeline)
        elapsed = time.monotonic() - started
        assert pipeline.dropped == 0 and pipeline.source.frames_read <= 12 + pipeline.queue_size + 2
    assert [r.frame_id for r in results] == list(range(12))
    assert elapsed >= 0.1  # 11 periods of 10 ms


def test_callback_style_survives_a_raising_callback(clip):
    seen: list[int] = []

    def callback(result: FrameResult) -> None:
        seen.append(result.frame_id)
        if result.frame_id == 2:
            raise RuntimeError("a user bug")

    pipeline = Pipeline(MOBILENET_TINY, clip)
    with pipeline:
        assert pipeline.start(callback) is pipeline
        assert pipeline.wait(timeout=60)
        assert not pipeline.running
        stats = pipeline.stats
        with pytest.raises(RuntimeError):
            iter(pipeline).__next__()
    assert seen == list(range(CLIP_FRAMES))
    assert stats.callback_errors == 1 and stats.frames == CLIP_FRAMES


def test_take_window_splits_the_run(clip):
    windows = []
    with Pipeline(MOBILENET_TINY, clip, max_fps=200) as pipeline:
        for count, _ in enumerate(pipeline, 1):
            if count in (5, 15):
                windows.append(pipeline.take_window())
        windows.append(pipeline.take_window())
        total = pipeline.stats
    # a window counts the frames the run has finished, which may be a frame or two ahead of the results this loop
    # has taken (seen under load: 6, 9, 9): the windows split the run, none counted twice or lost
    first, second, third = (w.frames for w in windows)
    assert first >= 5 and first + second >= 15 and first + second + third == CLIP_FRAMES, (first, second, third)
    assert sum(w.frames for w in windows) == total.frames
    assert all(w.fps > 0 and w.stages["infer"]["p50"] > 0 for w in windows)
    assert pipeline.take_window().frames == 0


@pytest.mark.parametrize("face", FACES, ids=FACE_IDS)
def test_a_model_update_swaps_the_engine_between_two_frames_and_no_frame_is_lost(clip, face):
    """Both faces: the new engine serves every stream from the next frame on (capture goes on), a model that
    cannot serve the task is refused with the run untouched, every frame of every stream is answered right."""
    started = threading.Event()
    new = edgeinfer.load(MOBILENET_V2_ONNX, "onnxruntime")  # loaded first: the swaps below take a frame's time
    with edgeinfer.load(ULTRAFACE) as wrong, face.build(MOBILENET_V2, clip, labels=IMAGENET_LABELS, top_k=1,
                                                       policy="every", max_fps=60) as pipeline:
        first = pipeline.engine
        results = face.collect(pipeline, lambda result: result.frame_id == 3 and started.set())
        assert started.wait(30)
        with pytest.raises(ValueError, match="a classifier has one output"):
            pipeline.swap_engine(wrong)  # does not fit the task: refused, the run goes on
        old = pipeline.swap_engine(new)
        at_swap = sum(len(r) for r in results.values())
        assert old is first and not old.closed
        old.close()  # the engine swapped out is the caller's
        assert pipeline.wait(60) and pipeline.error is None
        assert pipeline.engine.delegate == "onnxruntime"
        assert {s.delegate for s in face.stats(pipeline).values()} == {"onnxruntime"}
        swapped = pipeline.engine
    assert swapped.closed  # the pipeline owns what was swapped in
    assert sum(len(r) for r in results.values()) > at_swap + len(results)  # the new engine answered frames
    for name, got in results.items():
        assert [r.frame_id for r in got] == list(range(CLIP_FRAMES)), f"{name} lost or reordered frames"
        for result in got:  # right answers before and after the swap
            label = result.result[0].label
            assert label.startswith(REFERENCE_TOP1[CLIP_IMAGES[result.frame_id // FRAMES_PER_IMAGE]][0]), name


def test_a_given_engine_is_left_open(clip):
    with edgeinfer.load(MOBILENET_TINY) as engine:
        with Pipeline(engine, clip, max_frames=2) as pipeline:
            assert len(list(pipeline)) == 2
        assert not engine.closed
    pipeline.close()  # idempotent
    with pytest.raises(ClosedError, match="closed"):
        pipeline.start()


def test_a_bad_source_fails_at_construction(tmp_path):
    with pytest.raises(CaptureError, match="source not found"):
        Pipeline(MOBILENET_TINY, tmp_path / "nope.mp4")
    with pytest.raises(ValueError, match="policy"):
        Pipeline(MOBILENET_TINY, "synthetic", policy="newest")


def test_a_dropped_stream_reconnects_mid_run():
    server = MjpegServer(IMAGES / "parrot.jpg").start()
    backoff = Backoff(initial_s=0.05, max_s=0.3, give_up_s=20)
    labels: list[str] = []
    try:
        with Pipeline(MOBILENET_V2, server.url, labels=IMAGENET_LABELS, backoff=backoff, policy="latest",
                      max_frames=20) as pipeline:
            for result in pipeline:
                labels.append(result.result[0].label)
                if len(labels) == 5:
                    server.kill()
                    threading.Timer(0.5, server.start, kwargs={"image": IMAGES / "cat.bmp"}).start()
            stats = pipeline.stats
    finally:
        time.sleep(0.6)
        server.kill()
    assert stats.reconnects == 1 and pipeline.error is None
    assert labels[0] == "macaw" and labels[-1] == "Egyptian cat"  # a new frame size, handled on the fly


def test_a_stream_that_dies_for_good_ends_the_run_with_the_error():
    server = MjpegServer(IMAGES / "cat.bmp").start()
    backoff = Backoff(initial_s=0.05, max_s=0.2, give_up_s=0.5)
    try:
        with Pipeline(MOBILENET_TINY, server.url, backoff=backoff) as pipeline:
            pipeline.start()
            time.sleep(0.3)
            server.kill()
            assert pipeline.wait(timeout=20)
            assert isinstance(pipeline.error, CaptureError) and "did not come back" in str(pipeline.error)
            assert pipeline.frames > 0
            with pytest.raises(CaptureError):
                list(pipeline)
    finally:
        server.kill()


def test_steady_state_allocates_under_1_kib_per_frame():
    """tracemalloc: per frame, the peak above the frame's starting level — the result object and little else."""
    source = SyntheticSource((640, 480), fps=None)
    with Pipeline(MOBILENET_TINY, source, max_frames=400, top_k=5,
                  watchdog_floor_s=STEADY_WATCHDOG_FLOOR_S) as pipeline:
        results = iter(pipeline)
        for _ in range(100):
            next(results)
        per_frame, growth = allocations_per_frame(results)
    source.close()
    assert per_frame < 1024, f"{per_frame:.0f} B per frame"
    assert growth < 16 * 1024  # nothing accumulates


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "edgeinfer", *args], capture_output=True, text=True, timeout=120)


def test_cli_run_json(clip):
    result = _cli("run", str(MOBILENET_V2), "--source", str(clip), "--labels", str(IMAGENET_LABELS),
                  "--max-frames", "5", "--top-k", "2", "--json")
    assert result.returncode == 0, result.stderr
    lines = [json.loads(line) for line in result.stdout.splitlines()]
    assert [line["type"] for line in lines] == ["result"] * 5 + ["summary"]
    first = lines[0]
    assert first["frame_id"] == 0 and first["result"][0]["label"] == "macaw" and len(first["result"]) == 2
    assert set(first["timings_ms"]) == set(STAGES)
    summary = lines[-1]
    assert summary["frames"] == 5 and summary["dropped"] == 0 and summary["fps"] > 0
    assert summary["delegate"] == "xnnpack"
    assert summary["reduction"] == 2 and summary["corrupt_frames"] == 0  # 640x480 decoded at 320x240 for 224x224
    full = _cli("run", str(MOBILENET_V2), "--source", str(clip), "--max-frames", "2", "--full-decode", "--json")
    assert json.loads(full.stdout.splitlines()[-1])["reduction"] == 1
    for stage in ("capture", "preprocess", "infer", "postprocess", "latency"):
        assert set(summary["stages"][stage]) == {"p50", "p95", "p99", "mean"}


def test_cli_run_detect_json():
    result = _cli("run", str(ULTRAFACE), "--source", str(IMAGES / "grace_hopper.bmp"), "--task", "detect", "--json")
    assert result.returncode == 0, result.stderr
    first, summary = (json.loads(line) for line in result.stdout.splitlines())
    (face,) = first["result"]
    assert face["score"] > 0.99 and face["box"] == pytest.approx(GRACE_HOPPER_FACE, abs=12)
    assert summary["frames"] == 1


def test_cli_run_human_status_and_errors(tmp_path):
    result = _cli("run", str(MOBILENET_TINY), "--source", "synthetic:160x120@100", "--max-frames", "30")
    assert result.returncode == 0, result.stderr
    assert "30 frames" in result.stdout and "fps" in result.stdout and "xnnpack" in result.stdout
    missing = _cli("run", str(MOBILENET_TINY), "--source", str(tmp_path / "none.avi"))
    assert missing.returncode == 1 and missing.stdout == ""
    assert missing.stderr.count("\n") == 1 and "source not found" in missing.stderr
    wrong = _cli("run", str(MOBILENET_TINY), "--source", str(IMAGES / "cat.bmp"), "--task", "detect")
    assert wrong.returncode == 1 and "Traceback" not in wrong.stderr
    assert "no output layout edgeinfer knows fits" in wrong.stderr and "tflite-ssd: needs 4 outputs" in wrong.stderr


def test_preprocessing_in_either_thread_gives_identical_inputs(clip):
    """Staged (capture thread) and direct (inference thread) preprocessing write the same tensor."""
    scores = {}
    for place in ("capture", "inference", "auto"):
        with Pipeline(MOBILENET_TINY, clip, preprocess_in=place, top_k=3) as pipeline:
            scores[place] = [[(c.index, c.score) for c in r.result] for r in pipeline]
    assert len(scores["capture"]) == CLIP_FRAMES
    assert scores["capture"] == scores["inference"] == scores["auto"]


def test_loop_and_keep_frames(clip):
    with Pipeline(MOBILENET_TINY, clip, loop=True, keep_frames=True, max_frames=CLIP_FRAMES + 3) as pipeline:
        results = list(pipeline)
    assert len(results) == CLIP_FRAMES + 3  # went round the end of the file
    assert results[0].frame is not None and results[0].frame.shape == (480, 640, 3)
    assert (results[CLIP_FRAMES].frame == results[0].frame).all()  # the same picture, in its own copy
    assert results[CLIP_FRAMES].frame is not results[0].frame


def test_cli_run_live_status_line_on_a_terminal():
    """On a TTY the status line is redrawn in place (carriage return, erase line), then a summary."""
    import os
    import pty

    leader, follower = pty.openpty()
    try:
        process = subprocess.Popen(
            [sys.executable, "-m", "edgeinfer", "run", str(MOBILENET_TINY), "--source", "synthetic:160x120@40",
             "--max-frames", "40"],
            stdout=follower, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
        )
        os.close(follower)
        output = b""
        while True:
            try:
                chunk = os.read(leader, 4096)
            except OSError:  # the child closed the terminal
                break
            if not chunk:
                break
            output += chunk
        assert process.wait(timeout=60) == 0, process.stderr.read()
        process.stderr.close()
    finally:
        os.close(leader)
    text = output.decode()
    assert "\r\x1b[K" in text and "fps" in text and "latency" in text and "[xnnpack]" in text
    assert text.rstrip().splitlines()[-1].endswith("on xnnpack")


def test_observers_see_every_result_and_cannot_break_the_run(clip):
    seen: list[int] = []
    late: list[int] = []

    def broken(result: FrameResult) -> None:
        raise ValueError("observer bug")

    def record_late(result: FrameResult) -> None:
        late.append(result.frame_id)

    with Pipeline(MOBILENET_TINY, clip) as pipeline:
        pipeline.add_observer(lambda result: seen.append(result.frame_id))
        pipeline.add_observer(broken)
        pipeline.add_observer(record_late)
        ids = []
        for result in pipeline:
            ids.append(result.frame_id)
            if len(ids) == 5:
                pipeline.remove_observer(record_late)
        assert pipeline.error is None
    assert seen == ids == list(range(CLIP_FRAMES))  # the broken observer stopped nothing
    assert late == list(range(len(late))) and 5 <= len(late) < CLIP_FRAMES  # removed mid-run


@pytest.mark.parametrize("n", [1, 2, 3, 7, 100, 4096])
def test_stage_percentiles_are_numpys_without_importing_numpy_ma(n):
    """The stats' percentiles equal ``np.percentile``'s (linear interpolation); a fresh interpreter that
    summarises stats never imports numpy.ma (1.3 MiB an agent has no use for)."""
    import numpy as np

    from edgeinfer.pipeline.stats import percentiles

    samples = np.random.default_rng(n).random((6, n)) * 50
    assert np.allclose(np.array(percentiles(samples, (50, 95, 99))), np.percentile(samples, [50, 95, 99], axis=1))
    if n == 4096:
        code = ("import sys, numpy as np; from edgeinfer.pipeline.stats import StatsRing, STAGES\n"
                "ring = StatsRing(64); ring.samples[:] = np.arange(64.0); ring.count = 64\n"
                "ring.summary(0, 64); ring.recent_percentile('infer', 99)\n"
                "print('numpy.ma' in sys.modules)")
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=60)
        assert done.stdout.strip() == "False", done.stderr

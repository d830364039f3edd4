"""Many cameras, one accelerator: MultiPipeline with real models on generated streams and clips.

Fairness is a property of the scheduler, not of this machine's speed: four unpaced streams compete
for one engine, and each gets its share. Batching runs OpenVINO with Ultraface reshaped to a batch
of four (the shared classifiers' graphs fix their batch at 1; the test says so too).
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time

import pytest
from support.assets import REPO
from support.pipeline import (
    FACE_IDS,
    FACES,
    IMAGENET_LABELS,
    IMAGES,
    MOBILENET_TINY,
    MOBILENET_V2,
    REFERENCE_TOP1,
    ULTRAFACE,
    reference_clip,
)

import edgeinfer
from edgeinfer import CaptureError, ModelLoadError, MultiPipeline
from edgeinfer.capture import SyntheticSource, make_test_clip
from edgeinfer.runtime.model import inspect_model

PHOTOS = ["parrot.jpg", "cat.bmp", "grace_hopper.bmp", "squat.bmp"]


def unpaced(image: str, size=(640, 480)) -> SyntheticSource:
    return SyntheticSource(size, fps=None, image=IMAGES / image)


def collect(multi: MultiPipeline, until, timeout: float = 60.0) -> list:
    results, done = [], threading.Event()

    def keep(result):
        results.append(result)
        if until(results):
            done.set()

    multi.start(keep)
    assert done.wait(timeout), "the streams did not produce enough results"
    return results


def test_four_streams_share_one_engine_fairly_and_each_gets_its_own_answers():
    """Inference-bound (MobileNet v2, unpaced sources): every stream always has a frame ready, and the
    round-robin gives each the same share; each stream gets the reference answer for its own photo."""
    sources = {photo: unpaced(photo) for photo in PHOTOS}
    with MultiPipeline(MOBILENET_V2, sources, labels=IMAGENET_LABELS, threads=1, top_k=1) as multi:
        results = collect(multi, lambda r: len(r) >= 200)
        stats = multi.stats()
        fairness = multi.fairness()
    assert set(stats) == set(sources)
    per_stream = {name: [r for r in results if r.stream == name] for name in sources}
    counts = [len(v) for v in per_stream.values()]
    assert min(counts) / max(counts) >= 0.9, counts  # round-robin: nobody starves
    assert fairness >= 0.9, {k: s.fps for k, s in stats.items()}
    for name, stream_results in per_stream.items():
        ids = [r.frame_id for r in stream_results]
        assert ids == sorted(ids), f"{name}: results out of order"
        for result in stream_results:  # no crossed streams: each photo's own reference top-1
            assert result.result[0].label.startswith(REFERENCE_TOP1[name][0]), (name, result.result[0])
    assert all(s.frames > 0 and s.delegate == "xnnpack" for s in stats.values())


def test_a_batching_engine_takes_frames_of_several_streams_in_one_invoke():
    engine = edgeinfer.get_delegate("openvino").load(inspect_model(ULTRAFACE), device="CPU", batch=4)
    assert engine.inputs[0].shape[0] == 4
    try:
        sources = {f"cam{i}": unpaced("grace_hopper.bmp") for i in range(4)}
        with MultiPipeline(engine, sources, task="detect") as multi:
            results = collect(multi, lambda r: len(r) >= 80)
            invokes = multi.invokes
    finally:
        engine.close()
    assert invokes < len(results), (invokes, len(results))  # several frames per invoke
    with edgeinfer.Pipeline(ULTRAFACE, unpaced("grace_hopper.bmp"), task="detect", max_frames=1) as single:
        (alone,) = [r.result[0] for r in single]  # the same frame through a single pipeline, batch 1
    for result in results:  # every row of the batch decoded from its own outputs: the same face, same place
        assert len(result.result) == 1 and result.result[0].score > 0.99, result
        assert result.result[0].box == pytest.approx(alone.box, abs=1.0), result.stream
    assert {r.stream for r in results} == set(sources)


def test_a_classifier_whose_graph_fixes_its_batch_is_refused_with_the_reason():
    with pytest.raises(ModelLoadError, match="fixes the batch at 1"):
        edgeinfer.get_delegate("openvino").load(inspect_model(MOBILENET_TINY), device="CPU", batch=4)


def test_adding_and_removing_a_stream_while_three_run_loses_no_frame_of_the_others(tmp_path):
    frames = 90
    clips = {f"file{i}": make_test_clip(tmp_path / f"clip{i}.avi", [IMAGES / photo], size=(320, 240),
                                         frames_per_image=frames)
             for i, photo in enumerate(PHOTOS[:3])}
    with MultiPipeline(MOBILENET_TINY, clips, labels=IMAGENET_LABELS, policy="every", threads=1) as multi:
        seen: dict[str, list[int]] = {}
        added = threading.Event()

        def keep(result):
            seen.setdefault(result.stream, []).append(result.frame_id)
            if result.stream == "file0" and len(seen["file0"]) == 20 and not added.is_set():
                added.set()

        multi.start(keep)
        assert added.wait(30)
        multi.add_stream("extra", unpaced("squat.bmp"))
        deadline = time.monotonic() + 30
        while len(seen.get("extra", [])) < 10 and time.monotonic() < deadline:
            time.sleep(0.01)
        removed = multi.remove_stream("extra")
        assert multi.wait(60), "the file streams did not end"
        stats = multi.stats()
    assert removed.frames >= 10 and "extra" not in stats
    for name in clips:
        assert seen[name] == list(range(frames)), f"{name} lost or reordered frames"
        assert stats[name].frames == frames and stats[name].dropped == 0


def test_bad_streams_are_refused_and_leave_the_others_running():
    with MultiPipeline(MOBILENET_TINY, {"cam0": unpaced("parrot.jpg")}, threads=1) as multi:
        multi.start()
        with pytest.raises(ValueError, match="already a stream named 'cam0'"):
            multi.add_stream("cam0", unpaced("cat.bmp"))
        with pytest.raises(CaptureError):
            multi.add_stream("gone", "/nonexistent/clip.mp4")
        with pytest.raises(KeyError, match="no stream named 'nope'"):
            multi.remove_stream("nope")
        before = multi.stats()["cam0"].frames
        deadline = time.monotonic() + 10
        while multi.stats()["cam0"].frames <= before and time.monotonic() < deadline:
            time.sleep(0.01)
        assert multi.stats()["cam0"].frames > before and multi.streams == ["cam0"]


def test_the_cli_runs_several_sources_on_one_engine():
    base = [sys.executable, "-m", "edgeinfer", "run", str(MOBILENET_TINY), "--threads", "1", "--json"]
    command = [*base, "-s", f"door={IMAGES / 'parrot.jpg'}", "-s", f"yard={IMAGES / 'cat.bmp'}", "--loop",
               "--max-frames", "40"]
    done = subprocess.run(command, capture_output=True, text=True, cwd=REPO, timeout=120)
    assert done.returncode == 0, done.stderr
    lines = [json.loads(line) for line in done.stdout.splitlines()]
    results = [line for line in lines if line["type"] == "result"]
    summary = lines[-1]
    assert summary["type"] == "summary" and set(summary["streams"]) == {"door", "yard"}
    assert {r["stream"] for r in results} == {"door", "yard"} and len(results) >= 40
    assert summary["frames"] >= 40 and 0 < summary["fairness"] <= 1

    repeated = subprocess.run([*base, "-s", "a=x", "-s", "a=y"], capture_output=True, text=True, cwd=REPO,
                              timeout=60)
    assert repeated.returncode != 0 and "two streams are named 'a'" in repeated.stderr


def test_options_given_as_a_record_keep_their_policy_and_max_fps_paces_each_stream():
    options = edgeinfer.PipelineOptions(policy="every", labels=str(IMAGENET_LABELS))
    with MultiPipeline(MOBILENET_TINY, {"a": unpaced("parrot.jpg")}, options) as multi:
        assert multi.options.policy == "every"  # not turned into the class default, latest
    with MultiPipeline(MOBILENET_TINY, {"a": unpaced("parrot.jpg"), "b": unpaced("cat.bmp")}, max_fps=5) as multi:
        multi.start()
        time.sleep(2.0)
        multi.stop()
        stats = multi.stats()
    for name in ("a", "b"):  # an upper bound the scheduler keeps, whatever this machine's speed: 5 a second
        assert 1 <= stats[name].frames <= 5 * 2.0 + 2, (name, stats[name].frames)


def test_an_engine_that_fails_with_no_fallback_ends_the_run_with_its_error(tmp_path):
    from support.flaky_delegate import CONTROL, install_entry_point

    sys.path.insert(0, str(install_entry_point(tmp_path / "site")))
    try:
        CONTROL.set("fail", after=5)
        with MultiPipeline(MOBILENET_TINY, {"a": unpaced("parrot.jpg"), "b": unpaced("cat.bmp")},
                           delegate="flaky", labels=IMAGENET_LABELS) as multi:
            multi.start()
            assert multi.wait(30), "the run did not end when its engine failed"
            assert isinstance(multi.error, edgeinfer.DelegateFailed)
            assert "no other delegate" in str(multi.error) or "strict" in str(multi.error)
            assert multi.stream_state("a")[0] == "running"  # its capture did not fail: the engine did
    finally:
        CONTROL.set("ok")
        sys.path.remove(str(tmp_path / "site"))


def test_a_stream_whose_camera_goes_away_is_told_apart_from_one_that_ended(tmp_path):
    """A real MJPEG server killed mid-stream (its reconnect deadline 1 s): that stream *failed*, with the
    reader's error; a clip that played to its end *ended*; the engine went on until both were done."""
    from support.pipeline import MjpegServer

    from edgeinfer.util.backoff import Backoff

    clip = make_test_clip(tmp_path / "short.avi", [IMAGES / "parrot.jpg"], size=(320, 240), frames_per_image=10)
    server = MjpegServer(IMAGES / "cat.bmp").start()
    try:
        with MultiPipeline(MOBILENET_TINY, {"clip": clip, "camera": server.url}, policy="every",
                           backoff=Backoff(initial_s=0.05, max_s=0.2, give_up_s=1.0)) as multi:
            multi.start()
            deadline = time.monotonic() + 30
            while multi.stats()["camera"].frames == 0 and time.monotonic() < deadline:
                time.sleep(0.05)
            server.kill()
            assert multi.wait(60), "the run did not end after both streams did"
            state, error = multi.stream_state("camera")
            assert state == "failed" and isinstance(error, CaptureError) and "did not come back" in str(error)
            assert multi.stream_state("clip") == ("ended", None)
            assert set(multi.stream_errors()) == {"camera"}
            # the run is over, and it did not end cleanly: its error names the stream that failed
            assert isinstance(multi.error, CaptureError) and "(camera: CaptureError: stream" in str(multi.error)
            with pytest.raises(KeyError):
                multi.stream_state("nope")
    finally:
        server.kill()


@pytest.mark.parametrize("face", FACES, ids=FACE_IDS)
def test_the_options_a_single_pipeline_honours_a_multi_stream_run_honours_too(tmp_path, face):
    """``max_frames`` (the results of the whole run), ``keep_frames``, the window's output summary,
    ``opencv_threads`` (set while it runs, restored after) and the shared decoding of an MJPEG clip's frames
    (published compressed, decoded by whichever thread is free) — on both faces alike."""
    import cv2

    clip = reference_clip(tmp_path)
    before = cv2.getNumThreads()
    during: list[int] = []
    with face.build(MOBILENET_TINY, clip, loop=True, max_frames=30, keep_frames=True, opencv_threads=3,
                    labels=IMAGENET_LABELS, top_k=1) as pipeline:
        results = face.collect(pipeline, lambda _result: during.append(cv2.getNumThreads()))
        assert pipeline.wait(30), "max_frames did not end the run"
        windows = face.windows(pipeline)
    assert sum(len(got) for got in results.values()) == 30
    assert set(during) == {3} and cv2.getNumThreads() == before
    for name, got in results.items():
        assert got and all(r.frame is not None and r.frame.shape == (480, 640, 3) for r in got), name
        assert windows[name].outputs["frames"] == len(got) == sum(windows[name].outputs["top"].values())

    with face.build(MOBILENET_TINY, clip, loop=True, max_frames=30, labels=IMAGENET_LABELS, top_k=1) as pipeline:
        run = face.run(pipeline)
        decoding = [run.get_stream(name).shared for name in face.streams]
        results = face.collect(pipeline)
        assert pipeline.wait(30)
    assert all(shared is not None for shared in decoding)  # the clip's frames arrive compressed
    assert sum(len(got) for got in results.values()) == 30

"""Delegate failover and failback at run time: the pipeline outlives its accelerator.

This machine has no Coral to unplug: the ``flaky`` test delegate (tests/support/flaky_delegate.py),
registered through the public ``edgeinfer.delegates`` entry point, is a real LiteRT engine whose
device fails (with libedgetpu's own unplug text), hangs or disappears on command. The pipeline runs
MobileNet v2 on a clip of the reference photos, so every result can be checked against the
reference top-1, whichever delegate produced it.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from support.assets import IMAGES, REPO
from support.flaky_delegate import CONTROL, CONTROL_ENV, install_entry_point
from support.pipeline import (
    CLIP_FRAMES,
    CLIP_IMAGES,
    FRAMES_PER_IMAGE,
    IMAGENET_LABELS,
    MOBILENET_TINY,
    MOBILENET_V2,
    REFERENCE_TOP1,
    reference_clip,
)
from support.processes import wait_until

import edgeinfer
from edgeinfer import DelegateFailed, InferenceError, Pipeline
from edgeinfer._backoff import Backoff
from edgeinfer.errors import CudaError

FAST_PROBES = Backoff(initial_s=0.2, max_s=0.5, factor=2.0, jitter=0.0)
FLOOR_S = 0.5


@pytest.fixture(autouse=True)
def flaky(tmp_path, monkeypatch):
    """The ``flaky`` delegate registered through its entry point; its device healthy at the start and end."""
    monkeypatch.syspath_prepend(str(install_entry_point(tmp_path / "site")))
    monkeypatch.delenv("EDGEINFER_STRICT", raising=False)
    CONTROL.set("ok")
    yield CONTROL
    CONTROL.set("ok")


@pytest.fixture(scope="module")
def clip(tmp_path_factory):
    return reference_clip(tmp_path_factory.mktemp("failover-clip"))


def expected_top1(frame_id: int) -> str:
    return REFERENCE_TOP1[CLIP_IMAGES[(frame_id % CLIP_FRAMES) // FRAMES_PER_IMAGE]][0]


def run_through(pipeline: Pipeline, events: list, *, frames_degraded: int = 20) -> list:
    """Iterate the pipeline; once it has fallen back and produced ``frames_degraded`` results on the
    fallback, heal the device (the probe brings it back)."""
    results, degraded_results = [], 0
    for result in pipeline:
        results.append(result)
        if events and pipeline.delegate_status.degraded:
            degraded_results += 1
            if degraded_results == frames_degraded:
                CONTROL.set("ok")
    return results


def check_results(results: list, lost: int) -> None:
    ids = [r.frame_id for r in results]
    assert ids == sorted(set(ids)), "a frame was delivered twice or out of order"
    missing = set(range(ids[-1] + 1)) - set(ids)
    assert len(missing) == lost, missing
    for result in results:
        assert result.result[0].label.startswith(expected_top1(result.frame_id)), (result.frame_id, result.result[0])


def test_a_delegate_that_starts_failing_falls_back_between_frames_and_comes_back(clip):
    events = []
    with Pipeline(MOBILENET_V2, clip, loop=True, max_frames=160, labels=IMAGENET_LABELS, delegate="flaky,xnnpack",
                  threads=2, top_k=1, probe_backoff=FAST_PROBES) as pipeline:
        assert pipeline.engine.delegate == "flaky"
        pipeline.add_delegate_listener(events.append)
        CONTROL.set("fail", after=40)  # the 41st invoke on: "USB transfer error", as libedgetpu says it
        results = run_through(pipeline, events)
        status = pipeline.delegate_status
        assert pipeline.error is None
        window = pipeline.take_window()

    assert [e.kind for e in events] == ["delegate_fallback", "delegate_restored"]
    fallback, restored = events
    assert (fallback.previous, fallback.delegate, fallback.wanted, fallback.cause) == ("flaky", "xnnpack", "flaky",
                                                                                      "error")
    assert "USB transfer error" not in fallback.reason and "EdgeTpuDelegateForCustomOp" in fallback.reason
    assert "device stopped answering" in fallback.reason  # mapped to DelegateFailed by the Coral engine's patterns
    assert restored.delegate == "flaky" and restored.previous == "xnnpack" and restored.cause == "probe"
    assert len(results) == 160 and status.frames_lost == 1 and not status.degraded
    assert (status.fallbacks, status.restores, status.delegate) == (1, 1, "flaky")
    check_results(results, lost=1)  # every result right, whichever delegate made it; one frame lost
    assert window.frames_lost == 1 and window.degraded is False and window.delegate_wanted is None
    assert window.outputs["frames"] == 160 and sum(window.outputs["top"].values()) == 160


def test_a_hung_invoke_is_given_up_within_the_watchdog_bound_and_the_run_goes_on(clip):
    events = []
    with Pipeline(MOBILENET_V2, clip, loop=True, max_frames=140, labels=IMAGENET_LABELS, delegate="flaky,xnnpack",
                  threads=2, top_k=1, probe_backoff=FAST_PROBES, watchdog_floor_s=FLOOR_S) as pipeline:
        pipeline.add_delegate_listener(events.append)
        CONTROL.set("hang", after=40)  # the 41st invoke never returns until the device is healed
        results = run_through(pipeline, events)
        status = pipeline.delegate_status
        assert pipeline.error is None

    fallback, restored = events
    assert fallback.kind == "delegate_fallback" and fallback.cause == "hang" and fallback.delegate == "xnnpack"
    assert fallback.bound_s >= FLOOR_S
    # given up once it passed the bound, and within a watchdog tick (0.05 s here) after it; the 1 s slack is for
    # a loaded CI machine's scheduling, not the rule (5 runs here, with the fresh-clone suite running: 1-32 ms after)
    assert fallback.bound_s < fallback.waited_s < fallback.bound_s + 1.0, fallback
    assert restored.kind == "delegate_restored"  # (a probe while the device still hung is stuck until it heals)
    # the abandoned thread returned when the device was healed, and left without delivering anything
    check_results(results, lost=1)
    assert status.frames_lost == 1 and len(results) == 140


@pytest.mark.parametrize(("how", "expected"), [
    ({"env": {"EDGEINFER_STRICT": "1"}}, "strict mode: no fallback"),
    ({"options": {"failover": False}}, "failover is off"),
    ({"options": {"delegate": "flaky"}}, "no other delegate in the plan"),
])
def test_without_a_fallback_a_failing_delegate_stops_the_run_with_a_clear_error(clip, monkeypatch, how, expected):
    for name, value in how.get("env", {}).items():
        monkeypatch.setenv(name, value)
    options = {"delegate": "flaky,xnnpack", **how.get("options", {})}
    with Pipeline(MOBILENET_TINY, clip, loop=True, labels=IMAGENET_LABELS, **options) as pipeline:
        CONTROL.set("fail", after=10)
        with pytest.raises(DelegateFailed) as raised:
            list(pipeline)
    assert raised.value.delegate == "flaky" and not raised.value.hung
    assert expected in str(raised.value) and "EdgeTpuDelegateForCustomOp" in str(raised.value)
    assert pipeline.frames == 10 and pipeline.delegate_status.fallbacks == 0


def test_strict_mode_turns_a_hang_into_a_stop_that_does_not_wait_for_the_hung_thread(clip, monkeypatch):
    monkeypatch.setenv("EDGEINFER_STRICT", "1")
    pipeline = Pipeline(MOBILENET_TINY, clip, loop=True, delegate="flaky,xnnpack", watchdog_floor_s=FLOOR_S)
    CONTROL.set("hang", after=10)  # past the first invoke (its bound is 30 s: a first invoke may compile)
    pipeline.start()
    assert pipeline.wait(30), "the run did not end after its delegate hung"
    assert isinstance(pipeline.error, DelegateFailed) and pipeline.error.hung
    assert "did not return within" in str(pipeline.error) and "strict mode" in str(pipeline.error)
    pipeline.close()  # returns at once: the hung thread is not joined, its engine not closed under it
    CONTROL.set("ok")
    assert wait_until(lambda: not any(t.is_alive() for t in pipeline._supervisor.abandoned_threads), 10)


def test_a_fallback_that_fails_too_ends_the_run_naming_every_delegate_tried(clip):
    with Pipeline(MOBILENET_TINY, clip, loop=True, delegate="flaky,flaky", probe_backoff=FAST_PROBES) as pipeline:
        CONTROL.set("gone", after=10)  # unplugged: the invoke fails and the delegate cannot load again
        with pytest.raises(DelegateFailed) as raised:
            list(pipeline)
    assert "no fallback works" in str(raised.value) and "unplugged" in str(raised.value)


def test_the_delegate_list_is_a_fallback_order_at_load_time_too():
    CONTROL.set("gone")
    engine = edgeinfer.load(MOBILENET_TINY, "flaky,xnnpack")
    with engine:
        assert engine.delegate == "xnnpack" and "flaky: the test accelerator is unplugged" in engine.fallback_reason
        assert [c.spec for c in engine.selection.candidates] == ["flaky", "xnnpack"]


def test_vendor_run_time_errors_map_to_delegate_failed():
    """The documented "device gone" errors of each runtime become DelegateFailed; anything else stays InferenceError."""
    from edgeinfer.runtime.delegates.coral import EDGETPU_DEVICE_ERRORS
    from edgeinfer.runtime.delegates.openvino import map_openvino_errors
    from edgeinfer.runtime.delegates.tensorrt.engine import map_trt_errors
    from edgeinfer.runtime.delegates.xnnpack import map_litert_errors
    from edgeinfer.runtime.model import inspect_model

    model = inspect_model(MOBILENET_TINY)

    def raised(context, error: BaseException) -> BaseException:
        with pytest.raises(InferenceError) as info, context:
            raise error
        return info.value

    coral = [
        "Node number 2 (EdgeTpuDelegateForCustomOp) failed to invoke.",
        "Deadline exceeded: USB transfer error 2 [LibUsbDataOutCallback]",
        "Not found: USB transfer error 5 [LibUsbDataInCallback]",
    ]
    for text in coral:
        error = raised(map_litert_errors(model, "invoke", delegate="coral", device_errors=EDGETPU_DEVICE_ERRORS),
                       RuntimeError(text))
        assert isinstance(error, DelegateFailed) and error.delegate == "coral", text
    plain = raised(map_litert_errors(model, "invoke"), RuntimeError("tensor 3 has the wrong type"))
    assert type(plain) is InferenceError

    for text in ("[GPU] clEnqueueNDRangeKernel, error code: -5 CL_OUT_OF_RESOURCES",
                 "Exception from src/plugins/intel_npu: ZE_RESULT_ERROR_DEVICE_LOST", "[ NC_ERROR ] XLink error"):
        error = raised(map_openvino_errors(model, "invoke", "GPU"), RuntimeError(text))
        assert isinstance(error, DelegateFailed) and error.delegate == "openvino:GPU", text
    assert type(raised(map_openvino_errors(model, "invoke"), RuntimeError("Input blob size is not equal"))) \
        is InferenceError

    lost = raised(map_trt_errors(model, "invoke"), CudaError(700, "cudaErrorIllegalAddress", "cudaStreamSynchronize"))
    assert isinstance(lost, DelegateFailed) and lost.delegate == "tensorrt" and "cudaErrorIllegalAddress" in str(lost)
    assert type(raised(map_trt_errors(model, "invoke"), RuntimeError("bad binding"))) is InferenceError


def test_the_cli_runs_on_through_a_failure_and_strict_stops_with_the_error(tmp_path, flaky):
    control = tmp_path / "device"
    control.write_text("fail after 20")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), str(REPO / "tests"), str(tmp_path / "site")]),
               **{CONTROL_ENV: str(control)})
    command = [sys.executable, "-m", "edgeinfer", "run", str(MOBILENET_TINY), "--source", str(IMAGES / "*.jpg"),
               "--loop", "--max-frames", "60", "--delegate", "flaky,xnnpack"]
    degraded = subprocess.run(command, capture_output=True, text=True, env=env, timeout=120)
    assert degraded.returncode == 0, degraded.stderr
    assert "60 frames" in degraded.stdout and "on xnnpack (degraded: flaky failed, 1 frame(s) lost)" in degraded.stdout
    assert "going on with xnnpack" in degraded.stderr
    strict = subprocess.run([*command, "--strict"], capture_output=True, text=True, env=env, timeout=120)
    assert strict.returncode != 0
    assert "strict mode: no fallback" in strict.stderr and "EdgeTpuDelegateForCustomOp" in strict.stderr


def test_an_engine_serving_three_streams_fails_over_and_back_and_every_stream_goes_on(clip):
    """MultiPipeline: the engine's failure is every stream's; each goes on on the fallback, then on the
    wanted delegate again; every result is right, and only the frames of the failed invoke are lost."""
    events: list = []
    results: dict[str, list] = {"a": [], "b": [], "c": []}
    with edgeinfer.MultiPipeline(MOBILENET_V2, {name: clip for name in results}, policy="every", loop=True,
                                 labels=IMAGENET_LABELS, delegate="flaky,xnnpack", threads=2, top_k=1,
                                 probe_backoff=FAST_PROBES) as multi:
        multi.add_delegate_listener(events.append)
        CONTROL.set("fail", after=30)

        def on_result(result) -> None:
            results[result.stream].append(result)
            if len(events) == 1 and sum(len(r) for r in results.values()) > 120:
                CONTROL.set("ok")  # the device heals once the streams have run degraded for a while

        multi.start(on_result)
        assert wait_until(lambda: len(events) == 2 and min(len(r) for r in results.values()) >= 80, 60), events
        multi.stop()
        stats = multi.stats()
    fallback, restored = events
    assert (fallback.kind, fallback.previous, fallback.delegate, fallback.cause) == (
        "delegate_fallback", "flaky", "xnnpack", "error")
    assert (restored.kind, restored.delegate) == ("delegate_restored", "flaky")
    lost = {name: set(range(r[-1].frame_id + 1)) - {x.frame_id for x in r} for name, r in results.items()}
    assert sum(len(missing) for missing in lost.values()) == fallback.frames_lost <= 3  # one batch of one frame
    for name, got in results.items():
        assert [r.frame_id for r in got] == sorted({r.frame_id for r in got}), name
        for result in got:
            assert result.result[0].label.startswith(expected_top1(result.frame_id)), (name, result.frame_id)
        assert stats[name].frames_lost == fallback.frames_lost and stats[name].degraded is False


def test_an_engine_serving_three_streams_gives_up_a_hung_invoke_and_every_stream_goes_on(clip):
    """MultiPipeline's watchdog: the engine's thread stuck in an invoke is abandoned within the bound, a new
    one serves every stream on the fallback, the wanted delegate comes back once healed, and the abandoned
    thread, when its call finally returns, leaves without delivering."""
    events: list = []
    results: dict[str, list] = {"a": [], "b": [], "c": []}
    with edgeinfer.MultiPipeline(MOBILENET_V2, {name: clip for name in results}, policy="every", loop=True,
                                 labels=IMAGENET_LABELS, delegate="flaky,xnnpack", threads=2, top_k=1,
                                 probe_backoff=FAST_PROBES, watchdog_floor_s=FLOOR_S) as multi:
        multi.add_delegate_listener(events.append)
        CONTROL.set("hang", after=30)  # past the first invoke (its bound is 30 s: a first invoke may compile)

        def on_result(result) -> None:
            results[result.stream].append(result)
            if len(events) == 1 and sum(len(r) for r in results.values()) > 120:
                CONTROL.set("ok")  # the device heals: the hung call returns, the probe brings flaky back

        multi.start(on_result)
        assert wait_until(lambda: len(events) == 2 and min(len(r) for r in results.values()) >= 80, 60), events
        worker = multi._default
        assert len(worker.abandoned_threads) == 1
        assert wait_until(lambda: not worker.abandoned_threads[0].is_alive(), 10)
        multi.stop()
        stats = multi.stats()
        assert multi.error is None
    fallback, restored = events
    assert (fallback.kind, fallback.previous, fallback.delegate, fallback.cause) == (
        "delegate_fallback", "flaky", "xnnpack", "hang")
    assert fallback.bound_s >= FLOOR_S and fallback.bound_s < fallback.waited_s < fallback.bound_s + 1.0, fallback
    assert (restored.kind, restored.delegate) == ("delegate_restored", "flaky")
    lost = {name: set(range(r[-1].frame_id + 1)) - {x.frame_id for x in r} for name, r in results.items()}
    assert sum(len(missing) for missing in lost.values()) == fallback.frames_lost == 1  # the hung batch's frame
    for name, got in results.items():
        assert [r.frame_id for r in got] == sorted({r.frame_id for r in got}), name  # none twice: not the hung one
        for result in got:
            assert result.result[0].label.startswith(expected_top1(result.frame_id)), (name, result.frame_id)
        assert stats[name].degraded is False


def test_a_multi_stream_hang_without_a_fallback_ends_the_run_without_waiting_for_the_hung_thread(clip, monkeypatch):
    monkeypatch.setenv("EDGEINFER_STRICT", "1")
    multi = edgeinfer.MultiPipeline(MOBILENET_TINY, {"a": clip, "b": clip}, loop=True, delegate="flaky,xnnpack",
                                    watchdog_floor_s=FLOOR_S)
    CONTROL.set("hang", after=10)
    multi.start()
    assert multi.wait(30), "the run did not end after its delegate hung"
    assert isinstance(multi.error, DelegateFailed) and multi.error.hung
    assert "did not return within" in str(multi.error) and "strict mode" in str(multi.error)
    assert not multi.busy  # the thread stuck in the invoke does not count as serving the streams
    multi.close()  # returns at once: the hung thread is not joined, its engine not closed under it
    CONTROL.set("ok")
    assert wait_until(lambda: not any(t.is_alive() for t in multi._default.abandoned_threads), 10)

"""A ``pipelines:`` entry with ``sources``: read from agent.yaml, run as one MultiPipeline, reported per stream.

The agent tests run the real agent process against a real Mosquitto, on real models and photos.
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import pytest
from support.agent import AgentProcess, fleet_key, signed_command, write_config
from support.agent import agent_config as make_agent_config
from support.assets import IMAGES, LABELS, MODELS
from support.broker import Collector

from edgeinfer.agent.config import load_config, parse_config
from edgeinfer.errors import CaptureError, ConfigError
from edgeinfer.link.protocol import validate

TINY = str(MODELS / "mobilenet_v1_0.25_128_quant.tflite")



def agent_config(tmp_path: Path, broker_url: str, **values) -> Path:
    return make_agent_config(tmp_path, broker_url, telemetry_interval_s=0.2, **values)


def events(collector: Collector, name: str, pipeline: str | None = None) -> list[dict]:
    return [e for e in collector.of_kind("events") if e["event"] == name and pipeline in (None, e["pipeline"])]


def entries(collector: Collector, name: str) -> list[dict]:
    """The pipeline's entry of every telemetry window so far."""
    return [p for m in collector.of_kind("telemetry") for p in m["pipelines"] if p["name"] == name]


def assert_all_valid(collector: Collector) -> None:
    for topic, body, _retained in list(collector.messages):
        if not topic.endswith("/cmd"):
            validate(topic.rsplit("/", 1)[1], body)


# ------------------------------------------------------------------------------------ config

def test_sources_in_every_form(tmp_path):
    (tmp_path / "clips").mkdir()
    (tmp_path / "clips" / "door.mjpeg").write_bytes(b"")
    config = load_config(write_config(tmp_path / "agent.yaml", device_id="cam-01", pipelines=[{
        "name": "yard", "model": TINY, "max_fps": 5, "track": True, "task": "detect", "batch": 2,
        "sources": ["clips/door.mjpeg", 0, "2", {"name": "gate", "source": "rtsp://cam/gate"},
                    {"source": "missing.mp4"}, {"name": "side", "source": 1}]}]))
    pipeline = config.pipelines[0]
    assert pipeline.source is None and pipeline.batch == 2
    assert [(s.name, s.source) for s in pipeline.sources] == [
        ("stream0", str(tmp_path / "clips" / "door.mjpeg")),  # relative to the config file, as source: is
        ("stream1", 0), ("stream2", 2), ("gate", "rtsp://cam/gate"),
        ("stream4", "missing.mp4"),  # unnamed: by its place in the list, as `edgeinfer run -s` names it
        ("side", 1)]
    assert pipeline.options.max_fps == 5 and pipeline.options.track  # every stream takes the entry's options
    single = parse_config({"pipelines": [{"model": TINY, "source": "0"}]}, hostname="cam").pipelines[0]
    assert single.source == 0 and single.sources == () and single.batch is None


SOURCES_WORDS = "pipelines[0].sources: must be a list of 1 to 32 sources, each a source or {name: NAME, source: SOURCE}"


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ({"source": 0, "sources": [1]}, "pipelines[0].sources: give either source (one stream) or sources"),
        ({}, "pipelines[0].source: required"),
        ({"sources": None}, "pipelines[0].source: required"),
        ({"sources": []}, SOURCES_WORDS + ", got a JSON array"),
        ({"sources": "door.mp4"}, SOURCES_WORDS + ", got 'door.mp4'"),
        ({"sources": {"name": "door", "source": 0}}, SOURCES_WORDS + ", got a JSON object"),
        ({"sources": list(range(33))}, SOURCES_WORDS),
        ({"sources": [0, True]}, "pipelines[0].sources[1]: must be a source (a video file"),
        ({"sources": [0, None]}, "pipelines[0].sources[1]: must be a source (a video file, image folder or glob, "
                                 "camera index, /dev/videoN, rtsp:// URL or GStreamer pipeline) or {name: NAME, "
                                 "source: SOURCE}, got null"),  # the words the schema's errorMessage gives
        ({"sources": [[0, 1]]}, "pipelines[0].sources[0]: must be a source"),
        ({"sources": [0, ""]}, "pipelines[0].sources[1]: must be a source (a video file"),
        ({"sources": [{"name": "door"}]}, "pipelines[0].sources[0]: missing required key 'source'"),
        ({"sources": [{"name": "door", "source": {"url": "x"}}]}, "pipelines[0].sources[0].source: must be a source"),
        ({"sources": [{"nmae": "door", "source": 0}]},
         "pipelines[0].sources[0].nmae: unknown key — did you mean 'name'?"),
        ({"sources": [{"name": "door", "source": 0, "loop": True}]}, "pipelines[0].sources[0].loop: unknown key"),
        ({"sources": [{"name": "front door", "source": 0}]},
         "pipelines[0].sources[0].name: must be 1-64 of A-Z a-z 0-9 . _ - (starting with a letter or digit), "
         "got 'front door'"),
        ({"sources": [0, {"name": "cam/2", "source": 1}]}, "pipelines[0].sources[1].name: must be 1-64 of A-Z a-z 0-9"),
        ({"sources": [{"name": "door", "source": 0}, {"name": "door", "source": 1}]},
         "pipelines[0].sources[1]: two streams are named 'door'; stream names must be unique"),
        ({"sources": [0, {"name": "stream0", "source": 1}]},
         "pipelines[0].sources[1]: two streams are named 'stream0'"),
        ({"source": 0, "batch": 2}, "pipelines[0].batch: only a pipeline with sources takes it"),
        ({"sources": [0, 1], "batch": 0}, "pipelines[0].batch: must be an integer >= 1, got 0"),
        ({"sources": [0, 1], "batch": "two"}, "pipelines[0].batch: must be an integer, got 'two'"),
    ],
)
def test_each_mistake_in_sources_names_its_key(tmp_path, entry, message):
    path = write_config(tmp_path / "agent.yaml", device_id="cam-01", pipelines=[{"model": TINY, **entry}])
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert str(info.value).startswith(f"{path}: ")
    assert message in str(info.value)


def test_a_single_source_pipeline_reports_as_before():
    """No ``streams`` anywhere for a pipeline with one source: its messages are unchanged."""
    from edgeinfer.agent.runner import PipelineRunner
    from edgeinfer.agent.telemetry import pipeline_entry
    from edgeinfer.pipeline.stats import PipelineStats

    config = parse_config({"pipelines": [{"model": TINY, "source": 0}]}, hostname="cam").pipelines[0]
    runner = PipelineRunner(config, emit=lambda *a, **k: None, on_change=lambda: None)
    assert runner.describe()["source"] == "0" and "streams" not in runner.describe()
    stats = PipelineStats(frames=3, dropped=1, fps=2.5, elapsed_s=1.2, stages={}, delegate="xnnpack")
    assert pipeline_entry("main", "running", stats, restarts=2, streams=[s.name for s in config.sources]) == {
        "name": "main", "status": "running", "delegate": "xnnpack", "frames": 3, "dropped": 1, "fps": 2.5,
        "restarts": 2, "stages": {}, "degraded": False, "delegate_wanted": None}
    assert pipeline_entry("main", "failed", None, delegate="xnnpack", restarts=1) == {
        "name": "main", "status": "failed", "delegate": "xnnpack", "frames": 0, "dropped": 0, "fps": 0.0,
        "restarts": 1, "stages": {}}


# ------------------------------------------------------------------------- the pipeline itself

def test_streams_end_the_run_and_every_missing_source_fails_the_build(tmp_path):
    from edgeinfer.agent.runner import default_pipeline_factory, pipeline_window

    def config(sources, **values):
        return parse_config({"pipelines": [{"name": "p", "model": TINY, "threads": 1, "sources": sources,
                                            **values}]}, hostname="cam").pipelines[0]

    with pytest.raises(CaptureError) as info:  # nothing opens: the build fails, the runner restarts it
        default_pipeline_factory(config([str(tmp_path / "a.mp4"), {"name": "b", "source": str(tmp_path / "b.mp4")}]))
    assert "no stream of pipeline p is running (stream0: CaptureError: source not found" in str(info.value)
    assert "; b: CaptureError: source not found" in str(info.value)

    # two still images without loop: one frame each, then each stream ends and so does the run
    entry = config([str(IMAGES / "parrot.jpg"), {"name": "cat", "source": str(IMAGES / "cat.bmp")}])
    pipeline = default_pipeline_factory(entry)
    stream_events: list = []
    try:
        pipeline.add_stream_listener(stream_events.append)
        assert pipeline.swap_engine(pipeline.engine) is pipeline.engine  # the engine it runs: nothing to do
        assert pipeline.start().wait(20) and pipeline.error is None
        window = pipeline_window(entry, pipeline, pipeline.take_window())  # what telemetry reports
        assert window.frames == 2 and {name: s.frames for name, s in window.streams.items()} == {"stream0": 1,
                                                                                                 "cat": 1}
        assert window.stream_status == {"stream0": "ended", "cat": "ended"}
        assert sorted(e.data["stream"] for e in stream_events if e.kind == "stream_ended") == ["cat", "stream0"]
        assert sum(s.frames for s in pipeline.stats().values()) == 2
    finally:
        pipeline.close()

    # max_frames counts the results of every stream
    pipeline = default_pipeline_factory(config([str(IMAGES / "*.jpg"), str(IMAGES / "*.bmp")], loop=True,
                                               max_fps=20, max_frames=12))
    try:
        assert pipeline.start().wait(20) and pipeline.error is None
        assert 12 <= sum(s.frames for s in pipeline.stats().values()) <= 24  # it stops right after the 12th result
    finally:
        pipeline.close()


def test_an_engine_that_fails_ends_the_run_with_its_error(monkeypatch):
    """The engine's thread stops on an error no delegate can take over: the whole run ends with that error."""
    from edgeinfer.agent.runner import default_pipeline_factory
    from edgeinfer.errors import InferenceError

    config = parse_config({"pipelines": [{"name": "p", "model": TINY, "threads": 1, "loop": True,
                                          "delegate": "xnnpack", "failover": False,  # no delegate to go on with
                                          "sources": [str(IMAGES / "*.jpg"), str(IMAGES / "*.bmp")]}]},
                          hostname="cam").pipelines[0]
    pipeline = default_pipeline_factory(config)

    def unplugged() -> None:
        raise InferenceError("the accelerator is gone")

    monkeypatch.setattr(pipeline.engine, "invoke", unplugged)
    try:
        assert pipeline.start().wait(10)
        assert isinstance(pipeline.error, InferenceError) and "the accelerator is gone" in str(pipeline.error)
    finally:
        pipeline.close()


# --------------------------------------------------------------------------------- the agent

def test_agent_runs_three_sources_on_one_engine_and_reports_each_stream(tmp_path, broker, clip):
    config = agent_config(tmp_path, broker.url, update_public_key=fleet_key().public_key_b64(), pipelines=[{
        "name": "lobby", "model": TINY, "threads": 1, "loop": True, "max_fps": 10, "version": "1",
        "labels": str(LABELS / "imagenet_labels.txt"),
        "sources": [str(IMAGES / "*.jpg"), {"name": "bmp", "source": str(IMAGES / "*.bmp")},
                    {"name": "clip", "source": str(clip)}]}])
    with Collector(broker.port) as collector, AgentProcess(config, tmp_path / "agent.log") as agent:
        assert collector.wait_subscribed()

        def every_stream_ran(c: Collector) -> bool:
            return any(all(s["frames"] > 0 for s in p.get("streams", [])) and len(p.get("streams", [])) == 3
                       for p in entries(c, "lobby"))

        assert collector.wait_until(every_stream_ran, 30), agent.output()
        for entry in entries(collector, "lobby"):  # the pipeline's figures are its streams' sums, in every window
            streams = entry["streams"]
            assert [s["name"] for s in streams] == ["stream0", "bmp", "clip"]
            assert entry["frames"] == sum(s["frames"] for s in streams)
            assert entry["dropped"] == sum(s["dropped"] for s in streams)
            assert abs(entry["fps"] - sum(s["fps"] for s in streams)) < 0.01
        window = next(p for p in reversed(entries(collector, "lobby")) if all(s["frames"] for s in p["streams"]))
        assert window["status"] == "running" and window["delegate"] == "xnnpack"
        assert {s["status"] for s in window["streams"]} == {"running"}
        assert window["stages"]["infer"]["p50"] > 0 and window["outputs"]["frames"] > 0
        assert window["outputs"]["top"]  # labelled answers of every stream: the canary analysis goes on
        assert [e["data"]["delegate"] for e in events(collector, "pipeline_started")] == ["xnnpack"]  # one engine

        state = collector.of_kind("state")[-1]
        lobby = state["pipelines"][0]
        assert lobby["status"] == "running" and lobby["model"]["version"] == "1"
        assert [(s["name"], s["source"], s["status"]) for s in lobby["streams"]] == [
            ("stream0", str(IMAGES / "*.jpg"), "running"), ("bmp", str(IMAGES / "*.bmp"), "running"),
            ("clip", str(clip), "running")]
        assert lobby["source"] == f"stream0={IMAGES / '*.jpg'}, bmp={IMAGES / '*.bmp'}, clip={clip}"

        # the runner supervises it like any pipeline: a restart command restarts every stream
        collector.publish("edgeinfer/v1/test/cam-01/cmd",
                          signed_command("c-restart-1", "restart_pipeline", {"pipeline": "lobby"}))
        assert collector.wait_until(lambda c: len(events(c, "pipeline_started")) == 2, 20), agent.output()
        restarted = len(entries(collector, "lobby"))
        assert collector.wait_until(lambda c: any(p["restarts"] == 1 and all(s["frames"] for s in p["streams"])
                                                  for p in entries(c, "lobby")[restarted:]), 15)

        assert agent.terminate() == 0, agent.output()
        assert collector.wait_until(lambda c: c.of_kind("state")[-1]["online"] is False, 5)
        assert {s["status"] for s in collector.of_kind("state")[-1]["pipelines"][0]["streams"]} == {"stopped"}
        assert "Traceback" not in agent.output()
        assert_all_valid(collector)


def test_a_failing_stream_is_reported_and_reopened_while_the_others_run_on(tmp_path, broker):
    late = tmp_path / "late"  # not there yet: its stream fails to open
    config = agent_config(tmp_path, broker.url, restart_min_s=0.2, restart_max_s=0.5, pipelines=[
        {"name": "lobby", "model": TINY, "threads": 1, "loop": True, "max_fps": 10,
         "backoff": {"initial_s": 0.2, "max_s": 0.5},  # how often a failed stream is opened again
         "sources": [str(IMAGES / "*.jpg"), {"name": "late", "source": str(late)}]},
        {"name": "dead", "model": TINY, "threads": 1,  # no stream opens: the pipeline fails and restarts
         "sources": [str(tmp_path / "nope.mp4"), {"name": "gone", "source": str(tmp_path / "gone.mp4")}]}])
    with Collector(broker.port) as collector, AgentProcess(config, tmp_path / "agent.log") as agent:
        assert collector.wait_subscribed()
        assert collector.wait_until(lambda c: events(c, "stream_failed", "lobby"), 30), agent.output()
        failed = events(collector, "stream_failed", "lobby")[0]
        assert failed["level"] == "error" and failed["data"]["stream"] == "late"
        assert failed["data"]["type"] == "CaptureError" and str(late) in failed["data"]["error"]
        assert 0 < failed["data"]["retry_in_s"] <= 0.2

        def others_run_on(c: Collector) -> bool:
            return any(p["status"] == "running" and p["streams"][0]["frames"] > 0 for p in entries(c, "lobby"))

        assert collector.wait_until(others_run_on, 20), agent.output()
        window = [p for p in entries(collector, "lobby") if p["status"] == "running"][-1]
        assert window["streams"][1] == {"name": "late", "status": "failed", "frames": 0, "dropped": 0, "fps": 0.0,
                                        "reused": 0}
        assert window["frames"] == window["streams"][0]["frames"]
        assert collector.wait_until(lambda c: any(
            s["name"] == "late" and s["status"] == "failed" and "late" in s["error"]
            for s in c.of_kind("state")[-1]["pipelines"][0].get("streams", [])), 5)

        assert collector.wait_until(lambda c: len(events(c, "pipeline_restarting", "dead")) >= 2, 20)
        dead = events(collector, "pipeline_failed", "dead")[0]
        assert "no stream of pipeline dead is running (stream0: CaptureError: source not found" in \
            dead["data"]["error"] and "; gone: CaptureError" in dead["data"]["error"]

        staging = tmp_path / "staging"  # the source appears (whole): the stream is opened again and runs
        staging.mkdir()
        shutil.copy(IMAGES / "parrot.jpg", staging / "parrot.jpg")
        staging.rename(late)
        appeared = time.time()
        assert collector.wait_until(lambda c: events(c, "stream_restored", "lobby"), 10), agent.output()
        assert events(collector, "stream_restored", "lobby")[0]["data"]["stream"] == "late"
        assert collector.wait_until(lambda c: any(m["ts"] > appeared and p["name"] == "lobby"
                                                  and p["streams"][1]["frames"] > 0 and p["status"] == "running"
                                                  for m in c.of_kind("telemetry") for p in m["pipelines"]), 10)
        assert len(events(collector, "stream_failed", "lobby")) == 1  # retries that failed were not re-reported
        assert not events(collector, "pipeline_failed", "lobby") and agent.alive()
        assert_all_valid(collector)

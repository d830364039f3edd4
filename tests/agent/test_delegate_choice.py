"""The agent says which runtime the delegate probe chose for its pipeline, with the figures, and where it came from.

A real agent (a subprocess against a real Mosquitto) runs YOLO11n-pose on a looping image with no delegate named,
the probe on (the suite turns it off) and its cache in a folder of the test's: the first start measures ONNX Runtime
and OpenVINO, the second reads the choice back. Which one wins is this machine's business, never asserted.
"""

from __future__ import annotations

import os

from support.agent import AgentProcess, write_config
from support.assets import IMAGES, MODELS
from support.broker import Collector

from edgeinfer.link.protocol import validate

CANDIDATES = ["onnxruntime", "openvino:CPU"]


def started_event(collector: Collector) -> dict:
    return next(m for m in collector.of_kind("events") if m["event"] == "pipeline_started")


def test_the_agent_says_the_probe_s_choice_and_its_figures_measured_then_cached(tmp_path, broker, monkeypatch):
    monkeypatch.setenv("EDGEINFER_DELEGATE_PROBE", "1")
    monkeypatch.setenv("EDGEINFER_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("EDGEINFER_DELEGATE_PROBE_BUDGET_S", "2")
    said = []
    for start in range(2):  # a data folder each: the second agent does not send the first one's spooled events again
        config = write_config(
            tmp_path / f"agent{start}.yaml", device_id="cam-01", fleet="test", broker=broker.url,
            data_dir=str(tmp_path / f"data{start}"), telemetry_interval_s=0.5, pipelines=[{
                "name": "main", "model": str(MODELS / "yolo11n-pose.onnx"), "source": str(IMAGES / "squat.bmp"),
                "loop": True, "max_fps": 2}])
        with Collector(broker.port) as collector, AgentProcess(config, tmp_path / f"agent{start}.log") as agent:
            assert collector.wait_subscribed()
            assert collector.wait_until(lambda c: any(m["event"] == "pipeline_started" for m in c.of_kind("events")),
                                        180), agent.output()
            event = validate("events", started_event(collector))
            said.append(event)
    first, second = (event["data"]["delegate_choice"] for event in said)
    assert first["cached"] is False and second["cached"] is True
    assert [m["delegate"] for m in first["measurements"]] == CANDIDATES
    assert second["measurements"] == first["measurements"] and second["chosen"] == first["chosen"]
    assert first["reference"] == "onnxruntime" and "squat.bmp" in first["judged_on"]
    if first["chosen"] != "onnxruntime":  # the rule: only a runtime whose answers agree replaces the reference
        assert first["measurements"][1]["agrees"] is True
    for event, origin in zip(said, ("chosen by measurement", "the probe's cached choice")):
        assert event["data"]["delegate"] == event["data"]["delegate_choice"]["chosen"]
        assert event["message"].startswith(f"pipeline main running on {event['data']['delegate']}; delegate ")
        assert origin in event["message"] and " ms" in event["message"]
    assert os.path.exists(tmp_path / "cache" / "delegate-choices.json")


def test_an_agent_pipeline_with_delegate_probe_false_runs_on_the_plan_s_first(tmp_path, broker, monkeypatch):
    monkeypatch.setenv("EDGEINFER_DELEGATE_PROBE", "1")
    monkeypatch.setenv("EDGEINFER_CACHE_DIR", str(tmp_path / "cache"))
    config = write_config(
        tmp_path / "agent.yaml", device_id="cam-01", fleet="test", broker=broker.url,
        data_dir=str(tmp_path / "data"), telemetry_interval_s=0.5, pipelines=[{
            "name": "main", "model": str(MODELS / "yolo11n-pose.onnx"), "source": str(IMAGES / "squat.bmp"),
            "loop": True, "max_fps": 2, "delegate_probe": False}])
    with Collector(broker.port) as collector, AgentProcess(config, tmp_path / "agent.log") as agent:
        assert collector.wait_subscribed()
        assert collector.wait_until(lambda c: any(m["event"] == "pipeline_started" for m in c.of_kind("events")),
                                    120), agent.output()
        event = started_event(collector)
    assert event["data"]["delegate"] == "onnxruntime" and "delegate_choice" not in event["data"]
    assert event["message"] == "pipeline main running on onnxruntime"
    assert not (tmp_path / "cache").exists()

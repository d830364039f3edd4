"""A real agent whose accelerator fails, hangs and comes back: it runs degraded and says so, never restarts.

The agent is a subprocess against a real Mosquitto; its pipeline's first delegate is ``flaky``
(tests/support/flaky_delegate.py, registered through the ``edgeinfer.delegates`` entry point): a
real LiteRT engine whose device is told what to do through a control file.
"""

from __future__ import annotations

import os
import time

from support.agent import AgentProcess, write_config
from support.assets import IMAGES, LABELS, MODELS, REPO
from support.broker import Collector
from support.flaky_delegate import CONTROL_ENV, install_entry_point

from edgeinfer.link.protocol import validate


def events(collector: Collector, name: str) -> list[dict]:
    return [m for m in collector.of_kind("events") if m["event"] == name]


def main_entries(collector: Collector, kind: str) -> list[dict]:
    return [p for m in collector.of_kind(kind) for p in m["pipelines"] if p["name"] == "main"]


def test_agent_runs_degraded_through_a_failed_and_a_hung_accelerator_and_restores_it(tmp_path, broker, monkeypatch):
    site = install_entry_point(tmp_path / "site")
    control = tmp_path / "device"
    control.write_text("ok")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(REPO / "tests"), str(site)]))
    config = write_config(
        tmp_path / "agent.yaml", device_id="cam-01", fleet="test", broker=broker.url,
        data_dir=str(tmp_path / "data"), telemetry_interval_s=0.25, pipelines=[{
            "name": "main", "model": str(MODELS / "mobilenet_v1_0.25_128_quant.tflite"),
            "source": str(IMAGES / "*.jpg"), "loop": True, "max_fps": 30, "threads": 1,
            "labels": str(LABELS / "imagenet_labels.txt"), "delegate": "flaky,xnnpack",
            "watchdog_floor_s": 0.5, "probe_backoff": {"initial_s": 0.3, "max_s": 1.0, "jitter": 0.0}}])
    env = {CONTROL_ENV: str(control)}
    with Collector(broker.port) as collector, AgentProcess(config, tmp_path / "agent.log", env=env) as agent:
        assert collector.wait_subscribed()
        assert collector.wait_until(lambda c: sum(p["frames"] for p in main_entries(c, "telemetry")) >= 40, 40), \
            agent.output()
        started = events(collector, "pipeline_started")
        assert started[0]["data"]["delegate"] == "flaky"

        for fault, cause in (("fail", "error"), ("hang", "hang")):
            control.write_text(fault)
            assert collector.wait_until(lambda c, n=cause: any(
                e["data"]["cause"] == n for e in events(c, "delegate_fallback")), 20), agent.output()
            fallback = next(e for e in events(collector, "delegate_fallback") if e["data"]["cause"] == cause)
            assert fallback["level"] == "warning" and fallback["pipeline"] == "main"
            assert (fallback["data"]["previous"], fallback["data"]["delegate"]) == ("flaky", "xnnpack")
            # the agent reports the degraded run in its state and its telemetry, and keeps producing frames
            assert collector.wait_until(lambda c: any(
                p.get("degraded") and p.get("delegate_wanted") == "flaky" and p["delegate"] == "xnnpack"
                for m in c.of_kind("state")[-1:] for p in m["pipelines"]), 10)
            marker = time.time()
            assert collector.wait_until(lambda c, t=marker: sum(
                p["frames"] for m in c.of_kind("telemetry") if m["ts"] > t for p in m["pipelines"]
                if p["name"] == "main" and p.get("degraded") and p["delegate"] == "xnnpack") >= 20, 20)

            restored_before = len(events(collector, "delegate_restored"))
            control.write_text("ok")
            assert collector.wait_until(lambda c, n=restored_before: len(events(c, "delegate_restored")) > n, 20)
            assert collector.wait_until(lambda c: any(
                not p.get("degraded") and p["delegate"] == "flaky"
                for m in c.of_kind("state")[-1:] for p in m["pipelines"]), 10)
            marker = time.time()
            assert collector.wait_until(lambda c, t=marker: sum(
                p["frames"] for m in c.of_kind("telemetry") if m["ts"] > t for p in m["pipelines"]
                if p["name"] == "main" and not p.get("degraded") and p["delegate"] == "flaky") >= 10, 20)

        # one pipeline run throughout: failovers are not failures, and nothing was restarted
        assert len(events(collector, "pipeline_started")) == 1
        assert not events(collector, "pipeline_failed") and not events(collector, "pipeline_restarting")
        telemetry = main_entries(collector, "telemetry")
        statuses = [p["status"] for p in telemetry]
        # from its first report as running on (on a loaded machine a report or two came while it was starting)
        assert "running" in statuses and set(statuses[statuses.index("running"):]) == {"running"}, statuses
        assert all(p["restarts"] == 0 for p in telemetry), [p["restarts"] for p in telemetry]
        assert agent.terminate() == 0, agent.output()

    for topic, body, _retained in list(collector.messages):
        if not topic.endswith("/cmd"):
            validate(topic.rsplit("/", 1)[1], body)

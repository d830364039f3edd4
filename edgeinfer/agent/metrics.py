"""Optional Prometheus ``/metrics`` endpoint with the same figures as the telemetry messages.

Needs ``prometheus-client`` (in the ``fleet`` extra). Values come from the agent's latest
telemetry window, so a scrape costs the pipeline nothing; counters (frames, drops, spool drops)
are cumulative as Prometheus expects.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ..link.vocabulary import EventKind
from ..pipeline.stats import PERCENTILES
from .services import AgentServices

PREFIX = "edgeinfer"


#: Prometheus quantile label of each percentile the telemetry carries (p50 -> "0.5"; the mean is not one)
QUANTILES = tuple((str(int(name[1:]) / 100), name) for name in PERCENTILES if name[1:].isdigit())


class _AgentCollector:
    """Builds every metric family from the agent's latest telemetry window, at scrape time."""

    def __init__(self, agent: AgentServices) -> None:
        self.agent = agent

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import InfoMetricFamily

        agent = self.agent
        latest = agent.figures.latest or {}
        info = InfoMetricFamily(f"{PREFIX}_agent", "Agent identity", labels=["device", "fleet", "boot_id"])
        info.add_metric([agent.topics.device, agent.topics.fleet, agent.boot.boot_id],
                        {"version": str(agent.versions.get("edgeinfer", ""))})
        yield info
        yield from self._pipelines(latest.get("pipelines", []))
        yield self._models()
        yield from self._system(latest.get("system", {}))
        yield from self._transport()

    def _pipelines(self, entries: list[dict[str, Any]]) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        fps = GaugeMetricFamily(f"{PREFIX}_pipeline_fps", "Frames per second in the last window", labels=["pipeline"])
        frames = CounterMetricFamily(f"{PREFIX}_pipeline_frames", "Frames processed", labels=["pipeline"])
        dropped = CounterMetricFamily(f"{PREFIX}_pipeline_dropped_frames", "Frames dropped", labels=["pipeline"])
        restarts = CounterMetricFamily(f"{PREFIX}_pipeline_restarts", "Pipeline restarts", labels=["pipeline"])
        running = GaugeMetricFamily(f"{PREFIX}_pipeline_running", "1 while the pipeline runs", labels=["pipeline"])
        stage = GaugeMetricFamily(f"{PREFIX}_pipeline_stage_ms", "Per-stage time in the last window, ms",
                                  labels=["pipeline", "stage", "quantile"])
        for entry in entries:
            name = entry["name"]
            fps.add_metric([name], entry["fps"])
            totals = self.agent.figures.totals.get(name, {})
            frames.add_metric([name], totals.get("frames", 0))
            dropped.add_metric([name], totals.get("dropped", 0))
            restarts.add_metric([name], entry.get("restarts", 0))
            running.add_metric([name], 1.0 if entry["status"] == "running" else 0.0)
            for stage_name, figures in entry.get("stages", {}).items():
                for quantile, key in QUANTILES:
                    if key in figures:
                        stage.add_metric([name, stage_name, quantile], figures[key])
        yield from (fps, frames, dropped, restarts, running, stage)

    def _models(self) -> Any:
        """Which delegate and model each pipeline runs on: labels of a constant 1 (a Prometheus "info")."""
        from prometheus_client.core import InfoMetricFamily

        model_info = InfoMetricFamily(f"{PREFIX}_pipeline", "Delegate and model each pipeline runs on",
                                      labels=["pipeline"])
        for runner in self.agent.runners:
            model = runner.model or {}
            model_info.add_metric([runner.name], {
                "delegate": str(runner.delegate or ""),
                "model": Path(str(model.get("path") or "")).name,
                "version": str(model.get("version") or ""),
                "sha256": str(model.get("sha256") or "")[:12],
            })
        return model_info

    @staticmethod
    def _system(system: dict[str, Any]) -> Iterator[Any]:
        from prometheus_client.core import GaugeMetricFamily

        for key, help_text in (("cpu_percent", "Machine CPU use, % of all cores"),
                               ("process_cpu_percent", "Agent process CPU use, % of one core"),
                               ("rss_bytes", "Agent resident memory, bytes"),
                               ("mem_available_bytes", "Machine memory available, bytes")):
            if system.get(key) is not None:
                yield GaugeMetricFamily(f"{PREFIX}_{key}", help_text, value=system[key])
        temperature = GaugeMetricFamily(f"{PREFIX}_temperature_celsius", "Sensor temperature", labels=["sensor"])
        for sensor, value in system.get("temperature_c", {}).items():
            temperature.add_metric([sensor], value)
        yield temperature
        if system.get("throttled") is not None:
            yield GaugeMetricFamily(f"{PREFIX}_throttled", "1 while the device throttles",
                                    value=int(system["throttled"]))

    def _transport(self) -> Iterator[Any]:
        """The spool, the MQTT link and the telemetry sequence."""
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        agent = self.agent
        spool = agent.spool
        if spool is not None and not spool.closed:
            stats = spool.stats()
            yield GaugeMetricFamily(f"{PREFIX}_spool_pending_messages", "Messages not yet acknowledged by the broker",
                                    value=stats.pending)
            yield GaugeMetricFamily(f"{PREFIX}_spool_disk_bytes", "Spool size on disk", value=stats.disk_bytes)
            yield CounterMetricFamily(f"{PREFIX}_spool_dropped_messages", "Messages dropped because the spool was full",
                                      value=stats.dropped)
        link = agent.link
        if link is not None:
            yield GaugeMetricFamily(f"{PREFIX}_mqtt_connected", "1 while connected to the broker",
                                    value=int(link.status.connected))
            yield CounterMetricFamily(f"{PREFIX}_mqtt_connects", "Successful connections", value=link.status.connects)
        yield GaugeMetricFamily(f"{PREFIX}_telemetry_seq", "Last telemetry seq of this boot",
                                value=agent.boot.last("telemetry"))


class MetricsServer:
    """Serves ``/metrics`` over HTTP in a named daemon thread; close() is idempotent."""

    def __init__(self, agent: AgentServices, host: str = "127.0.0.1", port: int = 9108) -> None:
        self.agent = agent
        self.host = host
        self.port = port
        self._server: Any = None
        self._thread: Any = None

    def start(self) -> MetricsServer:
        """Bind and serve (OSError if the address is taken; ImportError without prometheus-client)."""
        from prometheus_client import CollectorRegistry, start_http_server

        registry = CollectorRegistry(auto_describe=False)
        registry.register(_AgentCollector(self.agent))
        self._server, self._thread = start_http_server(self.port, addr=self.host, registry=registry)
        self._thread.name = "edgeinfer-metrics"
        self.port = self._server.server_address[1]
        return self

    def close(self) -> None:
        """Stop serving and join the thread."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
            if self._thread is not None:
                self._thread.join(5)

    def __enter__(self) -> MetricsServer:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def start_metrics(agent: Any, host: str, port: int) -> MetricsServer | None:
    """The agent's ``/metrics`` server, serving; None (and an ``error`` event saying why) when it cannot."""
    import logging

    try:
        server = MetricsServer(agent, host, port).start()
    except (OSError, ImportError) as exc:
        agent.emit(EventKind.ERROR, "error", f"cannot serve /metrics on {host}:{port}: {exc}",
                   data={"reason": "metrics_unavailable"})
        return None
    logging.getLogger(__name__).info("serving /metrics at http://%s:%d/metrics", host, server.port)  # port 0: chosen
    return server

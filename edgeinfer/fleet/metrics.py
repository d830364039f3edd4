"""The fleet manager's own ``/metrics`` (Prometheus text): ingest counters, queue, rollouts, broker.

A custom collector reads the plain counters at scrape time, so the hot path (thousands of
messages a second) pays for no metric locks.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Protocol

from prometheus_client import CollectorRegistry, GCCollector, ProcessCollector, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from ..link.mqtt import MqttLink
from .broker import ManagedMosquitto
from .ingest import Ingest
from .rollout import RolloutDriver


class Sources(Protocol):
    """What the metrics are read from at each scrape: the manager's parts, each None until it runs."""

    @property
    def ingest(self) -> Ingest | None: ...
    @property
    def link(self) -> MqttLink | None: ...
    @property
    def rollouts(self) -> RolloutDriver | None: ...
    @property
    def broker(self) -> ManagedMosquitto | None: ...


class FleetCollector:
    """The manager's own figures, read from ``sources`` when scraped."""

    def __init__(self, sources: Sources) -> None:
        self.sources = sources

    def collect(self) -> Iterator[Metric]:
        ingest = self.sources.ingest
        if ingest is not None:
            stats = ingest.stats
            received = CounterMetricFamily("edgeinfer_fleet_messages_received",
                                           "MQTT messages handed to ingest", labels=["kind"])
            stored = CounterMetricFamily("edgeinfer_fleet_messages_stored",
                                         "messages stored in the database", labels=["kind"])
            for kind, count in stats.received.items():
                received.add_metric([kind], count)
            for kind, count in stats.stored.items():
                stored.add_metric([kind], count)
            yield received
            yield stored
            yield CounterMetricFamily("edgeinfer_fleet_messages_duplicate",
                                      "telemetry already stored (QoS 1 redeliveries)", value=stats.duplicates)
            yield CounterMetricFamily("edgeinfer_fleet_messages_invalid",
                                      "malformed messages, not stored", value=stats.invalid)
            yield CounterMetricFamily("edgeinfer_fleet_ingest_batches", "database batches written",
                                      value=stats.batches)
            yield CounterMetricFamily("edgeinfer_fleet_ingest_write_errors",
                                      "failed database batches (retried, never acknowledged)",
                                      value=stats.write_errors)
            yield CounterMetricFamily("edgeinfer_fleet_ingest_blocked_seconds",
                                      "time the MQTT thread waited for room in the ingest queue "
                                      "(back-pressure: the broker holds the rest)", value=stats.blocked_s)
            yield GaugeMetricFamily("edgeinfer_fleet_ingest_queue_depth", "messages waiting for the writer",
                                    value=ingest.depth)
            yield GaugeMetricFamily("edgeinfer_fleet_ingest_queue_capacity", "the ingest queue's bound",
                                    value=ingest.queue_size)
        link = self.sources.link
        if link is not None:
            yield GaugeMetricFamily("edgeinfer_fleet_mqtt_connected", "1 while connected to the broker",
                                    value=1.0 if link.status.connected else 0.0)
        driver = self.sources.rollouts
        if driver is not None:
            yield GaugeMetricFamily("edgeinfer_fleet_rollouts_driven", "rollouts this process drives now",
                                    value=len(driver.held))
            yield CounterMetricFamily("edgeinfer_fleet_rollout_takeovers",
                                      "rollouts taken over from a manager whose lease ran out",
                                      value=driver.takeovers)
        broker = self.sources.broker
        if broker is not None:
            yield CounterMetricFamily("edgeinfer_fleet_broker_restarts",
                                      "times the managed Mosquitto was restarted after it died",
                                      value=broker.restarts)


class FleetMetrics:
    """``/metrics``: the manager's figures, the process's CPU and memory and the garbage collector's work
    (python_gc_*: what an operator watches after ``fleet serve`` has tuned the collector,
    fleet/ingest.py ``tune_garbage_collector``)."""

    def __init__(self, sources: Sources | None) -> None:
        """``sources``: the manager (None: the process's figures only)."""
        self.registry = CollectorRegistry()
        if sources is not None:
            self.registry.register(FleetCollector(sources))
        ProcessCollector(registry=self.registry)
        GCCollector(registry=self.registry)

    def exposition(self) -> bytes:
        """The Prometheus text format."""
        return generate_latest(self.registry)

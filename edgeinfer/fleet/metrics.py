"""The fleet manager's own ``/metrics`` (Prometheus text): ingest counters, queue, rollouts, broker.

A custom collector reads the plain counters at scrape time, so the hot path (thousands of
messages a second) pays for no metric locks.
"""

from __future__ import annotations

from typing import Any

from .._optional import import_optional


def registry_for(manager: Any) -> Any:
    """A CollectorRegistry with the manager's metrics (prometheus_client is imported here, on first use)."""
    prometheus = import_optional("prometheus_client", "fleet", "the fleet manager's /metrics")
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

    class FleetCollector:
        def collect(self):
            stats = manager.ingest.stats if manager.ingest is not None else None
            if stats is not None:
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
                                        value=manager.ingest.depth)
                yield GaugeMetricFamily("edgeinfer_fleet_ingest_queue_capacity", "the ingest queue's bound",
                                        value=manager.ingest.queue_size)
            link = manager.link
            if link is not None:
                yield GaugeMetricFamily("edgeinfer_fleet_mqtt_connected", "1 while connected to the broker",
                                        value=1.0 if link.status.connected else 0.0)
            driver = manager.rollouts
            if driver is not None:
                yield GaugeMetricFamily("edgeinfer_fleet_rollouts_driven", "rollouts this process drives now",
                                        value=len(driver.held))
                yield CounterMetricFamily("edgeinfer_fleet_rollout_takeovers",
                                          "rollouts taken over from a manager whose lease ran out",
                                          value=driver.takeovers)
            broker = manager.broker
            if broker is not None:
                yield CounterMetricFamily("edgeinfer_fleet_broker_restarts",
                                          "times the managed Mosquitto was restarted after it died",
                                          value=broker.restarts)

    registry = prometheus.CollectorRegistry()
    registry.register(FleetCollector())
    # the process's CPU, memory and the garbage collector's work (python_gc_*): what an operator watches
    # after ``fleet serve`` has tuned the collector (fleet/ingest.py, tune_garbage_collector)
    prometheus.ProcessCollector(registry=registry)
    prometheus.GCCollector(registry=registry)
    return registry


def exposition(registry: Any) -> bytes:
    from prometheus_client import generate_latest

    return generate_latest(registry)

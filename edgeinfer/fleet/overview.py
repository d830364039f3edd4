"""The fleet at a glance (the dashboard's first page, ``GET /api/overview``): computed from the device
rows and the newest events, so every manager of a shared database answers the same."""

from __future__ import annotations

import time
from collections import Counter
from typing import Any

#: a device whose hottest sensor is at least this warm is "hot" (most SoCs throttle from 80-85 °C)
HOT_C = 80.0
#: a spool with this many telemetry windows waiting is "backlogged" (the link is not keeping up)
BACKLOG_WINDOWS = 10
#: an online device silent for this many of its telemetry intervals (and at least SILENT_MIN_S) is "silent"
SILENT_INTERVALS = 3
SILENT_MIN_S = 30.0
#: how many events the overview lists
EVENTS_SHOWN = 20


def device_summary(device: dict) -> dict[str, Any]:
    """The figures a device row shows: fps summed and worst p95 latency over pipelines, CPU, hottest
    sensor, RSS, spool backlog, whether it throttles, runs degraded (a pipeline not running or on a
    fallback delegate), and the fallbacks with their reasons."""
    telemetry = device.get("last_telemetry") or {}
    system = telemetry.get("system") or {}
    pipelines = telemetry.get("pipelines") or []
    p95s = [((p.get("stages") or {}).get("latency") or {}).get("p95") for p in pipelines]
    temperatures = [float(v) for v in (system.get("temperature_c") or {}).values() if isinstance(v, (int, float))]
    state = device.get("state") or {}
    fallbacks = [{"device_id": device["device_id"], "pipeline": p.get("name"), "delegate": p.get("delegate"),
                  "reason": p.get("fallback_reason")} for p in state.get("pipelines") or [] if p.get("fallback_reason")]
    not_running = any(p.get("status") not in ("running", "starting") for p in state.get("pipelines") or [])
    return {
        "fps": round(sum(float(p.get("fps") or 0) for p in pipelines), 3),
        "latency_p95_ms": max((float(v) for v in p95s if isinstance(v, (int, float))), default=None),
        "cpu_percent": system.get("cpu_percent"),
        "temperature_c": max(temperatures, default=None),
        "rss_bytes": system.get("rss_bytes"),
        "spool_pending": (telemetry.get("spool") or {}).get("pending"),
        "throttled": bool(system.get("throttled")),
        "interval_s": telemetry.get("interval_s"),
        "fallbacks": fallbacks,
        "degraded": bool(device.get("online")) and (bool(fallbacks) or not_running),
    }


def overview(devices: list[dict], events: list[dict], *, now: float | None = None) -> dict[str, Any]:
    """``devices``: rows as ``FleetDB.list_devices`` gives them; ``events``: the newest, any order."""
    now = time.time() if now is None else now
    summaries = {d["device_id"]: device_summary(d) for d in devices}
    online = [d for d in devices if d.get("online")]
    lists: dict[str, list[str]] = {"throttling": [], "hot": [], "backlogged": [], "silent": []}
    for device in online:
        summary = summaries[device["device_id"]]
        if summary["throttled"]:
            lists["throttling"].append(device["device_id"])
        if summary["temperature_c"] is not None and summary["temperature_c"] >= HOT_C:
            lists["hot"].append(device["device_id"])
        if (summary["spool_pending"] or 0) >= BACKLOG_WINDOWS:
            lists["backlogged"].append(device["device_id"])
        quiet_after = max(SILENT_MIN_S, SILENT_INTERVALS * float(summary["interval_s"] or 0))
        if now - float(device.get("last_seen") or now) > quiet_after:
            lists["silent"].append(device["device_id"])
    versions = Counter(f"{d.get('model_name') or '?'} v{d.get('model_version')}" for d in online
                       if d.get("model_version") is not None)
    delegates = Counter(d.get("delegate") for d in online if d.get("delegate"))
    newest = sorted(events, key=lambda e: float(e.get("ts") or 0), reverse=True)[:EVENTS_SHOWN]
    return {
        "devices": {"total": len(devices), "online": len(online), "offline": len(devices) - len(online),
                    "degraded": sum(summaries[d["device_id"]]["degraded"] for d in online)},
        "versions": dict(versions.most_common()), "delegates": dict(delegates.most_common()),
        "fallbacks": [f for d in online for f in summaries[d["device_id"]]["fallbacks"]],
        **lists, "events": newest,
    }

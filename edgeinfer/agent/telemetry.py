"""Telemetry: per-boot sequence numbers, system probes, and the windowed telemetry message.

- :class:`BootSequence` — a ``boot_id`` (uuid4, new at every agent start) and per-stream counters
  that start at 1 and increase by one per message, so a reader sees gaps and duplicates.
- :class:`SystemProbe` — CPU % (machine and process), RSS, available memory, temperatures from the
  thermal zones a device profile names, and throttling flags. Hardware sensors are read under an
  injectable ``root`` (tests use a fake sysfs tree); nothing is probed at import time.
- :func:`pipeline_entry` / :func:`telemetry_message` — one window's message, built from
  ``Pipeline.take_window()`` stats (fps, per-stage p50/p95/p99, drops) and the probes.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..link.protocol import MAX_COUNTERS, MAX_LABEL_CHARS, MAX_OUTPUT_LABELS, MAX_STREAMS, PROTOCOL_VERSION, Topics
from ..pipeline.stats import PERCENTILES

log = logging.getLogger(__name__)

#: Raspberry Pi firmware: bits 0-3 say "now" (under-voltage, frequency capped, throttled, soft limit)
PI_THROTTLE_NOW_MASK = 0xF


class BootSequence:
    """``boot_id`` for this agent start and thread-safe per-stream sequence numbers from 1."""

    def __init__(self, boot_id: str | None = None) -> None:
        self.boot_id = boot_id or uuid.uuid4().hex
        self.started = time.time()
        self._counters: dict[str, int] = {}
        self._lock = threading.Lock()

    def next(self, stream: str) -> int:
        """The next seq of ``stream`` (``telemetry``, ``events``): 1, 2, 3, ..."""
        with self._lock:
            value = self._counters.get(stream, 0) + 1
            self._counters[stream] = value
            return value

    def last(self, stream: str) -> int:
        """The last seq handed out for ``stream`` (0 if none)."""
        with self._lock:
            return self._counters.get(stream, 0)


@dataclass(frozen=True, kw_only=True)
class ThrottleSensor:
    """A file whose integer value says whether the device is throttling (``value & mask != 0``)."""

    path: str
    base: int = 0          # int(text, base): 0 = decimal or 0x-prefixed hex; 16 for the Pi's get_throttled
    mask: int = -1         # every bit by default
    name: str = ""

    @property
    def label(self) -> str:
        return self.name or Path(self.path).name


def default_throttle_sensors(root: str | os.PathLike[str] = "/") -> tuple[ThrottleSensor, ...]:
    """Throttling sensors this device has when the config names none (the Raspberry Pi firmware's file)."""
    pi = "/sys/devices/platform/soc/soc:firmware/get_throttled"
    return (throttle_sensor(pi),) if (Path(root) / pi.lstrip("/")).is_file() else ()


def throttle_sensor(path: str, *, base: int | None = None, mask: int | None = None, name: str = "") -> ThrottleSensor:
    """A ThrottleSensor with the right defaults for known files (the Pi's ``get_throttled`` is hex, bits 0-3)."""
    if path.endswith("get_throttled"):
        return ThrottleSensor(path=path, base=16 if base is None else base,
                              mask=PI_THROTTLE_NOW_MASK if mask is None else mask, name=name)
    return ThrottleSensor(path=path, base=0 if base is None else base, mask=-1 if mask is None else mask, name=name)


@dataclass
class _CpuMark:
    wall: float
    process: float
    busy: int | None
    total: int | None


@dataclass(kw_only=True)
class SystemProbe:
    """Reads system figures; each ``sample()`` reports CPU use since the previous one."""

    root: str | os.PathLike[str] = "/"
    thermal_zones: Sequence[str] = ()
    throttle: Sequence[ThrottleSensor] = ()
    #: an :class:`edgeinfer.device.profiles.Profile`: its ``telemetry.thermal_zones`` (labelled) and
    #: ``power_rails`` are read too
    profile: Any = None
    proc: str | os.PathLike[str] = "/proc"
    _mark: _CpuMark | None = field(default=None, init=False, repr=False)
    _zone_paths: dict[str, Path] | None = field(default=None, init=False, repr=False)
    _warned: set[str] = field(default_factory=set, init=False, repr=False)

    def _under_root(self, path: str) -> Path:
        return Path(self.root) / path.lstrip("/")

    def _resolve_zones(self) -> dict[str, Path]:
        """Map each named zone (thermal zone ``type``, ``thermal_zoneN``, or a file path) to its temp file."""
        if self._zone_paths is not None:
            return self._zone_paths
        by_type: dict[str, Path] = {}
        base = self._under_root("/sys/class/thermal")
        if base.is_dir():
            for zone in sorted(base.glob("thermal_zone*")):
                try:
                    kind = (zone / "type").read_text().strip()
                except OSError:
                    kind = ""
                by_type.setdefault(kind, zone / "temp")
                by_type.setdefault(zone.name, zone / "temp")
        found: dict[str, Path] = {}
        for name in self.thermal_zones:
            if name.startswith("/"):  # a file such as /sys/class/hwmon/hwmon0/temp1_input
                found[name] = self._under_root(name)
            elif name in by_type:
                found[name] = by_type[name]
            elif name not in self._warned:
                self._warned.add(name)
                log.warning("thermal zone %r not found under %s (have: %s)", name, base,
                            ", ".join(sorted(k for k in by_type if not k.startswith("thermal_zone"))) or "none")
        self._zone_paths = found
        return found

    def temperatures(self) -> dict[str, float]:
        """Degrees C per zone that could be read: the profile's (by its labels), then the configured ones."""
        out: dict[str, float] = {}
        if self.profile is not None:
            from ..device.sensors import read_temperatures

            out.update({label: round(value, 2) for label, value in read_temperatures(self.profile, self.root).items()})
        for name, path in self._resolve_zones().items():
            try:
                raw = float(path.read_text().strip())
            except (OSError, ValueError):
                continue
            # sysfs thermal zones and hwmon report millidegrees; a few drivers report degrees
            out[name] = round(raw / 1000.0 if abs(raw) >= 200 else raw, 2)
        return out

    def power_mw(self) -> dict[str, float]:
        """Milliwatts per power rail the profile names (Jetson INA3221, ...), where readable."""
        if self.profile is None:
            return {}
        from ..device.sensors import read_power

        return {rail: round(value, 1) for rail, value in read_power(self.profile, self.root).items()}

    def throttling(self) -> tuple[bool | None, dict[str, int]]:
        """(throttled now?, raw value per sensor); (None, {}) when no sensor could be read."""
        flags: dict[str, int] = {}
        throttled = False
        for sensor in self.throttle:
            try:
                value = int(self._under_root(sensor.path).read_text().strip(), sensor.base)
            except (OSError, ValueError):
                if sensor.path not in self._warned:
                    self._warned.add(sensor.path)
                    log.warning("throttle sensor %s cannot be read under %s", sensor.path, self.root)
                continue
            flags[sensor.label] = value
            throttled = throttled or bool(value & sensor.mask)
        return (throttled if flags else None), flags

    def _read_proc(self, name: str) -> str | None:
        try:
            return (Path(self.proc) / name).read_text()
        except OSError:
            return None

    def _cpu_totals(self) -> tuple[int | None, int | None]:
        text = self._read_proc("stat")
        if not text:
            return None, None
        fields = text.split("\n", 1)[0].split()
        if not fields or fields[0] != "cpu":
            return None, None
        values = [int(v) for v in fields[1:]]
        total = sum(values[:8])  # user nice system idle iowait irq softirq steal (guest is inside user)
        idle = values[3] + (values[4] if len(values) > 4 else 0)
        return total - idle, total

    def rss_bytes(self) -> int | None:
        """Resident set size of this process."""
        text = self._read_proc("self/statm")
        if not text:
            return None
        try:
            return int(text.split()[1]) * os.sysconf("SC_PAGE_SIZE")
        except (IndexError, ValueError, OSError):
            return None

    def mem_available_bytes(self) -> int | None:
        """MemAvailable from /proc/meminfo."""
        text = self._read_proc("meminfo") or ""
        for line in text.splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
        return None

    def sample(self) -> dict[str, Any]:
        """The ``system`` section of a telemetry message (CPU figures cover the time since the last call)."""
        times = os.times()
        busy, total = self._cpu_totals()
        mark = _CpuMark(time.monotonic(), times.user + times.system, busy, total)
        cpu = process_cpu = None
        if self._mark is not None:
            wall = mark.wall - self._mark.wall
            if wall > 0:
                process_cpu = round(max(0.0, (mark.process - self._mark.process) / wall * 100), 1)
            if mark.total is not None and self._mark.total is not None and mark.total > self._mark.total:
                cpu = round(max(0.0, (mark.busy - self._mark.busy) / (mark.total - self._mark.total) * 100), 1)
        self._mark = mark
        throttled, flags = self.throttling()
        out: dict[str, Any] = {
            "cpu_percent": cpu,
            "process_cpu_percent": process_cpu,
            "rss_bytes": self.rss_bytes(),
            "mem_available_bytes": self.mem_available_bytes(),
            "temperature_c": self.temperatures(),
            "throttled": throttled,
        }
        if flags:
            out["throttle_flags"] = flags
        power = self.power_mw()
        if power:
            out["power_mw"] = power
        return out


def _stage_figures(stages: Mapping[str, Mapping[str, float]] | None) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = {}
    for stage, figures in (stages or {}).items():
        entry = {}
        for name in PERCENTILES:
            value = figures.get(name)
            if value is not None and value == value:  # drop NaN: JSON has none
                entry[name] = round(float(value), 3)
        if all(k in entry for k in ("p50", "p95", "p99")):
            out[stage] = entry
    return out


def pipeline_entry(name: str, status: str, stats: Any | None, *, delegate: str | None = None,
                   restarts: int = 0, streams: Sequence[str] = ()) -> dict[str, Any]:
    """One pipeline's part of a telemetry window, from a PipelineStats (or None when it is not running).

    A pipeline with several sources names its ``streams`` (config order): the entry then carries a
    ``streams`` list, from the window's per-stream stats (``stats.streams``), a zero entry for each
    stream that has none (not running), each with its status (``stats.stream_status``; between runs,
    the pipeline's ``status``).
    """
    if stats is None:
        entry: dict[str, Any] = {"name": name, "status": status, "delegate": delegate, "frames": 0, "dropped": 0,
                                 "fps": 0.0, "restarts": restarts, "stages": {}}
    else:
        entry = {
            "name": name,
            "status": status,
            "delegate": getattr(stats, "delegate", None) or delegate,
            "frames": int(stats.frames),
            "dropped": int(stats.dropped),
            "fps": _fps(stats),
            "restarts": restarts,
            "stages": _stage_figures(getattr(stats, "stages", None)),
            "degraded": bool(getattr(stats, "degraded", False)),
            "delegate_wanted": getattr(stats, "delegate_wanted", None),
        }
        outputs = output_summary(getattr(stats, "outputs", None))
        if outputs is not None:
            entry["outputs"] = outputs
        analytics = analytics_summary(getattr(stats, "analytics", None))
        if analytics is not None:
            entry["analytics"] = analytics
    if streams:
        windows = getattr(stats, "streams", None) or {}
        states = getattr(stats, "stream_status", None) or {}
        entry["streams"] = [stream_entry(stream, windows.get(stream), states.get(stream, status))
                            for stream in list(streams)[:MAX_STREAMS]]
    return entry


def stream_entry(name: str, stats: Any | None, status: str) -> dict[str, Any]:
    """One stream's part of its pipeline's entry: frames, drops, fps, reused frames, its analytics."""
    if stats is None:
        return {"name": name, "status": status, "frames": 0, "dropped": 0, "fps": 0.0, "reused": 0}
    entry = {"name": name, "status": status, "frames": int(stats.frames), "dropped": int(stats.dropped),
             "fps": _fps(stats), "reused": int(getattr(stats, "reused", 0) or 0)}
    analytics = analytics_summary(getattr(stats, "analytics", None))
    if analytics is not None:
        entry["analytics"] = analytics
    return entry


def _fps(stats: Any) -> float:
    fps = float(getattr(stats, "fps", 0.0) or 0.0)
    return round(fps, 3) if fps == fps else 0.0


def analytics_summary(counts: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """StreamAnalytics.counts() as the protocol carries it: lines and zones as lists of at most MAX_COUNTERS
    named entries (per-track dwell times stay on the device)."""
    if not counts:
        return None
    tracks = counts.get("tracks") or {}
    lines = [{"name": str(name)[:64], "in": int(c.get("in", 0)), "out": int(c.get("out", 0))}
             for name, c in (counts.get("lines") or {}).items()][:MAX_COUNTERS]
    zones = [{"name": str(name)[:64], "inside": int(c.get("inside", 0)), "entries": int(c.get("entries", 0)),
              "mean_visit_s": c.get("mean_visit_s")} for name, c in (counts.get("zones") or {}).items()][:MAX_COUNTERS]
    return {"tracks": {"confirmed": int(tracks.get("confirmed", 0)), "active": int(tracks.get("active", 0))},
            "lines": lines, "zones": zones}


def output_summary(outputs: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """A window's output summary (``PipelineStats.outputs``) as the protocol carries it: ``top`` as at most
    MAX_OUTPUT_LABELS ``{label, count}`` pairs, most frequent first, labels cut to MAX_LABEL_CHARS."""
    if not outputs or not outputs.get("frames"):
        return None
    top = sorted(((str(label)[:MAX_LABEL_CHARS], int(count)) for label, count in (outputs.get("top") or {}).items()
                  if int(count) > 0), key=lambda item: -item[1])[:MAX_OUTPUT_LABELS]
    score = outputs.get("score_mean")
    score = round(float(score), 6) if score is not None and float(score) == float(score) \
        and abs(float(score)) != float("inf") else None
    return {"frames": int(outputs["frames"]), "top": [{"label": label, "count": count} for label, count in top],
            "detections": int(outputs.get("detections") or 0), "score_mean": score}


#: modules whose presence in ``sys.modules`` says which runtimes and heavy libraries the process has loaded
FOOTPRINT_MODULES = ("ai_edge_litert", "tflite_runtime", "onnxruntime", "openvino", "tensorrt", "cv2", "av",
                     "cryptography", "numpy", "scipy", "trackers", "PIL", "sqlalchemy")


def process_age_s(proc: str | os.PathLike[str] = "/proc") -> float | None:
    """Seconds since this process was started (exec), from the kernel's own clock; None off Linux."""
    try:
        uptime = float(Path(proc, "uptime").read_text().split()[0])
        stat = Path(proc, "self", "stat").read_text()
        start_ticks = int(stat[stat.rindex(")") + 2:].split()[19])  # field 22, after the command name
        return max(uptime - start_ticks / os.sysconf("SC_CLK_TCK"), 0.0)
    except (OSError, ValueError, IndexError):
        return None


def footprint_section(runners: Any, system: Mapping[str, Any]) -> dict[str, Any]:
    """The ``footprint`` section: RSS now (the same window's ``system`` sample's, read before the peak is:
    the peak is never below it) and at its peak, the runtimes loaded, and how long after the process
    started the first result of any pipeline came (its cold start)."""
    import sys

    peak = None
    with contextlib.suppress(OSError, ValueError, IndexError):
        status = Path("/proc/self/status").read_text()
        peak = int(status.split("VmHWM:")[1].split()[0]) * 1024
    firsts = [r.first_result_s for r in runners if getattr(r, "first_result_s", None) is not None]
    return {"rss_bytes": system.get("rss_bytes"), "peak_rss_bytes": peak,
            "runtimes": [name for name in FOOTPRINT_MODULES if name in sys.modules],
            "first_result_s": round(min(firsts), 3) if firsts else None}


def telemetry_message(topics: Topics, boot: BootSequence, *, interval_s: float, pipelines: list[dict[str, Any]],
                      system: dict[str, Any], spool: dict[str, Any], mqtt: dict[str, Any] | None = None,
                      ts: float | None = None, footprint: dict[str, Any] | None = None) -> dict[str, Any]:
    """A complete telemetry message; takes the next ``seq`` of the boot."""
    message = {
        "v": PROTOCOL_VERSION,
        "type": "telemetry",
        "fleet": topics.fleet,
        "device": topics.device,
        "ts": round(time.time() if ts is None else ts, 3),
        "boot_id": boot.boot_id,
        "seq": boot.next("telemetry"),
        "interval_s": round(interval_s, 3),
        "pipelines": pipelines,
        "system": system,
        "spool": spool,
    }
    if mqtt is not None:
        message["mqtt"] = mqtt
    if footprint is not None:
        message["footprint"] = footprint
    return message


def event_message(topics: Topics, boot: BootSequence, event: str, level: str, message: str, *,
                  pipeline: str | None = None, cmd_id: str | None = None,
                  data: dict[str, Any] | None = None) -> dict[str, Any]:
    """A complete ``events`` message; takes the next events ``seq`` of the boot."""
    return {"v": PROTOCOL_VERSION, "type": "event", "fleet": topics.fleet, "device": topics.device,
            "ts": round(time.time(), 3), "boot_id": boot.boot_id, "seq": boot.next("events"), "event": event,
            "level": level, "message": message, "pipeline": pipeline, "cmd_id": cmd_id, "data": dict(data or {})}


def spool_section(spool: Any, write_errors: int) -> dict[str, Any]:
    """Telemetry's ``spool``: what waits, what was dropped (cumulative), the writes that failed."""
    stats = spool.stats() if spool is not None else None
    if not stats:
        return {"pending": 0, "dropped": 0}
    return {"pending": stats.pending, "bytes": stats.bytes, "dropped": stats.dropped,
            "dropped_events": stats.dropped_events, "rejected": stats.rejected, "write_errors": write_errors}

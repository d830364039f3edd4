"""Canary analysis: the canary devices' live telemetry judged against a control group's.

Pure functions on telemetry rows (``(device_id, ts, payload)``, the payload as the device sent it):
no database, no clock. :func:`analyse` gives a :class:`Verdict` with every metric's canary value,
control value, change, threshold and whether it passed; the rollout (:mod:`.rollout`) decides when
to call it and what an abort does.

The metrics, over the telemetry windows of one group (one window = one telemetry message of one
device; the deployed pipeline's entry in it):

- **fps** — the median of the windows' fps. Fails when the canary's is lower than the control's
  by more than ``max_fps_drop`` percent.
- **p95 infer latency** — the median of the windows' ``stages.infer.p95`` (ms). Fails when the
  canary's is higher by more than ``max_latency_regression`` percent.
- **pipeline error rate** — the share of windows in which the pipeline was not healthy: its status
  was not ``running``, or its restart count went up since the device's previous window. Fails when
  the canary's exceeds the control's by more than ``max_error_rate`` percentage points.
- **output drift** — the total variation distance (0 = the same, 1 = nothing in common) between the
  groups' label histograms (each window's ``outputs.top`` counts, summed, normalised): top-1
  classes for a classifier, detections by label for a detector. For a detector, also the relative
  change of detections per frame and of the mean detection score. Each fails above
  ``max_output_drift`` (a distance for the histogram, a fraction for the relative changes).

A metric that either group has no figures for (say, agents too old to send ``outputs``) is
reported as not judged and does not fail. Medians, not means: one window of a device that was
busy with something else does not move them.
"""

from __future__ import annotations

import math
import statistics
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any

from ..forms.samples import total_variation  # the one drift measure (the sampling rule uses it too)

DEFAULT_MAX_LATENCY_REGRESSION = 50.0  # percent
DEFAULT_MAX_FPS_DROP = 25.0  # percent
DEFAULT_MAX_OUTPUT_DRIFT = 0.2  # total variation, 0..1 (and the relative change of detector figures)
DEFAULT_MAX_ERROR_RATE = 10.0  # percentage points above the control's
DEFAULT_WINDOW_S = 300.0
DEFAULT_MIN_WINDOWS = 5  # telemetry windows per group, at least
#: control devices read at most (a large fleet's control group is sampled, the same devices every time)
MAX_CONTROL_DEVICES = 100

Row = tuple[str, float, dict]


@dataclass(frozen=True)
class Thresholds:
    """When the canary is worse enough to abort; ``enabled`` False: no analysis at all."""

    enabled: bool = True
    window_s: float = DEFAULT_WINDOW_S
    min_windows: int = DEFAULT_MIN_WINDOWS
    max_latency_regression: float = DEFAULT_MAX_LATENCY_REGRESSION
    max_fps_drop: float = DEFAULT_MAX_FPS_DROP
    max_output_drift: float = DEFAULT_MAX_OUTPUT_DRIFT
    max_error_rate: float = DEFAULT_MAX_ERROR_RATE

    @classmethod
    def from_options(cls, options: dict[str, Any]) -> Thresholds:
        """From a deployment's stored options; a deployment stored without them has no analysis."""
        canary = options.get("canary_analysis")
        if not isinstance(canary, dict) or not canary.get("enabled"):
            return cls(enabled=False)
        names = {f for f in cls.__dataclass_fields__ if f != "enabled"}
        return cls(enabled=True, **{k: (int(v) if k == "min_windows" else float(v)) for k, v in canary.items()
                                    if k in names and v is not None})

    def to_options(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Metric:
    """One metric's verdict. ``change``: percent for fps and latency, points for the error rate, a distance
    or a fraction for output drift; ``judged`` False when a group had no figures for it."""

    name: str
    label: str
    unit: str
    canary: float | None
    control: float | None
    change: float | None
    threshold: float
    option: str
    judged: bool
    passed: bool
    message: str


@dataclass(frozen=True)
class Verdict:
    """The analysis of one canary wave: passed, or which metrics failed and by how much."""

    passed: bool
    baseline: str  # "control": devices still on the old version; "before": the canary's own earlier telemetry
    canary_devices: int
    control_devices: int
    canary_windows: int
    control_windows: int
    window: tuple[float, float]
    metrics: tuple[Metric, ...] = ()
    note: str | None = None

    @property
    def failed(self) -> list[Metric]:
        return [m for m in self.metrics if not m.passed]

    @property
    def summary(self) -> str:
        """One line: the failed metrics, or that it passed."""
        if self.failed:
            return "canary analysis failed: " + "; ".join(m.message for m in self.failed)
        judged = [m.label for m in self.metrics if m.judged]
        return (f"canary analysis passed ({', '.join(judged) or 'nothing to judge'}; "
                f"{self.canary_windows} canary and {self.control_windows} {self.baseline} windows)")

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["window"] = [round(self.window[0], 3), round(self.window[1], 3)]
        out["metrics"] = [asdict(m) for m in self.metrics]
        out["summary"] = self.summary
        return out


@dataclass
class GroupFigures:
    """What one group's windows add up to."""

    devices: set[str] = field(default_factory=set)
    windows: int = 0
    fps: list[float] = field(default_factory=list)
    infer_p95: list[float] = field(default_factory=list)
    unhealthy: int = 0
    labels: Counter = field(default_factory=Counter)
    frames: int = 0
    detections: int = 0
    detector: bool = False
    score_sum: float = 0.0
    score_weight: float = 0.0

    @property
    def error_rate(self) -> float | None:
        return self.unhealthy / self.windows if self.windows else None

    @property
    def detections_per_frame(self) -> float | None:
        return self.detections / self.frames if self.frames else None

    @property
    def score_mean(self) -> float | None:
        return self.score_sum / self.score_weight if self.score_weight else None


def pipeline_of(payload: dict, name: str | None) -> dict | None:
    """The deployed pipeline's entry of a telemetry payload (``name``, or the first)."""
    pipelines = payload.get("pipelines") if isinstance(payload, dict) else None
    if not isinstance(pipelines, list) or not pipelines:
        return None
    if name:
        return next((p for p in pipelines if isinstance(p, dict) and p.get("name") == name), None)
    return pipelines[0] if isinstance(pipelines[0], dict) else None


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return float(value)


def figures(rows: list[Row], pipeline: str | None = None) -> GroupFigures:
    """Add up a group's telemetry rows (any order; each device's restarts are compared in time order)."""
    group = GroupFigures()
    last_restarts: dict[str, int] = {}
    for device, _ts, payload in sorted(rows, key=lambda r: (r[0], r[1])):
        entry = pipeline_of(payload, pipeline)
        if entry is None:
            continue
        group.devices.add(device)
        group.windows += 1
        restarts = entry.get("restarts")
        restarted = (isinstance(restarts, int) and device in last_restarts and restarts > last_restarts[device])
        if isinstance(restarts, int):
            last_restarts[device] = restarts
        if entry.get("status") != "running" or restarted:
            group.unhealthy += 1
            continue  # a window of a pipeline that is not running says nothing of its speed or answers
        if (fps := _number(entry.get("fps"))) is not None:
            group.fps.append(fps)
        infer = ((entry.get("stages") or {}).get("infer") or {}) if isinstance(entry.get("stages"), dict) else {}
        if isinstance(infer, dict) and (p95 := _number(infer.get("p95"))) is not None:
            group.infer_p95.append(p95)
        _add_outputs(group, entry.get("outputs"))
    return group


def _add_outputs(group: GroupFigures, outputs: Any) -> None:
    if not isinstance(outputs, dict):
        return
    frames = outputs.get("frames")
    if not isinstance(frames, int) or isinstance(frames, bool) or frames <= 0:
        return
    group.frames += frames
    top = outputs.get("top")
    for item in top if isinstance(top, list) else ():
        if isinstance(item, dict) and isinstance(item.get("label"), str) and isinstance(item.get("count"), int):
            group.labels[item["label"]] += max(0, item["count"])
    detections = outputs.get("detections")
    if isinstance(detections, int) and not isinstance(detections, bool) and detections > 0:
        group.detector = True
        group.detections += detections
    score = _number(outputs.get("score_mean"))
    if score is not None:
        weight = detections if isinstance(detections, int) and detections > 0 else frames
        group.score_sum += score * weight
        group.score_weight += weight


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def _relative(canary: float | None, control: float | None) -> float | None:
    if canary is None or control is None:
        return None
    if control == 0:
        return 0.0 if canary == 0 else math.inf
    return (canary - control) / abs(control)


def _fmt(value: float | None, unit: str) -> str:
    if value is None:
        return "-"
    return f"{value:.3g}" + (f" {unit}" if unit else "")


def _pct(change: float) -> str:
    return "+inf%" if math.isinf(change) else f"{change:+.0f}%"


def analyse(canary_rows: list[Row], control_rows: list[Row], thresholds: Thresholds, *, baseline: str = "control",
            pipeline: str | None = None, window: tuple[float, float] = (0.0, 0.0)) -> Verdict:
    """Judge the canary's rows against the control's (or the canary's own rows from before the update)."""
    canary, control = figures(canary_rows, pipeline), figures(control_rows, pipeline)
    other = "control" if baseline == "control" else "before"
    metrics: list[Metric] = []

    def add(name: str, label: str, unit: str, c: float | None, k: float | None, change: float | None,
            threshold: float, option: str, fails: bool, shown_change: str, shown_threshold: str,
            compared: str | None = None) -> None:
        judged = change is not None
        passed = not (judged and fails)
        relation = ">" if not passed else "≤"
        compared = compared or f"canary {_fmt(c, unit)}, {other} {_fmt(k, unit)}"
        message = (f"{label} {shown_change} ({compared}) {relation} --{option} {shown_threshold}" if judged
                   else f"{label}: no figures to compare")
        metrics.append(Metric(name, label, unit, c, k, None if change is None or math.isinf(change) else change,
                              threshold, option, judged, passed, message))

    c, k = _median(canary.infer_p95), _median(control.infer_p95)
    change = _relative(c, k)
    pct = None if change is None else change * 100
    add("latency", "p95 infer latency", "ms", c, k, pct, thresholds.max_latency_regression,
        "max-latency-regression", pct is not None and pct > thresholds.max_latency_regression,
        _pct(pct) if pct is not None else "", f"{thresholds.max_latency_regression:g}%")

    c, k = _median(canary.fps), _median(control.fps)
    change = _relative(c, k)
    drop = None if change is None else -change * 100
    add("fps", "fps", "", c, k, drop, thresholds.max_fps_drop, "max-fps-drop",
        drop is not None and drop > thresholds.max_fps_drop,
        f"dropped {drop:.0f}%" if drop is not None and not math.isinf(drop) else "", f"{thresholds.max_fps_drop:g}%")

    c, k = canary.error_rate, control.error_rate
    points = None if c is None or k is None else (c - k) * 100
    add("error_rate", "pipeline error rate", "", c, k, points, thresholds.max_error_rate, "max-error-rate",
        points is not None and points > thresholds.max_error_rate,
        f"{points:+.0f} points" if points is not None else "", f"{thresholds.max_error_rate:g} points")

    distance = total_variation(canary.labels, control.labels)
    add("output_drift", "output drift", "", distance, None if distance is None else 0.0, distance,
        thresholds.max_output_drift, "max-output-drift",
        distance is not None and distance > thresholds.max_output_drift,
        f"{distance:.2f}" if distance is not None else "", f"{thresholds.max_output_drift:g}",
        f"total variation between the class histograms of the canary and the "
        f"{'control group' if baseline == 'control' else 'canary before the update'}, {canary.frames} and "
        f"{control.frames} frames")

    if canary.detector or control.detector:
        for name, label, c, k in (("detections", "detections per frame", canary.detections_per_frame,
                                   control.detections_per_frame),
                                  ("confidence", "mean detection score", canary.score_mean, control.score_mean)):
            change = _relative(c, k)
            add(name, label, "", c, k, change, thresholds.max_output_drift, "max-output-drift",
                change is not None and abs(change) > thresholds.max_output_drift,
                _pct(change * 100) if change is not None else "", f"{thresholds.max_output_drift:g}")

    failed = any(not m.passed for m in metrics)
    return Verdict(passed=not failed, baseline=baseline, canary_devices=len(canary.devices),
                   control_devices=len(control.devices), canary_windows=canary.windows,
                   control_windows=control.windows, window=window, metrics=tuple(metrics))


def insufficient(canary_windows: int, control_windows: int, thresholds: Thresholds) -> bool:
    """Whether either group has fewer windows than the analysis needs."""
    return min(canary_windows, control_windows) < thresholds.min_windows


def count_windows(rows: list[Row], pipeline: str | None = None) -> int:
    return sum(pipeline_of(payload, pipeline) is not None for _d, _t, payload in rows)


def sample_control(devices: list[str], limit: int = MAX_CONTROL_DEVICES) -> list[str]:
    """At most ``limit`` of ``devices``, spread over the sorted list (the same ones every call)."""
    ordered = sorted(devices)
    if len(ordered) <= limit:
        return ordered
    step = len(ordered) / limit
    return [ordered[int(i * step)] for i in range(limit)]


def too_little_telemetry(verdict: Verdict, windows: int, thresholds: Thresholds) -> Verdict:
    """``verdict`` failed because the canary sent fewer windows than the minimum (a model that stopped its
    pipeline, or its agent, sends little or nothing)."""
    metric = Metric("telemetry", "canary telemetry", "windows", float(windows), None, float(windows),
                    float(thresholds.min_windows), "canary-min-windows", True, False,
                    f"canary telemetry: {windows} window(s) in {verdict.window[1] - verdict.window[0]:.0f} s "
                    f"< the minimum of {thresholds.min_windows}")
    return Verdict(**{**{f: getattr(verdict, f) for f in verdict.__dataclass_fields__},
                      "passed": False, "metrics": (metric, *verdict.metrics)})

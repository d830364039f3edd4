"""What every command that starts a rollout shares (``edgeinfer deploy``, ``edgeinfer fleet config set|edit|rollback|
apply``): its options — waves, canary, abort rate, device timeout, the canary analysis's thresholds — and following it
to its end, printing each change of its devices' states and the canary's verdict."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import click

from ..fleet.canary import (
    DEFAULT_MAX_ERROR_RATE,
    DEFAULT_MAX_FPS_DROP,
    DEFAULT_MAX_LATENCY_REGRESSION,
    DEFAULT_MAX_OUTPUT_DRIFT,
)
from ..fleet.rollout import DEFAULT_CANARY_PCT, DEFAULT_DEVICE_TIMEOUT_S
from ..link.vocabulary import TargetState
from .fleet_access import duration
from .output import print_json

#: the rollout options' parameters, as :func:`rollout_options` hands them to the command
NAMES = ("canary_pct", "wave_size", "abort_failure_rate", "device_timeout", "canary_window", "max_latency_regression",
         "max_fps_drop", "max_output_drift", "max_error_rate", "no_canary_analysis")


def rollout_options(func: Callable[..., Any]) -> Callable[..., Any]:
    """The options of a rollout (the API's ``RolloutOptions``); the command gets them as :data:`NAMES`."""
    options = [
        click.option("--canary", "canary_pct", default=DEFAULT_CANARY_PCT, show_default=True,
                     type=click.FloatRange(0, 100), help="Percent of the targets in the first wave."),
        click.option("--wave-size", type=click.IntRange(min=1), help="Devices per later wave (default: all the rest)."),
        click.option("--abort-failure-rate", default=0.0, show_default=True, type=click.FloatRange(0, 100),
                     help="Stop the rollout when more than this percent of finished devices failed."),
        click.option("--device-timeout", default=DEFAULT_DEVICE_TIMEOUT_S, show_default=True,
                     help="Seconds a device may take."),
        click.option("--canary-window", default="5m", show_default=True, callback=duration,
                     help="Telemetry watched after the last canary device became active before the canary is "
                          "judged (30s, 5m, 1h or seconds)."),
        click.option("--max-latency-regression", type=click.FloatRange(min=0), default=DEFAULT_MAX_LATENCY_REGRESSION,
                     show_default=True, help="Abort when the canary's p95 infer latency is this many percent above "
                                             "the control group's."),
        click.option("--max-fps-drop", type=click.FloatRange(0, 100), default=DEFAULT_MAX_FPS_DROP,
                     show_default=True, help="Abort when the canary's fps is this many percent below the control "
                                             "group's."),
        click.option("--max-output-drift", type=click.FloatRange(0, 1), default=DEFAULT_MAX_OUTPUT_DRIFT,
                     show_default=True, help="Abort when the canary's class histogram is farther than this total "
                                             "variation distance (0-1) from the control group's (detectors: also the "
                                             "relative change of detections per frame and of the mean score)."),
        click.option("--max-error-rate", type=click.FloatRange(0, 100), default=DEFAULT_MAX_ERROR_RATE,
                     show_default=True, help="Abort when the canary's share of unhealthy telemetry windows is this "
                                             "many percentage points above the control group's."),
        click.option("--no-canary-analysis", is_flag=True, help="Judge the canary by its update results only."),
    ]
    return functools.reduce(lambda wrapped, option: option(wrapped), reversed(options), func)


def rollout_fields(*, canary_pct: float, wave_size: int | None, abort_failure_rate: float, device_timeout: float,
                   canary_window: float, max_latency_regression: float, max_fps_drop: float, max_output_drift: float,
                   max_error_rate: float, no_canary_analysis: bool) -> dict[str, Any]:
    """The options as the API's ``RolloutOptions`` (and ``DeploymentSpec``) name them."""
    return {"canary_pct": canary_pct, "wave_size": wave_size, "abort_failure_pct": abort_failure_rate,
            "device_timeout_s": device_timeout, "canary_analysis": not no_canary_analysis,
            "canary_window_s": canary_window, "max_latency_regression": max_latency_regression,
            "max_fps_drop": max_fps_drop, "max_output_drift": max_output_drift, "max_error_rate": max_error_rate}


def longest_wait(fields: dict[str, Any]) -> float:
    """How long a rollout with these options may take, at most, before the CLI stops following it."""
    return fields["device_timeout_s"] * 10 + (2 * fields["canary_window_s"] if fields["canary_analysis"] else 0)


def analysis_lines(analysis: Any) -> list[str]:
    """The canary verdict as lines: the summary, then one line per metric."""
    if not isinstance(analysis, dict) or "passed" not in analysis:
        return []
    lines = [str(analysis.get("summary") or ("canary analysis passed" if analysis["passed"] else "failed"))]
    for metric in analysis.get("metrics") or []:
        mark = "ok  " if metric.get("passed") else "FAIL"
        lines.append(f"  {mark} {metric.get('message')}" if metric.get("judged") else f"  --   {metric.get('message')}")
    return lines


def follow(client: Any, deployment_id: str, *, timeout_s: float, as_json: bool) -> tuple[dict, bool]:
    """Follow a rollout to its end: each change of its devices' states (stderr), the devices that did not take it
    and the canary's verdict, its status (stdout; ``as_json``: the deployment as JSON instead). (The deployment,
    whether every device took it.)"""
    from ..fleet.client import wait_for_deployment

    def progress(current: dict) -> None:
        if not as_json:
            counts = " ".join(f"{k}={v}" for k, v in sorted(current["counts"].items()))
            click.echo(f"  {current['status']}: {counts}", err=True)

    final = wait_for_deployment(client.deployment, deployment_id, timeout_s=timeout_s, on_progress=progress)
    if as_json:
        print_json(final)
    else:
        for target in final["devices"]:
            if target["state"] != TargetState.ACTIVE:
                click.echo(f"  {target['device_id']}: {target['state']} {target.get('detail') or ''}".rstrip(),
                           err=True)
        for line in analysis_lines(final.get("analysis")):
            click.echo(f"  {line}", err=True)
        click.echo(f"deployment {deployment_id}: {final['status']}" + (f" — {final['detail']}" if final.get("detail")
                                                                       else ""))
    return final, bool(final["devices"]) and all(t["state"] == TargetState.ACTIVE for t in final["devices"])

"""Deployments: a spec from ``edgeinfer deploy`` becomes a signed manifest, waves of targets in the
database, and deploy commands; devices' ``update`` events become forward-only target states."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from ..updates.signing import SigningKey, new_manifest
from .canary import thresholds_from_spec
from .rollout import ALL_STATES, plan_waves

log = logging.getLogger(__name__)

DEFAULT_DEVICE_TIMEOUT_S = 600.0
DEPLOY_COMMAND = "deploy"
UPDATE_EVENT = "update"
COMMAND_PREFIX = "deploy-"
ROLLBACK_COMMAND = "rollback"
ROLLBACK_PREFIX = "canary-rollback-"


def command_id(deployment_id: str) -> str:
    """The deploy command's id: one per deployment, so a re-sent command is the same command."""
    return f"{COMMAND_PREFIX}{deployment_id}"


def resolve_targets(db: Any, spec: dict) -> list[str]:
    """Device ids for --device / --group / --all."""
    if spec.get("devices"):
        known = {d["device_id"] for d in db.list_devices()}
        unknown = [d for d in spec["devices"] if d not in known]
        if unknown:
            raise ValueError(f"unknown device(s): {', '.join(unknown)} — see `edgeinfer fleet devices`")
        return list(dict.fromkeys(spec["devices"]))
    if spec.get("group"):
        return [d["device_id"] for d in db.list_devices(group=spec["group"])]
    if spec.get("all"):
        return [d["device_id"] for d in db.list_devices()]
    raise ValueError("a deployment needs devices, a group or all")


def abort_fraction(spec: dict) -> float:
    """The failure rate that aborts a rollout, as a fraction: ``abort_failure_pct`` (0-100, what the CLI and
    the dashboard send) or ``abort_failure_rate`` (a fraction, 0-1). One meaning per key: "1" was either
    1 % or 100 % when one key took both."""
    if spec.get("abort_failure_pct") is not None:
        percent = float(spec["abort_failure_pct"])
        if not 0 <= percent <= 100:
            raise ValueError(f"abort_failure_pct must be between 0 and 100 (a percent), not {percent:g}")
        return percent / 100
    fraction = float(spec.get("abort_failure_rate") or 0.0)
    if not 0 <= fraction <= 1:
        raise ValueError(f"abort_failure_rate is a fraction between 0 and 1, not {fraction:g} "
                         "(for a percent, send abort_failure_pct)")
    return fraction


def create_deployment(db: Any, key: SigningKey, spec: dict, *, artifact_size: Callable[[str], int | None],
                      public_url: str) -> str:
    """Check ``spec``, sign its manifest and store the deployment with its waves; returns its id.

    ValueError says what is wrong with the spec (the API answers 400 with it).
    """
    sha256 = str(spec.get("sha256", ""))
    size = artifact_size(sha256)
    if size is None:
        raise ValueError(f"no artifact {sha256!r} — upload it first")
    try:
        version = int(spec["version"])
    except (KeyError, TypeError, ValueError):
        raise ValueError("version must be an integer") from None
    devices = resolve_targets(db, spec)
    if not devices:
        raise ValueError("no device matches the target")
    try:
        canary = float(spec.get("canary_pct", 10.0))
        wave_size = int(spec["wave_size"]) if spec.get("wave_size") else None
        options = {"canary_pct": canary, "wave_size": wave_size, "abort_failure_rate": abort_fraction(spec),
                   "device_timeout_s": float(spec.get("device_timeout_s", DEFAULT_DEVICE_TIMEOUT_S)),
                   "pipeline": spec.get("pipeline")}
    except (TypeError, ValueError) as exc:
        raise ValueError(str(exc) if "abort_failure" in str(exc) else "canary_pct, wave_size, abort_failure_pct "
                         "and device_timeout_s must be numbers") from None
    options["canary_analysis"] = thresholds_from_spec(spec).to_options()
    waves = plan_waves(devices, canary_pct=canary, wave_size=wave_size)
    target = ("all" if spec.get("all") else f"group:{spec['group']}" if spec.get("group")
              else "device:" + ",".join(devices))
    manifest = new_manifest(model_name=str(spec.get("model_name") or sha256), version=version, sha256=sha256,
                            size=size, url=f"{public_url}/artifacts/{sha256}", target=target,
                            rollback=bool(spec.get("rollback", False)))
    db.create_deployment(manifest.to_dict(), key.sign(manifest), options, waves)
    return manifest.deployment_id


def deploy_args(deployment: dict) -> dict:
    """The deploy command's arguments, rebuilt from the stored deployment (any manager can send them)."""
    args = {"manifest": deployment["manifest"], "signature": deployment["signature"]}
    pipeline = (deployment.get("options") or {}).get("pipeline")
    if pipeline:
        args["pipeline"] = pipeline
    return args


def rollback_command(deployment: dict, device: str) -> tuple[str, dict, str]:
    """(command, args, id) of the rollback a failed canary analysis sends ``device``: one id per deployment,
    so a command re-sent after a takeover runs once."""
    pipeline = (deployment.get("options") or {}).get("pipeline")
    return ROLLBACK_COMMAND, ({"pipeline": pipeline} if pipeline else {}), \
        f"{ROLLBACK_PREFIX}{deployment['deployment_id']}"


def progress_of(event: dict) -> tuple[str, str, str | None] | None:
    """(deployment id, target state, detail) that a device event reports, or None."""
    data = event.get("data") or {}
    name = event.get("event")
    cmd = str(event.get("cmd_id") or "")
    deployment_id = data.get("deployment_id") or (cmd[len(COMMAND_PREFIX):] if cmd.startswith(COMMAND_PREFIX)
                                                  else None)
    if not deployment_id:
        return None
    if name == UPDATE_EVENT:
        state, detail = data.get("state"), data.get("reason") or event.get("message")
    elif name == "cmd_rejected":
        state, detail = "rejected", data.get("reason") or event.get("message")
    else:
        return None
    if state not in ALL_STATES or state in ("pending", "notified"):
        return None
    return str(deployment_id), str(state), detail


def follow_update(db: Any, device: str, event: dict) -> bool:
    """Record the progress an event reports (forward only); True when a target changed."""
    progress = progress_of(event)
    if progress is None:
        return False
    deployment_id, state, detail = progress
    return bool(db.advance_target(deployment_id, device, state, detail, now=time.time()))


def follow_state(db: Any, running: list[dict], device: str, state: dict) -> bool:
    """A device whose state reports a running deployment's model has it active, whatever became of its
    events (another manager's share of them may wait for that manager to come back)."""
    if not state.get("online"):
        return False
    models = {str((p.get("model") or {}).get("sha256") or "") for p in state.get("pipelines") or []}
    changed = False
    for deployment in running:
        if deployment.get("sha256") in models:
            changed |= bool(db.advance_target(deployment["deployment_id"], device, "active",
                                              "its state reports the new model", now=time.time()))
    return changed


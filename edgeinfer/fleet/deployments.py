"""Deployments: a :class:`~.api.schemas.DeploymentSpec` becomes a signed manifest, waves of targets in the
database and deploy commands; devices' ``update`` events (and their states) become forward-only target
states. :class:`DeploymentService` does it; its :class:`~.rollout.RolloutDriver` drives the waves.

Every kind of deployment (link/vocabulary.py ``DeploymentKind``: a model, an agent bundle) goes through the
same code: the manifest names its kind (a model's leaves it out), the rollout, the canary and the audit do not
look at it; what differs is what a device's ``state`` shows it runs (:func:`running_artifacts`) and what the
canary's rollback names (:func:`rollback_args`)."""

from __future__ import annotations

import logging
import time
from typing import Any, Protocol

from ..link.vocabulary import Command, DeploymentKind, EventKind, TargetState
from ..updates.signing import Manifest, SigningKey, new_manifest
from .api.schemas import DeploymentSpec, RolloutOptions
from .artifacts import ArtifactStore
from .commands import CommandService
from .db import FleetDB
from .rollout import DEFAULT_LEASE_TTL_S, DeploymentStatus, RolloutDriver, plan_waves
from .verdicts import device_words, reason_with_words, refusal_of

log = logging.getLogger(__name__)

#: the deploy command's id is this and the deployment's id (one per deployment: a re-sent command is the same)
COMMAND_PREFIX = "deploy-"
#: the id of the rollback a failed canary analysis sends, likewise
ROLLBACK_PREFIX = "canary-rollback-"
#: a manifest's target as the database keeps it, at most
MAX_TARGET_LABEL = 1024


def command_id(deployment_id: str) -> str:
    """The deploy command's id: one per deployment, so a re-sent command is the same command."""
    return f"{COMMAND_PREFIX}{deployment_id}"


def resolve_targets(db: FleetDB, spec: DeploymentSpec) -> list[str]:
    """Device ids for devices / group / all (the first given wins); LookupError when none is known."""
    if spec.devices:
        known = {d["device_id"] for d in db.list_devices()}
        unknown = [d for d in spec.devices if d not in known]
        if unknown:
            raise LookupError(f"unknown device(s): {', '.join(unknown)} — see `edgeinfer fleet devices`")
        return list(dict.fromkeys(spec.devices))
    found = [d["device_id"] for d in db.list_devices(group=spec.group)] if spec.group or spec.all else []
    if not found:
        raise LookupError("no device matches the target" + ("" if spec.group or spec.all else
                                                            ": a deployment needs devices, a group or all"))
    return found


def target_label(spec: DeploymentSpec, devices: list[str]) -> str:
    """The manifest's ``target``: ``all``, ``group:<g>`` or ``device:<id>,...`` (a long list cut short)."""
    if not spec.devices:
        return f"group:{spec.group}" if spec.group else "all"
    label = "device:" + ",".join(devices)
    if len(label) <= MAX_TARGET_LABEL:
        return label
    shown = label[:MAX_TARGET_LABEL - 32].rpartition(",")[0]
    return f"{shown},... ({len(devices)} devices)"


def deploy_args(deployment: dict) -> dict:
    """The deploy command's arguments, rebuilt from the stored deployment (any manager can send them)."""
    args = {"manifest": deployment["manifest"], "signature": deployment["signature"]}
    pipeline = (deployment.get("options") or {}).get("pipeline")
    if pipeline:
        args["pipeline"] = pipeline
    return args


def kind_of(deployment: dict) -> str:
    """A stored deployment's kind's word (a row from before kinds is a model's; a word this manager does not know,
    from a newer one sharing its database, is passed on as it is)."""
    return str(deployment.get("kind") or DeploymentKind.MODEL.value)


def rollback_args(deployment: dict) -> dict:
    """The arguments of the rollback a failed canary analysis sends: for a model, the deployment's pipeline if it
    named one; for another kind, the kind (an agent goes back to its other environment)."""
    if kind_of(deployment) != DeploymentKind.MODEL:
        return {"kind": kind_of(deployment)}
    pipeline = (deployment.get("options") or {}).get("pipeline")
    return {"pipeline": pipeline} if pipeline else {}


def running_artifacts(state: dict) -> dict[str, set[str]]:
    """What a device's ``state`` says it runs, by kind: its pipelines' models and, once out of its trial, the agent
    bundle it was installed from (sha256s)."""
    models = {str((p.get("model") or {}).get("sha256") or "") for p in state.get("pipelines") or []}
    agent = state.get("agent") if isinstance(state.get("agent"), dict) else {}
    bundle = {str(agent["sha256"])} if agent.get("sha256") and not agent.get("trial") else set()
    return {DeploymentKind.MODEL: models, DeploymentKind.AGENT: bundle}


def progress_of(event: dict) -> tuple[str, TargetState, str | None] | None:
    """(deployment id, target state, detail) that a device event reports, or None."""
    data = event.get("data") or {}
    name = event.get("event")
    cmd = str(event.get("cmd_id") or "")
    deployment_id = data.get("deployment_id") or (cmd[len(COMMAND_PREFIX):] if cmd.startswith(COMMAND_PREFIX)
                                                  else None)
    if not deployment_id:
        return None
    if name == EventKind.UPDATE:
        reported = data.get("state")
        # a failure: its reason code and the device's own words of it; progress: the device's message
        reason = data.get("reason")
        detail = reason_with_words(reason, device_words(reason, data.get("detail"))) if reason else event.get("message")
    elif name == EventKind.CMD_REJECTED:
        reported, detail = TargetState.REJECTED, reason_with_words(*refusal_of(event))
    else:
        return None
    try:
        state = TargetState(reported)
    except ValueError:
        return None
    if state in (TargetState.PENDING, TargetState.NOTIFIED):  # the fleet's own states: not a device's to say
        return None
    return str(deployment_id), state, detail


def follow_update(db: FleetDB, device: str, event: dict) -> bool:
    """Record the progress an event reports (forward only); True when a target changed."""
    progress = progress_of(event)
    if progress is None:
        return False
    deployment_id, state, detail = progress
    return bool(db.advance_target(deployment_id, device, state, detail, now=time.time()))


class PerDevice(Protocol):
    """A kind of deployment whose devices each get an artifact of their own (a configuration: each device's document),
    registered with :meth:`DeploymentService.register_kind`: what a device's deploy command carries and what its
    ``state`` shows when it runs what it was given. Waves, the abort rate, the canary, leases and the audit stay
    the service's."""

    def deploy_args(self, deployment: dict, device: str) -> dict[str, Any]:
        """The deploy command's ``manifest`` and ``signature`` for ``device`` (the service adds the grant)."""

    def runs(self, deployment: dict, device: str, state: dict) -> bool:
        """Whether ``state`` (the device's, online) shows it runs what ``deployment`` gave it."""


def follow_state(db: FleetDB, running: list[dict], device: str, state: dict,
                 kinds: dict[DeploymentKind, PerDevice] | None = None) -> bool:
    """A device whose state reports a running deployment's artifact (of its kind) has it active, whatever became
    of its events (another manager's share of them may wait for that manager to come back)."""
    if not state.get("online"):
        return False
    runs = running_artifacts(state)
    changed = False
    for deployment in running:
        per_device = (kinds or {}).get(kind_of(deployment))
        if (per_device.runs(deployment, device, state) if per_device is not None
                else deployment.get("sha256") in runs.get(kind_of(deployment), ())):
            changed |= bool(db.advance_target(deployment["deployment_id"], device, TargetState.ACTIVE,
                                              "its state reports it runs the deployment", now=time.time()))
    return changed


class DeploymentService:
    """Creates, lists and aborts deployments; follows devices' progress; its driver sends the commands."""

    def __init__(self, db: FleetDB, key: SigningKey, artifacts: ArtifactStore, commands: CommandService, *,
                 public_url: str, owner: str | None = None, lease_ttl_s: float = DEFAULT_LEASE_TTL_S) -> None:
        """``public_url``: how devices reach the artifacts; ``owner``: this manager's name for its leases."""
        self.db = db
        self.key = key
        self.artifacts = artifacts
        self.commands = commands
        self.public_url = public_url
        #: drives every running deployment this manager holds the lease of (started by the manager)
        self.rollouts = RolloutDriver(db, self._send_deploy, owner=owner, lease_ttl_s=lease_ttl_s,
                                      rollback=self._send_rollback)
        self._per_device: dict[DeploymentKind, PerDevice] = {}

    def register_kind(self, kind: DeploymentKind, handler: PerDevice) -> None:
        """Deployments of ``kind`` give each device its own artifact: ``handler`` says which (:class:`PerDevice`)."""
        self._per_device[DeploymentKind(kind)] = handler

    # ------------------------------------------------------------------------------------- reads
    def list(self) -> list[dict]:
        return self.db.list_deployments()

    def get(self, deployment_id: str) -> dict | None:
        return self.db.get_deployment(deployment_id)

    # ----------------------------------------------------------------------------------- changes
    def create(self, spec: DeploymentSpec) -> dict:
        """Sign a manifest for a stored artifact and start rolling it out; the deployment as stored.

        LookupError when the artifact or a named device is unknown, or no device matches the target.
        """
        path = self.artifacts.get(spec.sha256)
        if path is None:
            raise LookupError(f"no artifact {spec.sha256!r} — upload it first")
        devices = resolve_targets(self.db, spec)
        kind = DeploymentKind(spec.kind)
        manifest = new_manifest(model_name=spec.model_name or spec.sha256, version=spec.version, sha256=spec.sha256,
                                size=path.stat().st_size, url=f"{self.public_url}/artifacts/{spec.sha256}",
                                target=target_label(spec, devices), rollback=spec.rollback,
                                kind=None if kind == DeploymentKind.MODEL else kind.value)
        return self.start(manifest, devices, spec, pipeline=spec.pipeline)

    def start(self, manifest: Manifest, devices: list[str], rollout: RolloutOptions, *, pipeline: str | None = None,
              **options: Any) -> dict:
        """Store a deployment of ``manifest`` to ``devices`` in waves as ``rollout`` says, and have the driver start
        it; the deployment as stored. ``options`` are kept with it (a configuration's layer and revision)."""
        waves = plan_waves(devices, canary_pct=rollout.canary_pct, wave_size=rollout.wave_size)
        stored = {"canary_pct": rollout.canary_pct, "wave_size": rollout.wave_size,
                  "abort_failure_rate": rollout.abort_fraction(), "device_timeout_s": rollout.device_timeout_s,
                  "pipeline": pipeline, "canary_analysis": rollout.thresholds().to_options(), **options}
        self.db.create_deployment(manifest.to_dict(), self.key.sign(manifest), stored, waves)
        self.rollouts.poke()
        created = self.db.get_deployment(manifest.deployment_id)
        assert created is not None  # just written
        return created

    def abort(self, deployment_id: str, detail: str) -> dict:
        """Stop a running rollout (no later wave); LookupError when there is none, ValueError when it has ended."""
        found = self.db.get_deployment(deployment_id)
        if found is None:
            raise LookupError(f"no deployment {deployment_id}")
        if not self.db.abort_deployment(deployment_id, detail):
            raise ValueError(f"deployment {deployment_id} is {found['status']}, not {DeploymentStatus.RUNNING}")
        aborted = self.db.get_deployment(deployment_id)
        assert aborted is not None
        return aborted

    # ------------------------------------------------------------------------- devices' progress
    def follow_event(self, device: str, event: dict) -> None:
        """Ingest's ``on_event``: a device's ``update`` (or ``cmd_rejected``) moves its target."""
        if follow_update(self.db, device, event):
            self.rollouts.poke()

    def follow_device_state(self, device: str, state: dict) -> None:
        """Ingest's ``on_state``: a device reporting a running deployment's model has it active."""
        running = self.rollouts.running
        if running and follow_state(self.db, running, device, state, self._per_device):
            self.rollouts.poke()

    # ---------------------------------------------------------------------------- the driver's sends
    def _send_deploy(self, deployment: dict, device: str) -> None:
        per_device = self._per_device.get(kind_of(deployment))
        args = per_device.deploy_args(deployment, device) if per_device is not None else deploy_args(deployment)
        timeout = float((deployment.get("options") or {}).get("device_timeout_s") or 0)
        args["grant"] = self.commands.grant(args["manifest"]["sha256"], device, timeout)
        self.commands.send(device, Command.DEPLOY, args, command_id=command_id(deployment["deployment_id"]))

    def _send_rollback(self, deployment: dict, device: str) -> None:
        self.commands.send(device, Command.ROLLBACK, rollback_args(deployment),
                           command_id=f"{ROLLBACK_PREFIX}{deployment['deployment_id']}")

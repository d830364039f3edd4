"""Configurations applied like models: each device's effective document, signed for it, through the same deployments
as a model (``DeploymentService``: waves, the canary and its analysis, the abort rate, leases, the audit), and where
each device stands — desired vs applied vs refused.

A configuration deployment (kind ``config``) gives each of its devices a document of its own (a device layer, a
source of its own), so :class:`ConfigRollouts` is the service's :class:`~.deployments.PerDevice` for the kind: the
document is an artifact (content-addressed, stored once however many devices share it), and the deploy command's
manifest is signed per device at send time from the stored deployment and that device's target row — the same bytes
whichever manager sends it. The deployment's own ``sha256`` is that of its devices' documents together
(:func:`set_sha256`).

Only devices online are notified; one offline is caught up when it comes back (:meth:`ConfigRollouts.catch_up`,
driven by the devices' ``state`` messages), as is a device that joins a group whose layer was applied before: each
becomes one more configuration deployment of what its layers released, without a canary (the revision was judged
when it went out).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import threading
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from ..link.config_document import check_document, document_problems, encode_document
from ..link.vocabulary import FINISHED_STATES, DeploymentKind, TargetState, Word
from ..updates.signing import Manifest, new_manifest
from .api.schemas import RolloutOptions
from .artifacts import ArtifactStore
from .changes import Loop
from .config_layers import Effective, layers_of, merge
from .db import FleetDB
from .deployments import DeploymentService
from .rollout import DeploymentStatus

log = logging.getLogger(__name__)

#: the states in which a device answered a configuration with its own refusal (not a timeout: it was not there)
REFUSED_STATES = (TargetState.FAILED, TargetState.ROLLED_BACK, TargetState.REJECTED)
#: how a device that comes back is caught up: the revision was judged when it went out, so no canary, and one
#: device's failure stops no one else
CATCH_UP = RolloutOptions(canary_pct=0, canary_analysis=False, abort_failure_pct=100)
#: seconds the catch-up loop gathers devices that came back into one deployment
CATCH_UP_EVERY_S = 1.0


class ConfigStatus(Word):
    """Where a device stands with its configuration: what its layers released (desired) vs what it runs (applied)."""

    #: no layer sets anything for it and the fleet never gave it a document: the fleet leaves what it runs alone (its
    #: agent.yaml, or a document the fleet's layers did not make)
    UNMANAGED = "unmanaged"
    #: it runs its desired document
    IN_STEP = "in_step"
    #: a deployment is taking its desired document to it
    PENDING = "pending"
    #: it refused its desired document (or took it and rolled it back): the reason is its own
    REFUSED = "refused"
    #: its layers merge into a document the schema refuses (a key two layers set apart, say): nothing is sent
    INVALID = "invalid"
    #: it runs something else and nothing is under way (it was offline, or joined later): caught up when online
    OUT_OF_STEP = "out_of_step"
    #: the rollout of a layer revision its document is made of was stopped (aborted) before it reached it: it is not
    #: caught up with it — roll the layer back, or apply it again
    HALTED = "halted"


#: the statuses that are "out of step" in the overview: the device does not run what its layers say
NOT_IN_STEP = (ConfigStatus.PENDING, ConfigStatus.REFUSED, ConfigStatus.INVALID, ConfigStatus.OUT_OF_STEP,
               ConfigStatus.HALTED)


def reported(state: dict | None) -> tuple[str | None, int | None]:
    """(sha256, revision) of the configuration document a device's ``state`` says it runs (its ``config`` section:
    docs/protocol.md; the revision is the version of the deployment that gave it); (None, None) when it runs its
    agent.yaml, or says nothing."""
    section = (state or {}).get("config")
    if not isinstance(section, dict):
        return None, None
    sha256, revision = section.get("sha256"), section.get("revision")
    return (sha256 if isinstance(sha256, str) else None,
            revision if isinstance(revision, int) and not isinstance(revision, bool) else None)


@dataclass
class Desired:
    """A device's desired document in the form it is sent (checked, normal form), or why there is none."""

    effective: Effective
    body: bytes | None = None
    sha256: str | None = None
    problem: str | None = None

    @classmethod
    def of(cls, effective: Effective) -> Desired:
        problems = document_problems(effective.document)
        if problems:
            return cls(effective, problem=problems[0])
        body = encode_document(check_document(effective.document))
        return cls(effective, body, hashlib.sha256(body).hexdigest())


def device_status(device: dict, desired: Desired, given: list[dict], halted: set[str] = frozenset()) -> dict[str, Any]:
    """Where one device stands (``given``: its configuration targets, newest first; ``halted``: the layer revisions
    whose rollout was aborted): its status, the desired document's sha256 and layers, what it runs (its state's
    report, else what its last successful target gave it), what it refused (with its own reason) and the newest
    deployment of its desired document."""
    sha256, version = reported(device.get("state"))
    if "config" not in (device.get("state") or {}):  # an agent that does not say: what it last took
        active = next((t for t in given if t["state"] == TargetState.ACTIVE), None)
        sha256 = active["sha256"] if active else None
        version = active["version"] if active else None
    mine = next((t for t in given if t["sha256"] == desired.sha256), None) if desired.sha256 else None
    refused = next((t for t in given if t["state"] in REFUSED_STATES), None)
    if desired.problem is not None:
        status = ConfigStatus.INVALID
    elif desired.effective.empty and (sha256 is None or not given):
        # what a device runs that the fleet never gave it (a document sent by hand, by another manager) is not the
        # fleet's to take back: only a device whose layers the fleet emptied since is taken back to its agent.yaml
        status = ConfigStatus.UNMANAGED
    elif sha256 == desired.sha256:
        status = ConfigStatus.IN_STEP
    elif mine is not None and mine["state"] not in FINISHED_STATES and mine["status"] == DeploymentStatus.RUNNING:
        status = ConfigStatus.PENDING
    elif mine is not None and mine["state"] in REFUSED_STATES:
        status = ConfigStatus.REFUSED
    elif any(f"{key.label} r{revision}" in halted for key, revision in desired.effective.layers):
        status = ConfigStatus.HALTED
    else:
        status = ConfigStatus.OUT_OF_STEP
    return {
        "device_id": device["device_id"], "online": bool(device.get("online")), "status": status.value,
        "desired": {"sha256": desired.sha256, "problem": desired.problem,
                    "layers": [{"layer": key.label, "revision": rev} for key, rev in desired.effective.layers]},
        "applied": {"sha256": sha256, "version": version} if sha256 else None,
        "refused": {"sha256": refused["sha256"], "state": refused["state"], "reason": refused["detail"],
                    "deployment_id": refused["deployment_id"], "version": refused["version"]} if refused else None,
        "deployment": {"deployment_id": mine["deployment_id"], "state": mine["state"], "status": mine["status"]}
        if mine else None}


def set_sha256(documents: dict[str, str]) -> str:
    """A configuration deployment's own sha256: of its devices' documents together (device → document sha256)."""
    return hashlib.sha256(json.dumps(documents, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


class ConfigRollouts:
    """Desired vs applied for each device, configuration deployments through ``deployments``, catching up devices
    that come back (a thread: :meth:`start`, :meth:`close`)."""

    def __init__(self, db: FleetDB, deployments: DeploymentService, artifacts: ArtifactStore) -> None:
        self.db = db
        self.deployments = deployments
        self.artifacts = artifacts
        deployments.register_kind(DeploymentKind.CONFIG, self)
        self._loop = _CatchUp(self)
        self._lock = threading.Lock()  # one configuration deployment made at a time by this manager

    def start(self) -> ConfigRollouts:
        self._loop.start()
        return self

    def close(self) -> None:
        self._loop.close()

    # ------------------------------------------------------------------------------------------ where devices stand
    def desired(self, devices: Iterable[dict]) -> dict[str, Desired]:
        """Each device's desired document: its layers' newest revisions released to the devices, merged."""
        stored = {(row["scope"], row["name"]): row for row in self.db.configs.layers(applied=True)}
        found = {}
        for device in devices:
            keys = layers_of(device["fleet"], device.get("groups") or [], device["device_id"])
            parts = [(key, stored[key.scope.value, key.name]["revision"], stored[key.scope.value, key.name]["document"])
                     for key in keys if (key.scope.value, key.name) in stored]
            found[device["device_id"]] = Desired.of(merge(parts))
        return found

    def statuses(self, devices: list[dict]) -> list[dict[str, Any]]:
        """:func:`device_status` of each of ``devices`` (rows of the devices table)."""
        return self._judged(devices)[0]

    def _judged(self, devices: list[dict]) -> tuple[list[dict[str, Any]], dict[str, Desired]]:
        desired = self.desired(devices)
        given: dict[str, list[dict]] = {}
        for target in self.db.configs.given([d["device_id"] for d in devices]):
            given.setdefault(target["device_id"], []).append(target)
        halted = self.db.configs.halted()
        return [device_status(d, desired[d["device_id"]], given.get(d["device_id"], []), halted)
                for d in devices], desired

    # ------------------------------------------------------------------------------------------ deploying
    def deploy(self, devices: list[dict], rollout: RolloutOptions, *,
               reason: str) -> tuple[dict | None, list[dict[str, str]]]:
        """A configuration deployment of their desired documents to those of ``devices`` online that do not run it
        and are not being given it; (the deployment or None, the devices left out with why). ``reason``: the layer
        revision it takes out (``group:lobby r5``), kept in the deployment's options."""
        with self._lock:
            found, desired = self._judged(devices)
            statuses = {s["device_id"]: s for s in found}
            chosen, skipped = [], []
            for device in devices:
                status, why = statuses[device["device_id"]], None
                if status["status"] == ConfigStatus.INVALID:
                    why = f"its layers merge into a document that is not valid: {status['desired']['problem']}"
                elif status["status"] in (ConfigStatus.IN_STEP, ConfigStatus.UNMANAGED):
                    why = "it runs its desired document already"
                elif status["status"] == ConfigStatus.PENDING:
                    why = f"deployment {status['deployment']['deployment_id']} is giving it its desired document"
                elif not device.get("online"):
                    why = "offline: it gets its desired document when it comes back"
                if why:
                    skipped.append({"device_id": device["device_id"], "reason": why})
                else:
                    chosen.append((device["device_id"], desired[device["device_id"]]))
            if not chosen:
                return None, skipped
            return self._start(chosen, rollout, reason=reason), skipped

    def _start(self, chosen: list[tuple[str, Desired]], rollout: RolloutOptions, *, reason: str) -> dict:
        documents = {}
        for device_id, desired in chosen:
            assert desired.body is not None and desired.sha256 is not None
            self.artifacts.put_bytes(desired.body)
            documents[device_id] = desired.sha256
        version = self.next_version()
        manifest = new_manifest(model_name=f"config {reason}"[:256], version=version, sha256=set_sha256(documents),
                                size=sum(len(d.body or b"") for _, d in chosen), url=self.url_of(set_sha256(documents)),
                                target=f"config:{reason}"[:1024], kind=DeploymentKind.CONFIG.value)
        self.db.configs.add_targets({"deployment_id": manifest.deployment_id, "device_id": device_id,
                                     "sha256": desired.sha256, "size": len(desired.body or b""),
                                     "layers": [[key.label, revision] for key, revision in desired.effective.layers]}
                                    for device_id, desired in chosen)
        created = self.deployments.start(manifest, list(documents), rollout, config=reason)
        self._supersede(created["deployment_id"], set(documents))
        return created

    def next_version(self) -> int:
        """Above every configuration version the fleet sent and every one a device reports running (a device
        refuses a version that is not newer)."""
        reported_versions = [reported(d.get("state"))[1] or 0 for d in self.db.list_devices()]
        return max([self.db.configs.newest_version(), *reported_versions]) + 1

    def url_of(self, sha256: str) -> str:
        return f"{self.deployments.public_url}/artifacts/{sha256}"

    def _supersede(self, deployment_id: str, devices: set[str]) -> None:
        """Abort a running configuration deployment whose devices still waiting are all in the new one."""
        for running in self.db.running_deployments():
            if running.get("kind") != DeploymentKind.CONFIG or running["deployment_id"] == deployment_id:
                continue
            waiting = {t["device_id"] for t in self.db.deployment_targets(running["deployment_id"])
                       if t["state"] not in FINISHED_STATES}
            if waiting <= devices:
                self.db.abort_deployment(running["deployment_id"], f"superseded by deployment {deployment_id}")

    def holds(self, sha256: str, device_id: str | None = None) -> bool:
        """Whether ``sha256`` is a configuration document (given to ``device_id``, when named): the artifacts route
        opens one to the devices it was given to only."""
        return self.db.configs.holds(sha256, device_id)

    # --------------------------------------------------------------------- DeploymentService's PerDevice
    def deploy_args(self, deployment: dict, device: str) -> dict[str, Any]:
        """The deploy command for ``device``: its document's manifest, signed for it."""
        target = self.db.configs.target(deployment["deployment_id"], device)
        if target is None:
            raise LookupError(f"deployment {deployment['deployment_id']} gives {device} no configuration")
        manifest = dataclasses.replace(Manifest.from_dict(deployment["manifest"]), sha256=target["sha256"],
                                       size=int(target["size"]), url=self.url_of(target["sha256"]),
                                       target=f"device:{device}")
        return {"manifest": manifest.to_dict(), "signature": self.deployments.key.sign(manifest)}

    def runs(self, deployment: dict, device: str, state: dict) -> bool:
        sha256, _ = reported(state)
        if sha256 is None:
            return False
        target = self.db.configs.target(deployment["deployment_id"], device)
        return target is not None and target["sha256"] == sha256

    # ------------------------------------------------------------------------------------------- catching up
    def follow_state(self, device: str, state: dict) -> None:
        """Ingest's ``on_state``: a device online is looked at (soon, with the others that came back)."""
        if state.get("online"):
            self._loop.add(device)

    def catch_up(self, device_ids: Iterable[str]) -> dict | None:
        """One deployment of their desired documents to those of ``device_ids`` online that are out of step (they
        were offline, or joined a group since); the deployment, or None when none is."""
        rows = [d for d in self.db.devices_by_id(sorted(set(device_ids))) if d.get("online")]
        due = [d for d, s in zip(rows, self.statuses(rows)) if s["status"] == ConfigStatus.OUT_OF_STEP]
        if not due:
            return None
        created, _ = self.deploy(due, CATCH_UP, reason="catch-up")
        if created is not None:
            log.info("configuration: caught up %d device(s) in deployment %s", len(created["devices"]),
                     created["deployment_id"])
            self.db.audit(actor="fleet manager", role=None, action="config.catch_up", target=created["deployment_id"],
                          remote=None, detail={"devices": [t["device_id"] for t in created["devices"]][:100]})
        return created


class _CatchUp(Loop):
    """Gathers the devices whose ``state`` said they are online and catches them up together."""

    thread_name = "edgeinfer-fleet-config"

    def __init__(self, rollouts: ConfigRollouts) -> None:
        super().__init__()
        self.rollouts = rollouts
        self._due: set[str] = set()
        self._lock = threading.Lock()

    def add(self, device: str) -> None:
        with self._lock:
            self._due.add(device)
        self._wake.set()

    def _run(self) -> None:
        while not self._stop.is_set():
            self._wake.wait()
            self._stop.wait(CATCH_UP_EVERY_S)  # more come back together: one deployment for them
            self._wake.clear()
            with self._lock:
                due, self._due = self._due, set()
            if not due or self._stop.is_set():
                continue
            try:
                self.rollouts.catch_up(due)
            except Exception:
                log.exception("catching up %d device(s) with their configuration failed", len(due))

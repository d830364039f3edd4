"""Deployments in the database: creation, leases, forward-only target states — each one atomic SQL
statement, so several fleet managers can share the work without a lock of their own."""

from __future__ import annotations

import time
from typing import Any

from ...link.vocabulary import FAILED_STATES, PROGRESS_STATES, WAITING_STATES, DeploymentKind, TargetState
from ..rollout import DeploymentStatus
from .schema import Tables

RUNNING = DeploymentStatus.RUNNING.value


def predecessors(state: TargetState) -> tuple[str, ...]:
    """The states a target may move to ``state`` from: progress only goes forward, finished is final."""
    if state == TargetState.NOTIFIED:
        found: tuple[TargetState, ...] = (TargetState.PENDING,)
    elif state in PROGRESS_STATES:  # a device's answer: only to a command it was sent
        found = tuple(s for s in PROGRESS_STATES[:PROGRESS_STATES.index(state)] if s in WAITING_STATES)
    elif state == TargetState.REJECTED:
        found = (TargetState.PENDING, *WAITING_STATES)
    elif state == TargetState.ROLLED_BACK:
        # The device's own verdict outranks what its state implied: its state shows the new model as
        # soon as the trial swaps it in (follow_state counts that as active), before the health gate
        # decides.
        found = (*WAITING_STATES, TargetState.ACTIVE)
    elif state in FAILED_STATES:
        found = WAITING_STATES
    else:
        raise ValueError(f"unknown target state {state!r}")
    return tuple(s.value for s in found)


def create(engine: Any, t: Tables, manifest: dict, signature: str, options: dict,
           waves: list[list[str]]) -> None:
    now = time.time()
    with engine.begin() as conn:
        conn.execute(t.deployments.insert().values(
            deployment_id=manifest["deployment_id"], kind=manifest.get("kind") or DeploymentKind.MODEL.value,
            model_name=manifest["model_name"],
            version=manifest["version"], sha256=manifest["sha256"], size=manifest["size"],
            target=manifest["target"], options=options, status=RUNNING, manifest=manifest,
            signature=signature, created_at=now, updated_at=now))
        rows = [{"deployment_id": manifest["deployment_id"], "device_id": device_id, "wave": wave,
                 "state": TargetState.PENDING.value, "updated_at": now}
                for wave, devices in enumerate(waves) for device_id in devices]
        if rows:
            conn.execute(t.targets.insert(), rows)


def advance(engine: Any, t: Tables, deployment_id: str, device_id: str, state: TargetState, detail: str | None,
            now: float) -> bool:
    values: dict[str, Any] = {"state": TargetState(state).value, "detail": detail, "updated_at": now}
    if state == TargetState.NOTIFIED:
        values["notified_at"] = now
    c = t.targets.c
    with engine.begin() as conn:
        result = conn.execute(t.targets.update().where(
            (c.deployment_id == deployment_id) & (c.device_id == device_id) & c.state.in_(predecessors(state))
        ).values(**values))
    return result.rowcount == 1


def set_status(engine: Any, t: Tables, deployment_id: str, status: DeploymentStatus, detail: str | None) -> None:
    values: dict[str, Any] = {"status": DeploymentStatus(status).value, "detail": detail, "updated_at": time.time()}
    if status != DeploymentStatus.RUNNING:
        values.update(lease_owner=None, lease_until=None)
    with engine.begin() as conn:
        conn.execute(t.deployments.update().where(t.deployments.c.deployment_id == deployment_id).values(**values))


def abort(engine: Any, t: Tables, deployment_id: str, detail: str) -> bool:
    """Stop a running deployment (no later wave is notified); False when it was not running."""
    c = t.deployments.c
    with engine.begin() as conn:
        result = conn.execute(t.deployments.update().where((c.deployment_id == deployment_id) & (c.status == RUNNING))
                              .values(status=DeploymentStatus.ABORTED.value, detail=detail, updated_at=time.time(),
                                      lease_owner=None, lease_until=None))
    return result.rowcount == 1


def set_analysis(engine: Any, t: Tables, deployment_id: str, analysis: dict) -> None:
    c = t.deployments.c
    with engine.begin() as conn:
        conn.execute(t.deployments.update().where(c.deployment_id == deployment_id)
                     .values(analysis=analysis, updated_at=time.time()))


def telemetry_between(sa: Any, engine: Any, t: Tables, device_ids: list[str], since: float,
                      until: float) -> list[tuple[str, float, dict]]:
    """(device, ts, payload) of the devices' telemetry with since <= ts <= until (the canary analysis)."""
    c = t.telemetry.c
    rows: list[tuple[str, float, dict]] = []
    with engine.connect() as conn:
        for start in range(0, len(device_ids), 500):  # bounded IN lists
            query = (sa.select(c.device_id, c.ts, c.payload)
                     .where(c.device_id.in_(device_ids[start:start + 500]) & (c.ts >= since) & (c.ts <= until)))
            rows += [(r[0], float(r[1]), r[2]) for r in conn.execute(query)]
    return rows


def try_lease(engine: Any, t: Tables, deployment_id: str, owner: str, ttl_s: float, now: float) -> bool:
    c = t.deployments.c
    free = c.lease_owner.is_(None) | (c.lease_owner == owner) | (c.lease_until < now)
    with engine.begin() as conn:
        result = conn.execute(t.deployments.update().where(
            (c.deployment_id == deployment_id) & (c.status == RUNNING) & free
        ).values(lease_owner=owner, lease_until=now + ttl_s))
    return result.rowcount == 1


def release_lease(engine: Any, t: Tables, deployment_id: str, owner: str) -> None:
    c = t.deployments.c
    with engine.begin() as conn:
        conn.execute(t.deployments.update().where((c.deployment_id == deployment_id) & (c.lease_owner == owner))
                     .values(lease_owner=None, lease_until=None))


def running(sa: Any, engine: Any, t: Tables) -> list[dict]:
    query = sa.select(t.deployments).where(t.deployments.c.status == RUNNING).order_by(t.deployments.c.created_at)
    with engine.connect() as conn:
        return [dict(r) for r in conn.execute(query).mappings()]


def targets(sa: Any, engine: Any, t: Tables, deployment_id: str) -> list[dict]:
    query = (sa.select(t.targets).where(t.targets.c.deployment_id == deployment_id)
             .order_by(t.targets.c.wave, t.targets.c.device_id))
    with engine.connect() as conn:
        return [dict(r) for r in conn.execute(query).mappings()]


def summary(sa: Any, conn: Any, t: Tables, row: dict) -> dict:
    counts = conn.execute(sa.select(t.targets.c.state, sa.func.count())
                          .where(t.targets.c.deployment_id == row["deployment_id"])
                          .group_by(t.targets.c.state)).all()
    row["counts"] = {state: n for state, n in counts}
    for private in ("manifest", "signature"):
        row.pop(private, None)
    return row

"""Rolling a signed model out in waves: canary first, stop when too many finished devices fail.

The rollout's whole state lives in the database (each target's wave and state, the deployment's
status), so any fleet manager can drive it and another can take over where it stood. One manager
drives a deployment at a time: it holds the deployment's *lease* (an atomic conditional UPDATE,
renewed every tick); a manager that dies stops renewing, and when the lease runs out another one
takes the deployment over, re-sends the command to devices it had notified (their command may
have died with it; the agent's answer to a repeated command is idempotent) and carries on.

:func:`step` is the rule, stateless: it reads the targets and advances the deployment as far as
it can go now. Device progress arrives from ingest (``update`` events) as forward-only state
changes in SQL (:meth:`FleetDB.advance_target`), so a late or repeated event never moves a
device backwards, whichever manager stores it.
"""

from __future__ import annotations

import logging
import math
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from ..link.vocabulary import FAILED_STATES, FINISHED_STATES, WAITING_STATES, DeploymentKind, TargetState, Word
from . import canary as canary_analysis

log = logging.getLogger(__name__)

DEFAULT_LEASE_TTL_S = 10.0
DEFAULT_TICK_S = 0.25
#: percent of a deployment's targets in its first (canary) wave, unless told
DEFAULT_CANARY_PCT = 10.0
#: seconds a device may take to answer a deploy command, unless told
DEFAULT_DEVICE_TIMEOUT_S = 600.0
#: the kinds of deployment the manager makes (link/vocabulary.py's words; the config kind joins with its artifact),
#: and the type of the API's ``kind``
DEPLOYABLE_KINDS = (DeploymentKind.MODEL, DeploymentKind.AGENT)
DeployableKind = Literal[tuple(kind.value for kind in DEPLOYABLE_KINDS)]  # type: ignore[valid-type]


class DeploymentStatus(Word):
    """Where a deployment stands: running until every wave has finished or it was stopped."""

    RUNNING = "running"
    SUCCEEDED = "succeeded"
    #: some device did not update, within the failure-rate rule
    FAILED = "failed"
    #: stopped: by an operator, the failure-rate rule or the canary analysis; no later wave is notified
    ABORTED = "aborted"


def plan_waves(devices: list[str], *, canary_pct: float = DEFAULT_CANARY_PCT,
               wave_size: int | None = None) -> list[list[str]]:
    """Split ``devices`` into a canary wave (``canary_pct`` %, at least one) and waves of ``wave_size``."""
    if not devices:
        return []
    if not 0 <= canary_pct <= 100:
        raise ValueError(f"canary percentage must be within 0-100, not {canary_pct}")
    if wave_size is not None and wave_size < 1:
        raise ValueError(f"wave size must be at least 1, not {wave_size}")
    ordered = sorted(devices)
    canary = min(len(ordered), max(1, math.ceil(len(ordered) * canary_pct / 100))) if canary_pct > 0 else 0
    waves = [ordered[:canary]] if canary else []
    rest = ordered[canary:]
    size = wave_size or len(rest) or 1
    waves += [rest[i:i + size] for i in range(0, len(rest), size)]
    return waves


def failure_rate(states: list[str]) -> float:
    """Failed over finished (0 when none finished)."""
    finished = [s for s in states if s in FINISHED_STATES]
    return sum(s in FAILED_STATES for s in finished) / len(finished) if finished else 0.0


@dataclass(frozen=True)
class RolloutRules:
    """When to give up: the failure rate that aborts (a fraction) and how long one device may take."""

    abort_failure_rate: float = 0.0
    device_timeout_s: float = DEFAULT_DEVICE_TIMEOUT_S

    @classmethod
    def from_options(cls, options: dict[str, Any]) -> RolloutRules:
        rate = float(options.get("abort_failure_rate") or 0.0)  # stored as a fraction (DeploymentSpec.abort_fraction)
        return cls(abort_failure_rate=rate / 100 if rate > 1 else rate,  # rows stored before then: a percent
                   device_timeout_s=float(options.get("device_timeout_s") or DEFAULT_DEVICE_TIMEOUT_S))


class RolloutStore(Protocol):
    """What :func:`step` needs of the fleet database."""

    def deployment_targets(self, deployment_id: str) -> list[dict]: ...
    def advance_target(self, deployment_id: str, device_id: str, state: TargetState, detail: str | None = None, *,
                       now: float | None = None) -> bool: ...
    def set_deployment_status(self, deployment_id: str, status: DeploymentStatus,
                              detail: str | None = None) -> None: ...
    def set_deployment_analysis(self, deployment_id: str, analysis: dict) -> None: ...
    def telemetry_between(self, device_ids: list[str], since: float, until: float) -> list[tuple[str, float, dict]]: ...


def step(store: RolloutStore, deployment: dict, notify: Callable[[str], None], *, now: float | None = None,
         resend: bool = False, rollback: Callable[[str], None] | None = None) -> DeploymentStatus | None:
    """Advance ``deployment`` as far as it can go now; its final status once it has ended, else None.

    Waves in order: a wave's pending devices are notified once every earlier wave has finished
    and the failure rate so far is within the rule; overdue devices time out; ``resend``
    notifies again the devices that were notified but have not answered (after a takeover).
    A canary wave (wave 0 of a deployment with a canary and the analysis on) is judged on its
    telemetry before any later wave is notified (:func:`canary_gate`); ``rollback(device)`` sends
    a canary device back to its previous model when the verdict fails.
    """
    now = time.time() if now is None else now
    deployment_id = deployment["deployment_id"]
    rules = RolloutRules.from_options(deployment.get("options") or {})
    waves: dict[int, list[dict]] = {}
    for target in store.deployment_targets(deployment_id):
        waves.setdefault(int(target["wave"]), []).append(dict(target))
    seen: list[str] = []
    for index in sorted(waves):
        wave = waves[index]
        for target in wave:
            _advance(store, deployment_id, target, rules, notify, now=now, resend=resend)
        seen += [t["state"] for t in wave]
        if any(t["state"] not in FINISHED_STATES for t in wave):
            return None
        rate = failure_rate(seen)
        if rate > rules.abort_failure_rate and index != max(waves):
            detail = (f"failure rate {rate:.0%} passed the threshold of {rules.abort_failure_rate:.0%} after wave "
                      f"{index + 1} of {len(waves)}; later waves not notified")
            store.set_deployment_status(deployment_id, DeploymentStatus.ABORTED, detail)
            return DeploymentStatus.ABORTED
        if index == 0 and has_canary(deployment):
            gate = canary_gate(store, deployment, waves, rollback or (lambda device: None), now=now)
            if gate != "pass":
                return None if gate == "wait" else gate
    succeeded = bool(seen) and all(s == TargetState.ACTIVE for s in seen)
    status = DeploymentStatus.SUCCEEDED if succeeded else DeploymentStatus.FAILED
    if status == DeploymentStatus.FAILED and failure_rate(seen) > rules.abort_failure_rate:
        status = DeploymentStatus.ABORTED
    store.set_deployment_status(deployment_id, status, None if succeeded else
                                f"{sum(s != TargetState.ACTIVE for s in seen)} of {len(seen)} device(s) did not update")
    return status


def _advance(store: RolloutStore, deployment_id: str, target: dict, rules: RolloutRules,
             notify: Callable[[str], None], *, now: float, resend: bool) -> None:
    device, state = target["device_id"], target["state"]
    if state == TargetState.PENDING:
        if store.advance_target(deployment_id, device, TargetState.NOTIFIED, now=now):
            notify(device)
        target["state"] = TargetState.NOTIFIED
    elif state in WAITING_STATES and now - float(target.get("notified_at") or now) > rules.device_timeout_s:
        detail = f"no result within {rules.device_timeout_s:.0f} s"
        if store.advance_target(deployment_id, device, TargetState.TIMEOUT, detail, now=now):
            target["state"] = TargetState.TIMEOUT
    elif state == TargetState.NOTIFIED and resend:
        notify(device)


def has_canary(deployment: dict) -> bool:
    """Whether wave 0 is a canary wave to be judged: a canary share above 0 and the analysis on."""
    options = deployment.get("options") or {}
    return float(options.get("canary_pct") or 0) > 0 and canary_analysis.Thresholds.from_options(options).enabled


def canary_gate(store: RolloutStore, deployment: dict, waves: dict[int, list[dict]],
                rollback: Callable[[str], None], *, now: float) -> Literal["pass", "wait"] | DeploymentStatus:
    """"pass", "wait" (the window is not over, or too few telemetry windows yet) or "aborted".

    The canary wave has finished. Its active devices are judged once ``window_s`` after the last of
    them became active, against the later waves' devices (still on the old version) over the same
    time, or, with no later wave, against their own telemetry from before they were notified. Too
    few windows: wait, at most one more window; then judge what there is (a canary that sent less
    than the minimum fails). The verdict is stored; a failed one rolls the canary back and aborts.
    """
    deployment_id = deployment["deployment_id"]
    stored = deployment.get("analysis")
    canary = [t for t in waves[0] if t["state"] == TargetState.ACTIVE]
    if isinstance(stored, dict) and "passed" in stored:
        if stored["passed"]:
            return "pass"
        _abort_canary(store, deployment_id, canary, rollback, str(stored.get("summary") or "canary analysis failed"))
        return DeploymentStatus.ABORTED  # a manager that stopped half-way through the abort: finish it
    if not canary:
        return "pass"  # every canary device failed, within the failure-rate rule: nothing to judge
    thresholds = canary_analysis.Thresholds.from_options(deployment.get("options") or {})
    pipeline = (deployment.get("options") or {}).get("pipeline")
    activated = {t["device_id"]: float(t["updated_at"]) for t in canary}
    start = max(activated.values())
    if now < start + thresholds.window_s:
        return "wait"
    canary_rows = [row for row in store.telemetry_between(sorted(activated), start, now)
                   if row[1] - float((row[2] or {}).get("interval_s") or 0) >= activated[row[0]] - 0.001]
    later = [t["device_id"] for index in sorted(waves) if index > 0 for t in waves[index]]
    if later:
        baseline, control_rows = "control", store.telemetry_between(canary_analysis.sample_control(later), start, now)
    else:  # no control group: the canary devices before they were notified
        notified = {t["device_id"]: float(t.get("notified_at") or activated[t["device_id"]]) for t in canary}
        earliest = min(notified.values()) - thresholds.window_s
        baseline = "before"
        control_rows = [row for row in store.telemetry_between(sorted(notified), earliest, max(notified.values()))
                        if row[1] < notified[row[0]]]
    counts = (canary_analysis.count_windows(canary_rows, pipeline),
              canary_analysis.count_windows(control_rows, pipeline))
    if canary_analysis.insufficient(*counts, thresholds) and now < start + 2 * thresholds.window_s:
        return "wait"
    verdict = canary_analysis.analyse(canary_rows, control_rows, thresholds, baseline=baseline, pipeline=pipeline,
                                      window=(start, now))
    if counts[0] < thresholds.min_windows:
        verdict = canary_analysis.too_little_telemetry(verdict, counts[0], thresholds)
    store.set_deployment_analysis(deployment_id, verdict.to_dict())
    log.info("rollout %s: %s", deployment_id, verdict.summary)
    if verdict.passed:
        return "pass"
    _abort_canary(store, deployment_id, canary, rollback, verdict.summary)
    return DeploymentStatus.ABORTED


def _abort_canary(store: RolloutStore, deployment_id: str, canary: list[dict], rollback: Callable[[str], None],
                  summary: str) -> None:
    """Roll the active canary devices back (a command with one id per deployment: a repeat runs once), mark
    them rolled_back, and abort: no later wave is notified."""
    for target in canary:
        try:
            rollback(target["device_id"])
        except Exception as exc:  # an unknown device, a full spool: the abort goes on, the detail says so
            log.warning("rollout %s: could not send %s a rollback: %s", deployment_id, target["device_id"], exc)
        store.advance_target(deployment_id, target["device_id"], TargetState.ROLLED_BACK, "canary analysis failed")
    store.set_deployment_status(deployment_id, DeploymentStatus.ABORTED,
                                f"{summary}; canary device(s) rolled back, later waves not notified")


class LeaseStore(RolloutStore, Protocol):
    def running_deployments(self) -> list[dict]: ...
    def try_lease(self, deployment_id: str, owner: str, ttl_s: float, *, now: float | None = None) -> bool: ...
    def release_lease(self, deployment_id: str, owner: str) -> None: ...


def default_owner() -> str:
    return f"{socket.gethostname()}:{threading.get_native_id()}:{time.time_ns() % 10**9}"


class RolloutDriver:
    """A thread that drives every running deployment whose lease this process holds or can take."""

    def __init__(self, store: LeaseStore, notify: Callable[[dict, str], None], *, owner: str | None = None,
                 lease_ttl_s: float = DEFAULT_LEASE_TTL_S, tick_s: float = DEFAULT_TICK_S,
                 rollback: Callable[[dict, str], None] | None = None) -> None:
        self.store = store
        self._rollback = rollback
        self.owner = owner or default_owner()
        self.lease_ttl_s = lease_ttl_s
        self.tick_s = tick_s
        self._notify = notify
        self._held: set[str] = set()  # deployments this driver has been driving
        self.running: list[dict] = []  # every running deployment, as of the last tick
        self.takeovers = 0
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="edgeinfer-fleet-rollouts", daemon=True)

    def start(self) -> RolloutDriver:
        self._thread.start()
        return self

    @property
    def held(self) -> frozenset[str]:
        """The deployments this driver drives now."""
        return frozenset(self._held)

    def poke(self) -> None:
        """Something changed (a new deployment, a device's progress): tick now."""
        self._wake.set()

    def close(self) -> None:
        """Stop driving and hand the leases back, so another manager takes over at once."""
        self._stop.set()
        self._wake.set()
        if self._thread.is_alive():
            self._thread.join(timeout=10)
        for deployment_id in list(self._held):
            try:
                self.store.release_lease(deployment_id, self.owner)
            except Exception as exc:  # closing: the lease runs out by itself
                log.debug("could not release the lease on %s: %s", deployment_id, exc)

    def _send_rollback(self, deployment: dict, device: str) -> None:
        if self._rollback is not None:
            self._rollback(deployment, device)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.tick()
            except Exception:  # a database hiccup: try again next tick
                log.exception("rollout tick failed")
            self._wake.wait(self.tick_s)
            self._wake.clear()

    def tick(self, now: float | None = None) -> None:
        now = time.time() if now is None else now
        running = self.store.running_deployments()
        self.running = running
        for deployment in running:
            deployment_id = deployment["deployment_id"]
            owner, until = deployment.get("lease_owner"), deployment.get("lease_until")
            if owner not in (None, self.owner) and until is not None and until > now:
                continue  # another manager drives it
            if not self.store.try_lease(deployment_id, self.owner, self.lease_ttl_s, now=now):
                continue
            takeover = deployment_id not in self._held and owner not in (None, self.owner)
            if takeover:
                self.takeovers += 1
                log.warning("taking over rollout %s from %s", deployment_id, owner)
            self._held.add(deployment_id)
            ended = step(self.store, deployment, lambda device, d=deployment: self._notify(d, device), now=now,
                         resend=takeover, rollback=lambda device, d=deployment: self._send_rollback(d, device))
            if ended:
                log.info("rollout %s %s", deployment_id, ended)
                self._held.discard(deployment_id)
        self._held &= {d["deployment_id"] for d in running}

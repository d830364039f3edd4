"""The ``agent`` kind of deployment: edgeinfer updates itself, through its launcher's two environment slots.

In the agent that runs now (slot A)::

    download the bundle (resume, sha256) ─► unpack, a venv in the other slot, pip install --no-index, the new
    slot's ``python -m edgeinfer --version`` (edgeinfer/updates/agent_slots.py) ─► a trial of the other slot in the
    launcher's state ─► stop, exit with SWITCH_EXIT_STATUS

and in the agent the launcher starts from slot B, on trial: once it is connected to the broker and every pipeline
has produced a result, it commits the trial (slot B is the active one) and reports ``active`` with the time the
switch took (``switch_s``: from A's request to B's first result; ``start_s`` of it from B's process start). When
B does not get there — it exits, even before it can import anything, or is not healthy within the launcher's
bound — the launcher ends the trial and starts A again, which reports ``rolled_back`` with the launcher's reason.
Either way the device keeps reporting.
Every step is an ``update`` event with the deployment id and its TargetState, as a model's.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Mapping
from typing import Any

from .._version import __version__
from ..errors import EdgeInferError, UpdateRejected
from ..link.vocabulary import DeploymentKind, EventKind, TargetState
from ..updates.agent_slots import AgentSlots
from ..updates.launcher import COMMITTED, SWITCH_EXIT_STATUS
from ..updates.signing import Manifest
from .commands import CommandContext
from .config import AgentConfig
from .deploy_kinds import UpdateReport, downloads_for
from .services import AgentServices

log = logging.getLogger(__name__)

#: how often a trial looks whether it is healthy yet
TRIAL_POLL_S = 0.05


class AgentUpdates:
    """The agent kind's handler (:class:`~.deploy.KindHandler`), and the part of a trial that runs in the new agent."""

    def __init__(self, config: AgentConfig, slots: AgentSlots | None = None) -> None:
        self.config = config
        self.slots = slots if slots is not None else AgentSlots.from_environment()
        #: this agent is a trial its launcher started, not yet committed (the state says so: the fleet waits)
        self.on_trial = self.slots is not None and self.slots.trial_id is not None

    # -- the kind ----------------------------------------------------------------------------------------
    def running_version(self, args: Mapping[str, Any]) -> int | None:
        return self.slots.running_version(__version__) if self.slots is not None else None

    def deploy(self, manifest: Manifest, args: Mapping[str, Any], ctx: CommandContext) -> dict[str, Any]:
        """Install the bundle into the other slot and hand it to the launcher; the agent then exits."""
        slots = self._slots()
        if slots.on_trial():
            raise UpdateRejected("busy", "this agent is itself on trial: deploy again once it reports healthy")
        report = UpdateReport.of(ctx.agent, manifest, ctx.command_id, label=manifest.model_name)
        report(TargetState.DOWNLOADING)
        try:
            bundle_file = downloads_for(self.config, args).fetch(manifest, slots.incoming(manifest.sha256))
            report(TargetState.VALIDATING)
            slot, record, bundle = slots.install(bundle_file, sha256=manifest.sha256,
                                                 deployment_id=manifest.deployment_id, number=manifest.version)
            slots.begin_trial(slot, record, deployment_id=manifest.deployment_id, cmd_id=ctx.command_id,
                              version=manifest.version, version_text=bundle.version, sha256=manifest.sha256)
        except EdgeInferError as exc:  # refused, or a download that never completed
            return report.failed(exc)
        log.warning("edgeinfer %s is installed in slot %s: restarting into it", bundle.version, slot)
        ctx.agent.request_exit(SWITCH_EXIT_STATUS)
        return {"state": "switching", "slot": slot, "version": bundle.version}

    def rollback(self, args: Mapping[str, Any], ctx: CommandContext) -> dict[str, Any]:
        """Go back to the other slot's agent: a trial of it, as an update is (it must come up healthy)."""
        slots = self._slots()
        previous = slots.previous()
        if previous is None:
            raise UpdateRejected("no_previous", "there is no previous agent environment to roll back to")
        slot, record = previous
        slots.begin_trial(slot, None, deployment_id=None, cmd_id=ctx.command_id, version=record.get("number"),
                          version_text=record.get("version"), sha256=record.get("sha256"), rollback=True)
        ctx.agent.emit(EventKind.UPDATE, "warning", f"rolling the agent back to {record.get('version')} (slot {slot})",
                       cmd_id=ctx.command_id, data={"state": TargetState.ROLLED_BACK.value, "kind": "agent",
                                                    "version": record.get("number")})
        ctx.agent.request_exit(SWITCH_EXIT_STATUS)
        return {"state": "switching", "slot": slot, "version": record.get("version")}

    def _slots(self) -> AgentSlots:
        if self.slots is None:
            raise UpdateRejected("self_update_unavailable", "this agent was not started by edgeinfer's launcher, "
                                                            "which an agent update needs (install-agent.sh)")
        return self.slots

    # -- at start ----------------------------------------------------------------------------------------
    def describe(self) -> dict[str, Any] | None:
        """The ``agent`` of the state message: the slot it runs from, its version, the bundle it came from
        (None: provisioned), and whether it is still on trial."""
        if self.slots is None:
            return None
        try:
            record = self.slots.record() or {}
        except (OSError, ValueError):
            record = {}
        return {"slot": self.slots.slot, "version": __version__, "sha256": record.get("sha256"),
                "trial": self.on_trial}

    def start(self, agent: AgentServices) -> None:
        """Record this slot's version, report what the launcher decided last, and, on trial, judge this agent."""
        if self.slots is None:
            return
        try:
            self.slots.note_version(__version__)
            self._report_outcome(agent)
            if self.slots.on_trial():
                threading.Thread(target=self._judge, args=(agent,), name="edgeinfer-agent-trial", daemon=True).start()
            else:
                self.on_trial = False
        except (OSError, ValueError) as exc:  # a damaged state must not stop the agent: the launcher says more
            log.error("cannot read the agent slots' state: %s", exc)

    def _judge(self, agent: AgentServices) -> None:
        """Commit the trial once the broker is reached and every pipeline has produced a result."""
        first_result: float | None = None
        while not agent.stopping:
            link = agent.link
            runners = agent.runners
            if first_result is None and runners and all(r.first_result_s is not None for r in runners):
                first_result = _first_result_time(runners)
            producing = not runners or first_result is not None
            if link is not None and link.status.connected and producing:
                break
            time.sleep(TRIAL_POLL_S)
        else:
            return  # stopping: the launcher decides what comes next
        outcome = self.slots.commit() if self.slots is not None else None
        if outcome is None:
            log.error("the launcher ended this trial before it reported healthy")
            return
        if first_result is not None and outcome.get("requested_at"):
            # the switch: the old agent stopping, then this one starting up to its pipelines' first results
            outcome["switch_s"] = round(first_result - float(outcome["requested_at"]), 3)
            outcome["start_s"] = round(max(r.first_result_s for r in agent.runners), 3)
        self.on_trial = False
        agent.state_changed()  # no longer on trial
        self._report(agent, outcome)

    def _report_outcome(self, agent: AgentServices) -> None:
        outcome = self.slots.unreported() if self.slots is not None else None
        if outcome is not None:
            self._report(agent, outcome)

    def _report(self, agent: AgentServices, outcome: dict[str, Any]) -> None:
        """The update event of an ended trial (an update's: a rollback's trial reports nothing more)."""
        if outcome.get("deployment_id"):
            report = UpdateReport(agent, outcome["deployment_id"], int(outcome.get("version") or 0),
                                  outcome.get("cmd_id"), None, DeploymentKind.AGENT,
                                  f"edgeinfer {outcome.get('version_text')}")
            extra = {k: outcome[k] for k in ("switch_s", "start_s", "slot") if outcome.get(k) is not None}
            if outcome.get("result") == COMMITTED:
                report(TargetState.ACTIVE, "info", None, **extra)
            else:
                report(TargetState.ROLLED_BACK, "error", outcome.get("reason") or "the new agent failed", **extra)
        else:
            log.info("agent rollback to slot %s: %s", outcome.get("slot"), outcome.get("result"))
        if self.slots is not None:
            self.slots.mark_reported(outcome)


def _first_result_time(runners: list[Any]) -> float:
    """The wall-clock time of the last of the pipelines' first results (each counted from the process's start)."""
    from .telemetry import process_age_s

    age = process_age_s()
    now = time.time()
    latest = max(r.first_result_s for r in runners)
    return now - (age - latest) if age is not None else now

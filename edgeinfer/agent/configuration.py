"""The ``config`` kind of deployment: a configuration revision from the fleet, applied on the device like a model.

A revision is a document (link/config_document.py: the keys of agent.yaml the fleet sets) the fleet signs and sends
as a ``deploy`` command of kind ``config`` (the manifest names its sha256; the artifact is downloaded like a model's,
agent/deploy_kinds.py). :meth:`ConfigUpdates.deploy` downloads it and hands it to :meth:`ConfigUpdates.apply_staged`,
the entry point any transport can call with (manifest, staged file, command context)::

    check: the schema (the manager's words), agent.yaml's reader over agent.yaml + the document, each pipeline the
    revision adds or restarts read as --check reads it (its model opens, its layout resolves, its decoder fits, its
    rules), each source it opens opened within a bound, each live change checked against the running model
      └─ refused with a reason (state failed): nothing changed
    trial: written first (config_state.py), then only what changed is changed (config_apply.py): options live,
    streams reopened, pipelines added, removed or restarted one by one
    health gate: every pipeline running and producing results within CONFIG_HEALTH_WINDOW_S
      └─ healthy: committed (state active)   └─ not: the previous revision put back the same way (rolled_back)

Every step is an ``update`` event with the deployment id and its TargetState (``downloading``, ``validating`` with a
``step``, ``active``, ``failed``, ``rolled_back``), as a model update's; the ``state`` message's ``config`` section
(:meth:`ConfigUpdates.describe`) says the revision and hash the device runs, the one on trial and the last refused
with its reason. Precedence: agent.yaml is the bootstrap and the fallback; an applied revision's keys replace
agent.yaml's (a revision that sets ``pipelines`` sets them all); a device killed mid-apply comes up on the last
revision judged healthy (config_state.py).
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..errors import ConfigError, ConfigTooLarge, EdgeInferError, UpdateRejected
from ..link.config_document import parse_document
from ..link.vocabulary import DeploymentKind, EventKind, TargetState
from ..pipeline import live_options
from ..updates.signing import Manifest
from .commands import CommandContext
from .config import AgentConfig, parse_config
from .config_apply import Plan, apply_changes, judge, judged, plan_changes, progress_marks
from .config_check import check_configuration, source_problems
from .config_state import ConfigurationState, Revision
from .deploy_kinds import UpdateReport, downloads_for
from .services import AgentServices

log = logging.getLogger(__name__)


def _words(error: Exception, prefix: str) -> str:
    """An error's text without the file name a config error starts with (the manager's words have none)."""
    text = " ".join(str(error).split())
    return text[len(prefix):] if text.startswith(prefix) else text


def preview(bootstrap: AgentConfig) -> tuple[AgentConfig, dict[str, Any]]:
    """What the agent would run (``agent --check``), read only: the applied revision over agent.yaml, or agent.yaml;
    and the precedence in words — which keys come from the fleet's revision and which from agent.yaml."""
    updates = ConfigUpdates(bootstrap)
    applied = updates.state.applied
    config = bootstrap
    if applied is not None:
        try:
            config, updates.running = updates.candidate(applied), applied
        except ConfigError as exc:
            log.warning("configuration revision %d does not run over agent.yaml (%s): agent.yaml's is run",
                        applied.revision, exc)
    described = updates.describe()
    fleet_keys = set(described["keys"])
    described["agent_yaml_keys"] = sorted(set(bootstrap.data) - fleet_keys)
    if updates.state.trial is not None:
        described["note"] = (f"revision {updates.state.trial.revision} was being applied when the agent stopped: "
                             f"the next start rolls it back")
    return config, described


class ConfigUpdates:
    """The ``config`` kind's handler (agent/deploy_kinds.py ``KindHandler``) and the revisions' state."""

    def __init__(self, bootstrap: AgentConfig) -> None:
        #: agent.yaml as read at start: a revision is laid over it, and it is what runs without one
        self.bootstrap = bootstrap
        self.state = ConfigurationState(bootstrap.data_dir)
        #: the configuration the agent runs (agent.yaml, or an applied revision over it)
        self.current = bootstrap
        #: the revision it runs (None: agent.yaml alone)
        self.running: Revision | None = None
        #: a revision the agent was applying when it stopped, rolled back at this start (reported once started)
        self.recovered: Revision | None = None
        self._lock = threading.Lock()

    # -- start ---------------------------------------------------------------------------------------
    def effective(self) -> AgentConfig:
        """At start, before any pipeline: a trial left by an agent killed mid-apply is rolled back (config_state.py);
        the configuration to run is the applied revision over agent.yaml, or agent.yaml alone."""
        self.recovered = self.state.recover()
        applied = self.state.applied
        if applied is not None:
            try:
                self.current, self.running = self.candidate(applied), applied
            except ConfigError as exc:  # agent.yaml changed under it, a file it names is gone: agent.yaml holds
                log.error("configuration revision %d cannot run over agent.yaml (%s): running agent.yaml's",
                          applied.revision, exc)
                self.state.refuse(applied, "invalid_config", _words(exc, f"revision {applied.revision}: "))
        return self.current

    def start(self, agent: AgentServices) -> None:
        """Once the agent runs: say that a revision was rolled back because the agent stopped while applying it."""
        trial = self.recovered
        if trial is not None and trial.deployment_id:
            refused = self.state.refused or {}
            agent.emit(EventKind.UPDATE, "error", f"configuration revision {trial.revision}: rolled_back (interrupted)",
                       data={"deployment_id": trial.deployment_id, "state": TargetState.ROLLED_BACK.value,
                             "version": trial.revision, "kind": DeploymentKind.CONFIG.value, "reason": "interrupted",
                             "detail": refused.get("detail"), "revision": self.describe()["revision"]})

    def candidate(self, revision: Revision) -> AgentConfig:
        """agent.yaml with the revision's keys laid over it, read as agent.yaml is (ConfigError names the key, after
        ``revision N:``); relative paths are relative to agent.yaml's folder."""
        base = self.bootstrap.path.resolve().parent if self.bootstrap.path is not None else Path.cwd()
        config = parse_config({**self.bootstrap.data, **revision.document}, file=f"revision {revision.revision}",
                              base=base)
        return dataclasses.replace(config, path=self.bootstrap.path)

    def describe(self) -> dict[str, Any]:
        """The ``state`` message's ``config``: what runs (revision and sha256, None: agent.yaml), which keys the
        revision sets, the revision on trial, and the last one refused or rolled back with its reason."""
        running = self.running
        trial = self.state.trial
        return {"revision": running.revision if running else None, "sha256": running.sha256 if running else None,
                "deployment_id": running.deployment_id if running else None,
                "source": "fleet" if running else "agent.yaml",
                "keys": sorted(running.document) if running else [],
                "trial": trial.summary() if trial is not None else None, "refused": self.state.refused}

    # -- the kind ------------------------------------------------------------------------------------
    def running_version(self, args: Mapping[str, Any]) -> int | None:
        """The revision the device runs: a newer one is taken, an older one only as a rollback."""
        return self.running.revision if self.running is not None else None

    def deploy(self, manifest: Manifest, args: Mapping[str, Any], ctx: CommandContext) -> dict[str, Any]:
        """Download the revision's document (resumed, sha256 checked) and apply it (:meth:`apply_staged`)."""
        arrived = time.monotonic()
        report = UpdateReport.of(ctx.agent, manifest, ctx.command_id, label=f"configuration {manifest.version}")
        report(TargetState.DOWNLOADING)
        target = self.state.folder / "incoming" / f"{manifest.sha256}.json"
        try:
            staged = downloads_for(self.bootstrap, args).fetch(manifest, target)
        except EdgeInferError as exc:  # refused, or a download that never completed
            return report.failed(exc)
        try:
            return self.apply_staged(manifest, staged, ctx, report=report, arrived=arrived)
        finally:
            staged.unlink(missing_ok=True)  # the state file keeps the document

    def rollback(self, args: Mapping[str, Any], ctx: CommandContext) -> dict[str, Any]:
        """Back to the revision before the one running (agent.yaml alone when there was none), applied the same way
        (only what differs changes), without a gate: it ran before."""
        with self._lock:
            previous = self.state.previous
            if self.running is None:
                raise UpdateRejected("no_previous", "this device runs agent.yaml's configuration: nothing to roll back")
            target = self.candidate(previous) if previous is not None else self.bootstrap
            apply_changes(ctx.agent, plan_changes(self.current, target), self.current, target)
            self.state.step_back()
            self.current, self.running = target, previous
        ctx.agent.state_changed()
        back = previous.revision if previous is not None else None
        ctx.agent.emit(EventKind.UPDATE, "warning", f"configuration rolled back to {back or 'agent.yaml'}",
                       cmd_id=ctx.command_id, data={"state": TargetState.ROLLED_BACK.value, "version": back,
                                                    "kind": DeploymentKind.CONFIG.value})
        return {"state": TargetState.ACTIVE.value, "revision": back}

    # -- a revision ----------------------------------------------------------------------------------
    def apply_staged(self, manifest: Manifest, staged: Path, ctx: CommandContext, *,
                     report: UpdateReport | None = None, arrived: float | None = None) -> dict[str, Any]:
        """Check, apply and judge the revision in ``staged`` (the document ``manifest`` signs, downloaded): the state
        it ended in (``active``, ``failed``: refused, nothing changed; ``rolled_back``: it failed its gate)."""
        agent = ctx.agent
        report = report or UpdateReport.of(agent, manifest, ctx.command_id, label=f"configuration {manifest.version}")
        arrived = time.monotonic() if arrived is None else arrived
        with self._lock:
            report(TargetState.VALIDATING, step="checking")
            payload = staged.read_bytes()
            revision = Revision(manifest.version, hashlib.sha256(payload).hexdigest(), {}, manifest.deployment_id,
                                time.time())
            try:
                revision, target, plan = self._check(revision, payload, agent)
            except UpdateRejected as refused:
                self.state.refuse(revision, refused.reason, refused.detail)
                agent.state_changed()
                report(TargetState.FAILED, "error", refused.reason, detail=refused.detail)
                return {"state": TargetState.FAILED.value, "reason": refused.reason, "detail": refused.detail}
            return self._trial(agent, report, revision, target, plan, arrived)

    def _check(self, revision: Revision, payload: bytes, agent: AgentServices) -> tuple[Revision, AgentConfig, Plan]:
        """The revision with its document, the configuration it makes and the plan; UpdateRejected (nothing changed)
        when it cannot run."""
        try:
            document = parse_document(payload)
        except ConfigTooLarge as exc:
            raise UpdateRejected("too_large", str(exc)) from None
        except ConfigError as exc:
            raise UpdateRejected("invalid_document", str(exc)) from None
        revision = dataclasses.replace(revision, document=document)
        try:
            target = self.candidate(revision)
        except ConfigError as exc:
            raise UpdateRejected("invalid_config", _words(exc, f"revision {revision.revision}: ")) from None
        plan = plan_changes(self.current, target)
        self._check_device(target, plan, agent)
        return revision, target, plan

    def _check_device(self, target: AgentConfig, plan: Plan, agent: AgentServices) -> None:
        """What the device must do for ``plan``: the models of pipelines added or restarted read (as --check reads
        them), the sources no pipeline holds now opened, each live change checked against the running model."""
        index = {p.name: i for i, p in enumerate(target.pipelines)}
        prefix = f"{target.path or 'config'}: "
        changed = [c for c in plan.pipelines if c.kind in ("added", "restart", "live")]
        for change in plan.of("live"):
            pipeline = agent.runner(change.name).pipeline
            if pipeline is not None:
                try:
                    live_options.check(pipeline, target.pipelines[index[change.name]].options)
                except ValueError as exc:
                    words = f"pipelines[{index[change.name]}]: {_words(exc, '')}"
                    raise UpdateRejected("invalid_config", words) from None
        held = {source for p in self.current.pipelines for source in _sources(p)}
        rebuilt = [index[c.name] for c in changed if c.kind != "live"]
        try:
            found = check_configuration(target, rebuilt, skip_sources=held)
        except ConfigError as exc:
            raise UpdateRejected("model_failed", _words(exc, prefix)) from None
        for entry in found["models"]:
            if "layout" not in entry:  # no delegate of this device loads it: the pipeline could not run
                raise UpdateRejected("model_failed", "; ".join(entry.get("warnings", [])))
        reopened = [index[c.name] for c in plan.of("live") if c.open]
        problems = found["sources"] + (source_problems(target, reopened, skip=held) if reopened else [])
        if problems:
            raise UpdateRejected("source_failed", problems[0])

    def _trial(self, agent: AgentServices, report: UpdateReport, revision: Revision, target: AgentConfig, plan: Plan,
               arrived: float) -> dict[str, Any]:
        """Write the trial, change what changes, judge it; commit, or put the previous configuration back."""
        self.state.begin_trial(revision)
        agent.state_changed()
        before = progress_marks(agent)
        report(TargetState.VALIDATING, step="applying", changes=plan.summary())
        previous, began = self.current, time.time()
        apply_changes(agent, plan, previous, target)
        self.current = target
        applied_s = time.monotonic() - arrived
        report(TargetState.VALIDATING, step="health_gate", apply_s=round(applied_s, 3))
        healthy, reason = judge(agent, judged(plan, before), progress_marks(agent), since=began)
        if healthy:
            self.state.commit()
            self.running = revision
            agent.state_changed()
            timings = {"apply_s": round(applied_s, 3), "healthy_s": round(time.monotonic() - arrived, 3)}
            report(TargetState.ACTIVE, changes=plan.summary(), sha256=revision.sha256, **timings)
            return {"state": TargetState.ACTIVE.value, "revision": revision.revision, **timings}
        code, _, detail = (reason or "health_gate").partition(": ")
        back = plan_changes(target, previous)
        apply_changes(agent, back, target, previous)
        self.current = previous
        self.state.abandon(code, detail or code)
        agent.state_changed()
        report(TargetState.ROLLED_BACK, "error", code, detail=detail, changes=back.summary())
        return {"state": TargetState.ROLLED_BACK.value, "reason": code, "detail": detail}


def _sources(pipeline: Any) -> list[Any]:
    return [s.source for s in pipeline.sources] if pipeline.sources else [pipeline.source]


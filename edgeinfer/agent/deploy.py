"""The agent's ``deploy`` and ``rollback`` commands: signed updates of every deployment kind, applied with rollback.

:class:`UpdateService` takes the command, checks what every kind shares — the manifest's signature and expiry,
its kind (``unknown_kind`` for one this agent cannot install), replay and downgrade (against what runs of that
kind: :func:`~edgeinfer.updates.updater.admit`) — and hands it to the kind's :class:`KindHandler`
(:meth:`UpdateService.register_kind`). Built in: ``model`` (:class:`ModelUpdates`, below) and ``agent``
(:class:`~.deploy_agent.AgentUpdates`). A model update::

    download into the inactive slot (resume, sha256) ─► validate in a subprocess ─► trial: swap the engine into
    the running pipeline (capture keeps going) ─► health gate on live frames (finite results, latency within a
    factor of the old model) ─► commit  |  swap the old engine back and discard the trial

Every step is reported as an ``update`` event carrying the deployment id and the state
(``downloading``, ``validating``, ``active``, ``failed``, ``rolled_back``); a refusal before the
download is a ``cmd_rejected`` event whose reason names the check that failed.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ..errors import EdgeInferError, ModelError, UpdateRejected
from ..link.vocabulary import Command, DeploymentKind, EventKind, TargetState
from ..runtime.model import inspect_model
from ..updates.health import HealthGate, result_is_finite
from ..updates.signing import Manifest, VerifyKey
from ..updates.slots import InstalledModel, ModelSlots
from ..updates.updater import Updater, admit
from .commands import CommandContext, CommandRouter
from .config import AgentConfig
from .deploy_kinds import KindHandler, UpdateReport, download_settings
from .runner import PipelineRunner
from .services import AgentServices

log = logging.getLogger(__name__)

DEPLOY_ARGS_SCHEMA = {
    "type": "object", "required": ["manifest", "signature"], "additionalProperties": False,
    "properties": {"manifest": {"type": "object"}, "signature": {"type": "string", "maxLength": 512},
                   "pipeline": {"type": "string", "minLength": 1, "maxLength": 64},
                   # a short-lived download grant for the artifact (fleet/auth.py issue_grant)
                   "grant": {"type": "string", "maxLength": 512, "pattern": "^[A-Za-z0-9._-]+$"}},
}
ROLLBACK_ARGS_SCHEMA = {
    "type": "object", "additionalProperties": False,
    "properties": {"pipeline": {"type": "string", "minLength": 1, "maxLength": 64},
                   # what to go back on: a model (the default) or the agent itself
                   "kind": {"enum": [kind.value for kind in DeploymentKind]}},
}
#: seconds the health gate waits for its frames before it calls the new model unhealthy
HEALTH_GATE_TIMEOUT_S = 60.0


def _version_number(text: str | None) -> int:
    return int(text) if text and str(text).isdigit() else 0


class UpdateService:
    """The ``deploy`` and ``rollback`` commands for every kind; the model kind's slots (of the agent's updatable
    pipeline: the first, unless a command names another)."""

    def __init__(self, config: AgentConfig) -> None:
        from .deploy_agent import AgentUpdates

        self.config = config
        self.slots = ModelSlots(config.data_dir)  # also the record of every deployment id handled (replays)
        self.key = VerifyKey.from_config_value(config.update_public_key) if config.update_public_key else None
        self._lock = threading.Lock()
        self.model = ModelUpdates(self)
        self.agent = AgentUpdates(config)
        self._kinds: dict[DeploymentKind, KindHandler] = {DeploymentKind.MODEL: self.model,
                                                          DeploymentKind.AGENT: self.agent}

    def register_kind(self, kind: DeploymentKind, handler: KindHandler) -> None:
        """Install deployments of ``kind`` with ``handler`` (a kind without one is refused: ``unknown_kind``)."""
        self._kinds[DeploymentKind(kind)] = handler

    def handler(self, word: str | None) -> KindHandler:
        """The handler of a manifest's kind; UpdateRejected('unknown_kind') when this agent has none."""
        try:
            kind = DeploymentKind.of(word)
        except ValueError:
            raise UpdateRejected("unknown_kind", f"this agent does not know deployments of kind {word!r}") from None
        found = self._kinds.get(kind)
        if found is None:
            raise UpdateRejected("unknown_kind", f"this agent cannot install a deployment of kind {kind.value!r}")
        return found

    def start(self, agent: AgentServices) -> None:
        """After the agent opened: the agent kind reports what its launcher decided, and judges a trial."""
        self.agent.start(agent)

    def register(self, router: CommandRouter) -> None:
        """Add the ``deploy`` and ``rollback`` commands to the agent's router."""
        router.register(Command.DEPLOY, self.handle_deploy, args_schema=DEPLOY_ARGS_SCHEMA,
                        description="install a signed update of any deployment kind (a model: download, validate, "
                                    "swap, health gate)")
        router.register(Command.ROLLBACK, self.handle_rollback, args_schema=ROLLBACK_ARGS_SCHEMA,
                        description="go back to the previous model (or agent)", on_queued=self.rollback_queued)

    def handle_deploy(self, args: Mapping[str, Any], ctx: CommandContext) -> dict[str, Any]:
        """``deploy``: the checks every kind shares, then the kind's handler; the state it ended in."""
        if self.key is None:
            raise UpdateRejected("updates_disabled", "this agent pins no update_public_key")
        with self._lock:
            manifest = self.key.verify(dict(args["manifest"]), str(args["signature"]))
            handler = self.handler(manifest.kind)
            admit(manifest, seen=self.slots.seen(manifest.deployment_id), running_version=handler.running_version(args))
            self.slots.remember(manifest.deployment_id)  # a replay is refused from here on
            return handler.deploy(manifest, args, ctx)

    def handle_rollback(self, args: Mapping[str, Any], ctx: CommandContext) -> dict[str, Any]:
        """``rollback``: back to what ran before, of the kind the command names (a model by default)."""
        return self.handler(args.get("kind")).rollback(args, ctx)

    def rollback_queued(self, args: Mapping[str, Any]) -> None:
        """A verified rollback waits behind the deploy being handled: tell its kind, which may end a trial."""
        request = getattr(self.handler(args.get("kind")), "request_rollback", None)
        if request is not None:
            request()

    # the model kind's parts the agent uses at start and in its state
    def installed_config(self, config: AgentConfig) -> AgentConfig:
        return self.model.installed_config(config)

    def describe(self, pipeline: str | None) -> dict[str, Any]:
        return self.model.describe(pipeline)

    def state_sections(self, pipelines: Sequence[Any]) -> dict[str, Any]:
        """The ``state`` message's ``slots`` (the first pipeline's models) and ``agent`` (under a launcher)."""
        sections: dict[str, Any] = {"slots": self.describe(pipelines[0].name)} if pipelines else {}
        agent = self.agent.describe()
        return sections | ({"agent": agent} if agent is not None else {})


class ModelUpdates:
    """The ``model`` kind: the model slots of the agent's updatable pipeline."""

    def __init__(self, service: UpdateService) -> None:
        self.config = service.config
        self.slots = service.slots
        self.key = service.key
        self._lock = threading.Lock()  # one update or rollback at a time
        # a rollback that arrives during an update's trial ends the trial (the committed model stays) rather than
        # waiting out its health gate; the trial says it ended so, and the rollback then has nothing left to undo
        self._rollback_requested = threading.Event()
        self._updating = False
        self._trial_ended_by_rollback = False

    # -- start-up ------------------------------------------------------------------------------
    def installed_config(self, config: AgentConfig) -> AgentConfig:
        """The config with the committed model of the first pipeline (after an update, or a crash mid-update)."""
        if not config.pipelines:
            return config
        first = config.pipelines[0]
        try:
            configured = inspect_model(first.model)
        except ModelError as exc:  # the pipeline's start reports it, and the agent exits 78 (agent/model_check.py)
            log.error("pipeline %s: %s", first.name, exc)
            return config
        state = self.slots.configured
        if state is None or state.get("sha256") != configured.sha256:
            # first start, or the operator put another model in the config: that is the baseline now
            self.slots.reset_to(first.model, name=Path(first.model).name, version=_version_number(first.version),
                                sha256=configured.sha256)
            return config
        active = self.slots.active
        if active is None or active.sha256 == configured.sha256:
            return config
        updated = dataclasses.replace(first, model=active.path, version=str(active.version))
        log.info("pipeline %s runs the updated model v%s (%s)", first.name, active.version, active.path)
        return dataclasses.replace(config, pipelines=(updated, *config.pipelines[1:]))

    def describe(self, pipeline: str | None) -> dict[str, Any]:
        """The ``slots`` of the state message: what runs and what a rollback would go back to."""

        def model(installed: InstalledModel | None) -> dict[str, Any] | None:
            if installed is None:
                return None
            return {"name": installed.name, "version": installed.version, "sha256": installed.sha256}

        return {"pipeline": pipeline, "active": model(self.slots.active), "previous": model(self.slots.previous)}

    # -- commands ------------------------------------------------------------------------------
    def running_version(self, args: Mapping[str, Any]) -> int | None:
        active = self.slots.active
        return active.version if active is not None else None

    def deploy(self, manifest: Manifest, args: Mapping[str, Any], ctx: CommandContext) -> dict[str, Any]:
        """Download, validate and trial a signed model; the state it ended in."""
        agent = ctx.agent
        runner = self._runner(agent, args.get("pipeline"))
        updater = updater_for(self.config, self.slots, self.key, args, delegate=runner.config.delegate)
        with self._lock:
            self._rollback_requested.clear()
            self._updating, self._trial_ended_by_rollback = True, False
            try:
                return self._update(agent, runner, updater, manifest, ctx)
            finally:
                self._updating = False

    def _update(self, agent: AgentServices, runner: PipelineRunner, updater: Updater, manifest: Manifest,
                ctx: CommandContext) -> dict[str, Any]:
        report = UpdateReport.of(agent, manifest, ctx.command_id, runner.name)
        report(TargetState.DOWNLOADING)
        try:
            staged = updater.download(manifest)
            report(TargetState.VALIDATING)
            updater.validate(staged)
        except EdgeInferError as exc:  # refused, or a download that never completed
            return report.failed(exc)
        if self._rollback_requested.is_set():  # rolled back before its trial began: the new model never runs
            self._trial_ended_by_rollback = True
            verdict, reason = False, "rollback_requested"
        else:
            verdict, reason = self._trial(agent, runner, staged)
        if verdict:
            report(TargetState.ACTIVE)
            return {"state": TargetState.ACTIVE.value, "version": manifest.version}
        report(TargetState.ROLLED_BACK, "error", reason)
        return {"state": TargetState.ROLLED_BACK.value, "reason": reason}

    def rollback(self, args: Mapping[str, Any], ctx: CommandContext) -> dict[str, Any]:
        """``rollback``: swap the previous model back into the running pipeline and commit it."""
        runner = self._runner(ctx.agent, args.get("pipeline"))
        with self._lock:
            if self._trial_ended_by_rollback:
                return self._kept_committed(runner, ctx)
            previous = self.slots.previous
            if previous is None:
                raise UpdateRejected("no_previous", "there is no previous model to roll back to")
            engine = self._load(runner, previous.path)
            try:
                old = runner.swap_engine(engine, version=str(previous.version))
            except BaseException:
                engine.close()
                raise
            self.slots.roll_back()
            old.close()
        ctx.agent.state_changed()  # its slots: what runs, what a rollback would go back to
        ctx.agent.emit(EventKind.UPDATE, "warning", f"rolled back to v{previous.version}", pipeline=runner.name,
                       cmd_id=ctx.command_id,
                       data={"state": TargetState.ROLLED_BACK.value, "version": previous.version})
        return {"state": TargetState.ACTIVE.value, "version": previous.version}

    def request_rollback(self) -> None:
        """A signed rollback was queued (called on the MQTT thread): an update's trial in progress ends at its next
        look, keeping the committed model, instead of the rollback waiting out its health gate."""
        if self._updating:
            self._rollback_requested.set()

    def _kept_committed(self, runner: PipelineRunner, ctx: CommandContext) -> dict[str, Any]:
        """The rollback ended an update's trial: the model committed before it runs, which is what was asked."""
        self._trial_ended_by_rollback = False
        active = self.slots.active
        version = active.version if active is not None else None
        ctx.agent.emit(EventKind.UPDATE, "warning", f"rollback ended the update's trial: v{version} kept",
                       pipeline=runner.name, cmd_id=ctx.command_id,
                       data={"state": TargetState.ROLLED_BACK.value, "version": version})
        return {"state": TargetState.ACTIVE.value, "version": version}

    # -- the trial -----------------------------------------------------------------------------
    def _trial(self, agent: AgentServices, runner: PipelineRunner, staged: InstalledModel) -> tuple[bool, str | None]:
        """Swap ``staged`` in, watch live frames, then commit or swap the old engine back."""
        pipeline = runner.pipeline
        if pipeline is None:
            return False, "pipeline_not_running"
        try:
            engine = self._load(runner, staged.path)
        except EdgeInferError as exc:
            return False, f"load_failed: {exc}"
        stats = runner.stats()
        baseline = (stats.stages.get("infer") or {}).get("p50") if stats is not None else None
        gate = HealthGate(frames=self.config.update_health_frames, baseline_infer_ms=baseline,
                          max_factor=self.config.update_max_latency_factor)
        verdict: list[bool] = []
        decided = threading.Event()
        swapped_at = [float("inf")]

        def observe(result: Any) -> None:
            if decided.is_set() or result.timestamp < swapped_at[0]:
                return  # frames captured before the swap ran on the old engine
            outcome = gate.observe(float(result.timings.infer), result_is_finite(result.result))
            if outcome is not None:
                verdict.append(outcome)
                decided.set()

        self.slots.begin_trial(staged)
        old_version = runner.model.get("version")
        pipeline.add_observer(observe)
        try:
            swapped_at[0] = time.time()
            try:
                old_engine = runner.swap_engine(engine, version=str(staged.version))
            except (EdgeInferError, ValueError) as exc:  # the pipeline cannot take it: nothing changed
                engine.close()
                self.slots.abandon_trial()
                return False, f"swap_failed: {exc}"
            deadline = time.monotonic() + HEALTH_GATE_TIMEOUT_S
            while not decided.wait(0.2):
                if self._rollback_requested.is_set():  # the fleet judged it already: back to the committed model
                    gate.reason = "rollback_requested"
                    self._trial_ended_by_rollback = True
                    verdict.append(False)
                    break
                if agent.stopping:  # shutting down mid-trial: the old model stays committed
                    gate.reason = "agent_stopping"
                    verdict.append(False)
                    break
                if time.monotonic() > deadline:
                    gate.reason = gate.reason or f"no_frames: under {gate.frames} in {HEALTH_GATE_TIMEOUT_S:.0f} s"
                    verdict.append(False)
                    break
        finally:
            pipeline.remove_observer(observe)
        if verdict and verdict[0]:
            self.slots.commit()
            old_engine.close()
            agent.state_changed()  # the slots moved: the state says so
            return True, None
        runner.swap_engine(old_engine, version=old_version)
        engine.close()
        self.slots.abandon_trial()
        return False, gate.reason or "health_gate"

    @staticmethod
    def _load(runner: PipelineRunner, path: str):
        from ..runtime.selection import load

        return load(path, runner.config.delegate, threads=runner.config.threads)

    @staticmethod
    def _runner(agent: AgentServices, name: str | None) -> PipelineRunner:
        if name:
            return agent.runner(name)
        runners = agent.runners
        if not runners:
            raise UpdateRejected("no_pipeline", "this agent runs no pipeline to update")
        return runners[0]


def updater_for(config: AgentConfig, slots: ModelSlots, key: VerifyKey | None, args: Mapping[str, Any], *,
                delegate: str | None = None) -> Updater:
    """A model update's steps up to the trial, with the command's downloads."""
    assert key is not None  # UpdateService refuses a deploy without one
    return Updater(slots, key, delegate=delegate, validate_timeout_s=config.update_validate_timeout_s,
                   **download_settings(config, args))

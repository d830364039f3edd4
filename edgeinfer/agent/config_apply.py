"""A configuration revision put in place on a running agent, changing only what changed, then judged.

:func:`plan_changes` compares the configuration the agent runs with the revision's, pipeline by pipeline (by name):

- a pipeline only the revision has is **added** (a runner started beside the others); one it lacks is **removed**
  (its runner stopped); the others are not touched;
- a pipeline whose changes are all options a running run takes (pipeline/live_options.py: ``score_threshold`` and
  the decoder's other thresholds, ``max_fps``, ``lines``, ``zones``, ``events``, ``capture`` and their settings) is
  changed **live**: ``MultiPipeline.reconfigure``, between two batches, every stream going on (its frame ids too);
- a changed ``source``, or streams of ``sources`` added, removed or changed, **reopen** those streams only: the
  others keep their frames;
- anything else — ``model``, ``task``, ``decoder``, ``delegate``, ``labels``, a camera's settings, ``batch``,
  ``version``, ``source`` becoming ``sources`` — **restarts** that one pipeline with the revision's entry.

:func:`apply_changes` does it on the agent (removed first, so a camera a removed pipeline held is free), and
:func:`judge` is the health gate: every pipeline the revision touched, and every other one that was running, must be
running and have produced :data:`CONFIG_HEALTH_RESULTS` results since the change,
within :data:`CONFIG_HEALTH_WINDOW_S`.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..errors import EdgeInferError
from ..pipeline.live_options import restart_needed
from ..pipeline.options import PipelineOptions
from .analytics_command import forget_geometry

if TYPE_CHECKING:
    from .config import AgentConfig
    from .pipeline_config import PipelineConfig
    from .runner import PipelineRunner
    from .services import AgentServices

log = logging.getLogger(__name__)

#: seconds after a revision is in place within which every judged pipeline must be running and producing results
CONFIG_HEALTH_WINDOW_S = 30.0
#: results each judged pipeline must produce after the change (a pipeline at max_fps 3: one second)
CONFIG_HEALTH_RESULTS = 3
#: keys of a pipeline entry that a running pipeline takes as they are (no run changes: the runner's own)
_RUNNER_KEYS = {"restart"}
#: the agent's own keys the fleet sets, each applied at once (the main loop reads it every tick)
AGENT_KEYS = ("telemetry_interval_s",)


@dataclass
class PipelineChange:
    """What a revision does to one pipeline: ``kind`` is added, removed, restart, live or unchanged; ``keys`` the
    entry's keys that changed; ``streams`` the streams to close and to open (live only); ``config`` the new entry."""

    name: str
    kind: str
    keys: tuple[str, ...] = ()
    config: PipelineConfig | None = None
    close: tuple[str, ...] = ()
    open: tuple[str, ...] = ()

    def summary(self) -> dict[str, Any]:
        out: dict[str, Any] = {"pipeline": self.name, "change": self.kind, "keys": list(self.keys)}
        if self.close or self.open:
            out["streams"] = {"closed": list(self.close), "opened": list(self.open)}
        return out


@dataclass
class Plan:
    """Every pipeline's change, and the agent keys that change (``{key: value}``)."""

    pipelines: list[PipelineChange] = field(default_factory=list)
    agent: dict[str, Any] = field(default_factory=dict)

    def of(self, kind: str) -> list[PipelineChange]:
        return [change for change in self.pipelines if change.kind == kind]

    def summary(self) -> dict[str, Any]:
        """What the ``update`` event says was done: each pipeline's change (unchanged ones left out)."""
        return {"pipelines": [c.summary() for c in self.pipelines if c.kind != "unchanged"], "agent": self.agent}


def _streams(config: PipelineConfig) -> dict[str, Any]:
    return {s.name: s.source for s in config.sources} if config.sources else {"": config.source}


def pipeline_change(old: PipelineConfig, new: PipelineConfig) -> PipelineChange:
    """How ``old`` (what runs) becomes ``new`` (the revision's entry of the same name)."""
    keys = tuple(f.name for f in dataclasses.fields(new) if getattr(old, f.name) != getattr(new, f.name))
    if not keys:
        return PipelineChange(new.name, "unchanged", config=new)
    options = set(PipelineOptions.names())
    agent_keys = set(keys) - options - _RUNNER_KEYS - {"source", "sources"}
    shape_changed = bool(old.sources) != bool(new.sources)  # source became sources, or back
    if agent_keys or shape_changed or restart_needed(old.options, new.options):
        return PipelineChange(new.name, "restart", keys, new)
    before, after = _streams(old), _streams(new)
    close = tuple(name for name in before if name not in after or before[name] != after[name])
    opened = tuple(name for name in after if name not in before or before[name] != after[name])
    return PipelineChange(new.name, "live", keys, new, close, opened)


def plan_changes(old: AgentConfig, new: AgentConfig) -> Plan:
    """What turns the configuration ``old`` (the agent runs it) into ``new`` (a revision's)."""
    running = {p.name: p for p in old.pipelines}
    wanted = {p.name: p for p in new.pipelines}
    plan = Plan(agent={key: getattr(new, key) for key in AGENT_KEYS if getattr(old, key) != getattr(new, key)})
    plan.pipelines += [PipelineChange(name, "removed") for name in running if name not in wanted]
    for name, config in wanted.items():
        plan.pipelines.append(pipeline_change(running[name], config) if name in running
                              else PipelineChange(name, "added", (), config))
    return plan


def carried_model(change: PipelineChange, runner: PipelineRunner | None, old: PipelineConfig | None) -> PipelineConfig:
    """The revision's entry, on the model the runner runs when the revision does not change the configured model (a
    model deployment may have put another one in place: it stays)."""
    config = change.config
    assert config is not None
    if runner is None or old is None or (old.model, old.version) != (config.model, config.version):
        return config
    return dataclasses.replace(config, model=runner.config.model, version=runner.config.version)


# ------------------------------------------------------------------------------------------ applying

def apply_changes(agent: AgentServices, plan: Plan, old: AgentConfig, new: AgentConfig) -> None:
    """Put ``plan`` in place: removed pipelines stopped, changed ones changed live / reopened / restarted, added ones
    started, the agent's keys taken."""
    running = {p.name: p for p in old.pipelines}
    for change in plan.pipelines:  # the revision's lines and zones replace what set_analytics kept
        if change.kind in ("removed", "added") or {"lines", "zones"} & set(change.keys):
            forget_geometry(new.data_dir, change.name)
    for change in plan.of("removed"):
        agent.remove_pipeline(change.name)
    for change in plan.pipelines:
        if change.kind in ("restart", "live"):
            runner = agent.runner(change.name)
            config = carried_model(change, runner, running.get(change.name))
            if change.kind == "restart":
                runner.config = config
                runner.request_restart()
            else:
                _change_live(runner, change, config)
    for change in plan.of("added"):
        assert change.config is not None
        agent.add_pipeline(change.config)
    if plan.agent:
        agent.use_agent_keys(new)


def _change_live(runner: PipelineRunner, change: PipelineChange, config: PipelineConfig) -> None:
    """The running run takes the new options and reopens the streams that changed; a run that cannot (or none is
    running) starts again with the new entry."""
    pipeline = runner.pipeline
    runner.config = config
    if pipeline is None:
        runner.request_restart()  # between two runs: the next takes the entry now
        return
    try:
        pipeline.reconfigure(config.options)
        if config.events:
            runner.follow_events(pipeline)
        for name in change.close:
            try:
                pipeline.remove_stream(name)
            except KeyError:  # failed and waiting to be opened again: nothing to close
                pass
        sources = _streams(config)
        for name in change.open:
            pipeline.add_stream(name, sources[name])
    except (EdgeInferError, ValueError) as exc:
        log.warning("pipeline %s: the change could not be made live (%s): restarting it", change.name, exc)
        runner.request_restart()


# ------------------------------------------------------------------------------------------ the gate

def progress_marks(agent: AgentServices) -> dict[str, tuple[int, int]]:
    """Each running pipeline's run and results so far (before a change): what the gate counts from."""
    marks = {}
    for runner in agent.runners:
        pipeline = runner.pipeline
        if pipeline is not None:
            marks[runner.name] = (id(pipeline), pipeline.delivered)
    return marks


def judged(plan: Plan, before: dict[str, tuple[int, int]]) -> list[str]:
    """The pipelines the gate judges: every one the revision added or changed, and every other one that was running
    before it (one already failed or ended, and untouched, is not the revision's doing)."""
    return [c.name for c in plan.pipelines if c.kind in ("added", "restart", "live")
            or (c.kind == "unchanged" and c.name in before)]


def judge(agent: AgentServices, names: list[str], marks: dict[str, tuple[int, int]], *, since: float,
          window_s: float = CONFIG_HEALTH_WINDOW_S, results: int = CONFIG_HEALTH_RESULTS) -> tuple[bool, str | None]:
    """Wait until every pipeline of ``names`` is running with ``results`` results since its mark, or the window
    passes: (healthy, why not). A pipeline failing after the change (``since``, unix time) fails the gate at once."""
    deadline = time.monotonic() + window_s
    while True:
        waiting = []
        for name in names:
            runner = agent.runner(name)
            failed = _failed(runner, since)
            if failed:
                return False, failed
            if not _produced(runner, marks.get(name), results):
                waiting.append(name)
        if not waiting:
            return True, None
        if agent.stopping:
            return False, "agent_stopping"
        if time.monotonic() > deadline:
            return False, (f"no_results: pipeline(s) {', '.join(waiting)} produced fewer than {results} results in "
                           f"{window_s:g} s")
        time.sleep(0.05)


def _failed(runner: PipelineRunner, since: float) -> str | None:
    if runner.status in ("failed", "restarting") and runner.last_error and runner.failed_at >= since:
        return f"pipeline_failed: pipeline {runner.name}: {runner.last_error}"
    return None


def _produced(runner: PipelineRunner, mark: tuple[int, int] | None, results: int) -> bool:
    pipeline = runner.pipeline
    if pipeline is None or runner.status != "running":
        return False
    start = mark[1] if mark is not None and mark[0] == id(pipeline) else 0  # a new run counts from its start
    return pipeline.delivered - start >= results

"""The agent's pipeline runners as a set: built from the configuration at start, one added or removed while the
others run (a configuration revision: agent/config_apply.py), their telemetry windows taken together.

The list is replaced, never changed in place, so the main thread (telemetry, the state message) and the command
thread (a revision) each read a whole list without a lock.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .runner import PipelineFactory, PipelineRunner
from .telemetry import pipeline_entry

if TYPE_CHECKING:
    from .config import AgentConfig
    from .pipeline_config import PipelineConfig
    from .services import TelemetryFigures


class Runners:
    """The runners of one agent; ``make(config, on_config_error)`` builds a runner with the agent's reporting."""

    def __init__(self, make: Callable[[PipelineConfig, Any], PipelineRunner]) -> None:
        self._make = make
        self._all: tuple[PipelineRunner, ...] = ()

    def build(self, config: AgentConfig, on_config_error: Callable[[AgentConfig, int], Any]) -> None:
        """The runners of ``config``'s pipelines (not started): a first start that fails as configured exits 78."""
        self._all = tuple(self._make(p, on_config_error(config, i)) for i, p in enumerate(config.pipelines))

    @property
    def all(self) -> list[PipelineRunner]:
        return list(self._all)

    def get(self, name: str) -> PipelineRunner:
        """The runner of pipeline ``name``; ValueError lists the names."""
        for runner in self._all:
            if runner.name == name:
                return runner
        raise ValueError(f"no pipeline named {name!r} (have: {', '.join(r.name for r in self._all) or 'none'})")

    def add(self, config: PipelineConfig) -> PipelineRunner:
        """Start pipeline ``config`` beside the others (its failures restart it, as any runner's after its first
        start: a revision that fails is rolled back, it does not stop the agent)."""
        runner = self._make(config, None)
        self._all = (*self._all, runner)
        runner.start()
        return runner

    def remove(self, name: str) -> None:
        """Stop pipeline ``name`` and drop it; the others go on."""
        runner = self.get(name)
        self._all = tuple(r for r in self._all if r is not runner)
        runner.stop()

    def start(self) -> None:
        for runner in self._all:
            runner.start()

    def stop(self) -> None:
        """Stop every runner: all asked at once, then each waited for."""
        runners = self._all
        for runner in runners:
            runner.request_stop()
        for runner in runners:
            runner.stop()

    def windows(self, figures: TelemetryFigures) -> list[dict[str, Any]]:
        """Each pipeline's telemetry entry for this window; adds its frames and drops to the totals."""
        pipelines = []
        for runner in self._all:
            stats = runner.take_window()
            entry = pipeline_entry(runner.name, runner.status, stats, delegate=runner.delegate,
                                   restarts=runner.restarts, streams=[s.name for s in runner.config.sources])
            pipelines.append(entry)
            totals = figures.totals.setdefault(runner.name, {"frames": 0, "dropped": 0})
            totals["frames"] += entry["frames"]
            totals["dropped"] += entry["dropped"]
        return pipelines


__all__ = ["PipelineFactory", "Runners"]

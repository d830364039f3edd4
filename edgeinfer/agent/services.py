"""What the agent offers its plug-ins: command handlers, the update service and the /metrics collector.

Plug-ins are given an :class:`AgentServices`, never the :class:`~edgeinfer.agent.daemon.Agent`
itself, so they depend on this narrow interface and the runners' public methods only (and the
daemon can import them without an import cycle). :class:`Agent` satisfies it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from ..link.mqtt import MqttLink
from ..link.protocol import Topics
from ..link.spool import Spool
from ..link.vocabulary import EventKind
from .runner import PipelineRunner
from .telemetry import BootSequence

if TYPE_CHECKING:
    from .config import AgentConfig
    from .pipeline_config import PipelineConfig


@dataclass
class TelemetryFigures:
    """The latest telemetry message and cumulative figures, for /metrics (Prometheus counters only go up)."""

    latest: dict[str, Any] | None = None
    #: per pipeline: frames and dropped frames since the agent started
    totals: dict[str, dict[str, int]] = field(default_factory=dict)


@runtime_checkable
class AgentServices(Protocol):
    """The agent as its plug-ins see it."""

    @property
    def topics(self) -> Topics:
        """This device's MQTT topics (fleet and device id)."""

    @property
    def boot(self) -> BootSequence:
        """This agent start's boot id and message sequence numbers."""

    @property
    def figures(self) -> TelemetryFigures:
        """The latest telemetry window and cumulative counters."""

    @property
    def versions(self) -> Mapping[str, str | None]:
        """edgeinfer, Python, protocol and runtime versions, as the ``state`` message reports them."""

    @property
    def runners(self) -> list[PipelineRunner]:
        """The pipelines' runners, in config order."""

    @property
    def stopping(self) -> bool:
        """True once the agent was asked to stop: long command handlers should wrap up."""

    @property
    def spool(self) -> Spool | None:
        """The on-disk outbox (None before the agent opened)."""

    @property
    def link(self) -> MqttLink | None:
        """The MQTT link (None before the agent opened)."""

    def runner(self, name: str) -> PipelineRunner:
        """The runner of pipeline ``name``; ValueError lists the names."""

    def emit(self, event: EventKind | str, level: str, message: str, *, pipeline: str | None = None,
             cmd_id: str | None = None, data: Mapping[str, Any] | None = None) -> None:
        """Log an event and spool it for the ``events`` topic."""

    def state_changed(self) -> None:
        """Publish the retained ``state`` again soon: something it reports (the model slots) changed."""

    def add_pipeline(self, config: PipelineConfig) -> PipelineRunner:
        """Start a pipeline beside the others (a configuration revision adds it)."""

    def remove_pipeline(self, name: str) -> None:
        """Stop pipeline ``name`` and drop it; the others go on."""

    def use_agent_keys(self, config: AgentConfig) -> None:
        """Take the agent keys a fleet revision sets (``telemetry_interval_s``) from ``config``."""

    def request_exit(self, status: int) -> None:
        """Stop as :meth:`stop` would, and end the process with ``status`` (the launcher reads it: an agent update)."""

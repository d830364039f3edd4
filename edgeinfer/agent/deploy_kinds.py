"""What every kind of deployment shares on the device: how its steps are reported (:class:`UpdateReport`), the
interface of a kind's handler (:class:`KindHandler`, registered with ``UpdateService.register_kind`` in
:mod:`.deploy`), and how a deploy command's artifact is downloaded (:func:`downloads_for`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from ..errors import EdgeInferError, UpdateRejected
from ..link.vocabulary import DeploymentKind, EventKind, TargetState
from ..updates.signing import Manifest
from ..updates.updater import Downloads
from .commands import CommandContext
from .config import AgentConfig
from .services import AgentServices


@dataclass(frozen=True)
class UpdateReport:
    """How one deployment's steps are reported: ``update`` events with its id, the state and its version."""

    agent: AgentServices
    deployment_id: str
    version: int
    cmd_id: str | None
    pipeline: str | None = None
    kind: DeploymentKind = DeploymentKind.MODEL
    label: str | None = None

    @classmethod
    def of(cls, agent: AgentServices, manifest: Manifest, cmd_id: str | None, pipeline: str | None = None,
           label: str | None = None) -> UpdateReport:
        return cls(agent, manifest.deployment_id, manifest.version, cmd_id, pipeline,
                   DeploymentKind.of(manifest.kind), label)

    def __call__(self, state: TargetState, level: str = "info", reason: str | None = None, **extra: Any) -> None:
        data = {"deployment_id": self.deployment_id, "state": state.value, "version": self.version,
                **({"reason": reason} if reason else {}), **extra}
        if self.kind != DeploymentKind.MODEL:  # a model's events read as they did before kinds
            data["kind"] = self.kind.value
        what = self.label or f"v{self.version}"
        message = f"update to {what}: {state.value}" + (f" ({reason})" if reason else "")
        self.agent.emit(EventKind.UPDATE, level, message, pipeline=self.pipeline, cmd_id=self.cmd_id, data=data)

    def failed(self, exc: EdgeInferError) -> dict[str, Any]:
        """Report a deployment that failed before it ran — refused (``UpdateRejected``: its reason) or a download
        that never completed — and answer the state it ended in."""
        reason, detail = (exc.reason, exc.detail) if isinstance(exc, UpdateRejected) else ("download_failed", str(exc))
        self(TargetState.FAILED, "error", reason, detail=detail)
        return {"state": TargetState.FAILED.value, "reason": reason}


class KindHandler(Protocol):
    """What one kind of deployment does on the device (:meth:`UpdateService.register_kind`). The service has
    checked the manifest's signature, expiry, replay and downgrade before :meth:`deploy` runs."""

    def running_version(self, args: Mapping[str, Any]) -> int | None:
        """The version of this kind the device runs now (None: none), which a new one must be above."""

    def deploy(self, manifest: Manifest, args: Mapping[str, Any], ctx: CommandContext) -> dict[str, Any]:
        """Install the deployment, reporting each step (:class:`UpdateReport`); the state it ended in."""

    def rollback(self, args: Mapping[str, Any], ctx: CommandContext) -> dict[str, Any]:
        """Go back to what ran before the last deployment of this kind."""


def download_settings(config: AgentConfig, args: Mapping[str, Any]) -> dict[str, Any]:
    """How a deploy command's artifact is downloaded: the device's credential and CA (they also open the fleet
    manager's artifacts) and the command's grant."""
    mqtt = config.mqtt
    return {"credentials": (mqtt.username, mqtt.password or "") if mqtt.username else None, "cafile": mqtt.ca,
            "grant": args.get("grant"), "client_cert": client_cert(config)}


def client_cert(config: AgentConfig) -> tuple[str, str] | None:
    """The device's certificate and key files when its identity is a certificate (they open the manager too)."""
    mqtt = config.mqtt
    return (mqtt.cert, mqtt.key) if mqtt.cert and mqtt.key else None


def downloads_for(config: AgentConfig, args: Mapping[str, Any]) -> Downloads:
    return Downloads(**download_settings(config, args))

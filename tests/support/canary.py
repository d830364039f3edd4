"""What the canary-analysis tests share: telemetry rows made to order, a manager with a managed Mosquitto
and simulated devices that run deployed models as told, in-process agents."""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any

from support.fleet import SimulatedFleet, simulated_fleet  # noqa: F401 - the canary tests' fleet


def window(device: str, ts: float, *, fps: float = 30.0, infer_p95: float | None = 10.0,
           top: Mapping[str, int] | None = None, detections: int = 0, score: float | None = 0.8,
           status: str = "running", restarts: int = 0, frames: int = 30, name: str = "main") -> tuple[str, float, dict]:
    """One telemetry row ``(device, ts, payload)`` as the fleet stores it, with an output summary."""
    entry: dict[str, Any] = {"name": name, "status": status, "frames": frames, "dropped": 0, "fps": fps,
                             "restarts": restarts, "stages": {}}
    if infer_p95 is not None:
        entry["stages"]["infer"] = {"p50": infer_p95 * 0.8, "p95": infer_p95, "p99": infer_p95 * 1.2}
    if top is not None:
        entry["outputs"] = {"frames": frames, "top": [{"label": k, "count": v} for k, v in top.items()],
                            "detections": detections, "score_mean": score}
    return device, ts, {"ts": ts, "interval_s": 1.0, "pipelines": [entry]}


class AgentThread:
    """A real Agent in this process, on its own thread."""

    def __init__(self, settings: dict) -> None:
        from edgeinfer.agent.config import parse_config
        from edgeinfer.agent.daemon import Agent

        self.agent = Agent(parse_config(settings, file=f"{settings['device_id']}.yaml"))
        self.thread = threading.Thread(target=self.agent.run, name=f"agent-{settings['device_id']}", daemon=True)

    @property
    def device_id(self) -> str:
        return self.agent.config.device_id

    def version(self) -> str | None:
        return self.agent.runners[0].model.get("version")

    def stop(self) -> None:
        self.agent.stop()
        self.thread.join(30)

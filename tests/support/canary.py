"""What the canary-analysis tests share: telemetry rows made to order, a manager with a managed Mosquitto
and simulated devices that run deployed models as told, in-process agents."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from support.processes import wait_until


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


@dataclass
class SimulatedFleet:
    manager: Any
    simulation: Any
    admin: Any
    ids: list[str]


@contextlib.contextmanager
def simulated_fleet(data_dir: Path, *, devices: int, behaviours: Mapping[str, str], interval_s: float = 1.0,
                    online_timeout: float = 60.0) -> Iterator[SimulatedFleet]:
    """A manager with its managed Mosquitto, ``devices`` enrolled and simulated (``behaviours``: model name →
    how the devices run it); yielded once every device is online with telemetry."""
    from edgeinfer.fleet.broker import free_port
    from edgeinfer.fleet.client import FleetClient
    from edgeinfer.fleet.manager import FleetManager, FleetSettings
    from edgeinfer.tools.simulate import Simulation, SimulationSettings

    settings = FleetSettings(broker=None, broker_port=free_port(), http="127.0.0.1:0", data_dir=data_dir)
    with FleetManager(settings) as manager:
        assert manager.wait_connected(10), "the fleet manager did not connect to its Mosquitto"
        admin = FleetClient(manager.http.url, token=manager.admin_token)
        ids = [f"sim-{i:05d}" for i in range(devices)]
        issued = admin.enroll_many(ids, "canary")
        credentials = {e["device_id"]: (e["username"], e["password"]) for e in issued}
        simulation = Simulation(SimulationSettings(broker=manager.broker_url, devices=devices, fleet="canary",
                                                   interval_s=interval_s, update_delay_s=(0.05, 0.2),
                                                   ramp_s=2.0, credentials=credentials, behaviours=behaviours))
        with simulation:
            simulation.start()

            def all_online() -> bool:
                rows = {d["device_id"]: d for d in manager.db.list_devices()}
                return all(i in rows and rows[i]["online"] and rows[i]["last_telemetry"] for i in ids)

            assert wait_until(all_online, online_timeout, 0.2), \
                f"not every device came online: {simulation.online}/{devices} connected"
            yield SimulatedFleet(manager, simulation, admin, ids)
            simulation.stop(drain_s=1.0)


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

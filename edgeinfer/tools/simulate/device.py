"""One simulated agent: its paho client, its messages, and how it answers a deploy command."""

from __future__ import annotations

import hashlib
import json
import random
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from ...link.protocol import PROTOCOL_VERSION, Topics, encode

#: the real agent's update states, in the order it reports them
UPDATE_STEPS = ("downloading", "validating")
MODEL_PATH = "/var/lib/edgeinfer/models/model.tflite"


def fails(device_id: str, seed: int, rate: float) -> bool:
    """Whether ``device_id`` fails its updates: fixed per (device, seed), so a benchmark knows who will."""
    digest = hashlib.sha256(f"{seed}:{device_id}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64 < rate


@dataclass
class DeviceCounters:
    published: int = 0
    acked: int = 0
    dropped: int = 0
    connects: int = 0
    seq_first: int | None = None
    seq_last: int | None = None  # the last telemetry seq acknowledged by the broker


@dataclass
class SimDevice:
    """State of one simulated agent; the network loop (``loop.py``) drives its client."""

    device_id: str
    fleet: str
    failing: bool
    groups: tuple[str, ...] = ()
    boot_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    version: int = 1
    model_sha256: str = "0" * 64
    seq: int = 0
    event_seq: int = 0
    client: Any = None
    connected: bool = False
    next_telemetry: float = 0.0
    reconnect_attempt: int = 0
    reconnect_due: float = 0.0
    counters: DeviceCounters = field(default_factory=DeviceCounters)
    in_flight: dict[int, int] = field(default_factory=dict)  # mid -> telemetry seq
    deployments: dict[str, str] = field(default_factory=dict)  # deployment id -> its last update state

    def __post_init__(self) -> None:
        self.topics = Topics(self.fleet, self.device_id)

    # ------------------------------------------------------------------------------ messages
    def state(self, online: bool = True) -> bytes:
        message: dict[str, Any] = {
            "v": PROTOCOL_VERSION, "type": "state", "fleet": self.fleet, "device": self.device_id, "ts": time.time(),
            "online": online, "boot_id": self.boot_id}
        if online:
            message.update(groups=list(self.groups), profile="simulated", started=time.time(),
                           pipelines=[{"name": "main", "status": "running", "delegate": "xnnpack",
                                       "model": {"path": MODEL_PATH, "version": str(self.version),
                                                 "sha256": self.model_sha256}}])
        else:
            message["reason"] = "connection lost"
        return encode(message)

    def telemetry(self, rng: random.Random, interval_s: float) -> bytes:
        self.seq += 1
        latency = rng.uniform(8.0, 14.0)
        stage = {"p50": round(latency, 2), "p95": round(latency * 1.3, 2), "p99": round(latency * 1.6, 2)}
        return json.dumps({
            "v": PROTOCOL_VERSION, "type": "telemetry", "fleet": self.fleet, "device": self.device_id,
            "ts": time.time(), "boot_id": self.boot_id, "seq": self.seq, "interval_s": interval_s,
            "pipelines": [{"name": "main", "status": "running", "delegate": "xnnpack", "frames": 30, "dropped": 0,
                           "fps": round(rng.uniform(28.0, 30.0), 2), "restarts": 0,
                           "stages": {"inference": stage, "latency": stage}}],
            "system": {"cpu_percent": round(rng.uniform(20, 60), 1), "rss_bytes": 90_000_000, "throttled": False},
            "spool": {"pending": 0, "dropped": 0}}, separators=(",", ":")).encode()

    def event(self, name: str, level: str, message: str, *, cmd_id: str | None, data: dict) -> bytes:
        self.event_seq += 1
        return encode({"v": PROTOCOL_VERSION, "type": "event", "fleet": self.fleet, "device": self.device_id,
                       "ts": time.time(), "boot_id": self.boot_id, "seq": self.event_seq, "event": name,
                       "level": level, "message": message, "pipeline": "main", "cmd_id": cmd_id, "data": data})

    # ------------------------------------------------------------------------------ updates
    def update_plan(self, command: dict, rng: random.Random, delays: tuple[float, float]) -> list[tuple[float, str]]:
        """[(seconds from now, state)] the agent would report for a deploy command; [] for one seen before."""
        manifest = (command.get("args") or {}).get("manifest") or {}
        deployment_id = str(manifest.get("deployment_id") or "")
        if not deployment_id or deployment_id in self.deployments:
            return []  # the agent answers a repeated command from its log, without running it again
        self.deployments[deployment_id] = "notified"
        states = [*UPDATE_STEPS, "failed" if self.failing else "active"]
        due, plan = 0.0, []
        for state in states:
            due += rng.uniform(*delays)
            plan.append((due, state))
        return plan

    def update_event(self, command: dict, state: str) -> bytes:
        manifest = (command.get("args") or {}).get("manifest") or {}
        version = int(manifest.get("version") or 0)
        deployment_id = str(manifest.get("deployment_id"))
        self.deployments[deployment_id] = state
        data: dict[str, Any] = {"deployment_id": deployment_id, "state": state, "version": version}
        level, message = "info", f"update to v{version}: {state}"
        if state == "failed":
            data.update(reason="validation_failed", detail="simulated: the model failed validation")
            level, message = "error", f"update to v{version}: failed (validation_failed)"
        elif state == "active":
            self.version = version
            self.model_sha256 = str(manifest.get("sha256") or self.model_sha256)
        return self.event("update", level, message, cmd_id=command.get("id"), data=data)

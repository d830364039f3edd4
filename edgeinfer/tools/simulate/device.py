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
from ...link.vocabulary import DeploymentKind, EventKind, TargetState

#: the real agent's update states, in the order it reports them
UPDATE_STEPS = (TargetState.DOWNLOADING, TargetState.VALIDATING)
MODEL_PATH = "/var/lib/edgeinfer/models/model.tflite"
#: the simulated classifier's classes and how often each is the top-1 answer (Zipf: a few dominate)
LABELS = tuple(f"class-{i:02d}" for i in range(20))
WEIGHTS = tuple(1.0 / (i + 1) for i in range(len(LABELS)))
#: how many labels a window's output summary names (as the agent's)
TOP_LABELS = 10
#: the most frames of a window whose classes are drawn one by one (a longer window's counts are these, scaled)
SAMPLED_FRAMES = 1000


@dataclass(frozen=True)
class Behaviour:
    """How a simulated device runs a model: ``slow`` multiplies its inference time (fps falls with it),
    ``drift`` answers with the classes in another order (a permuted label file), ``errors`` is the share of
    telemetry windows in which its pipeline has failed and restarts."""

    slow: float = 1.0
    drift: bool = False
    errors: float = 0.0

    @classmethod
    def parse(cls, text: str) -> Behaviour:
        """``healthy``, ``slow`` / ``slow:FACTOR`` (default 5), ``drift``, ``errors:SHARE``, joined by ``+``;
        ValueError otherwise."""
        slow, drift, errors = 1.0, False, 0.0
        for part in (text or "").strip().lower().split("+"):
            name, _, value = part.strip().partition(":")
            try:
                if name == "healthy" and not value:
                    continue
                if name == "slow":
                    slow = float(value) if value else 5.0
                    if not 1.0 <= slow <= 1000.0:
                        raise ValueError
                elif name == "drift" and not value:
                    drift = True
                elif name == "errors":
                    errors = float(value)
                    if not 0.0 <= errors <= 1.0:
                        raise ValueError
                else:
                    raise ValueError
            except ValueError:
                raise ValueError(f"not a simulated behaviour: {text!r} (healthy, slow[:FACTOR], drift, errors:SHARE, "
                                 "joined by +)") from None
        return cls(slow=slow, drift=drift, errors=errors)


HEALTHY = Behaviour()


def fails(device_id: str, seed: int, rate: float) -> bool:
    """Whether ``device_id`` fails its updates: fixed per (device, seed), so a benchmark knows who will."""
    digest = hashlib.sha256(f"{seed}:{device_id}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64 < rate


@dataclass
class DeviceCounters:
    published: int = 0
    acked: int = 0
    refused: int = 0  # answered with a failure reason code (MQTT 5 PUBACK >= 0x80): not stored by the broker
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
    #: deployment id -> (when its command came, when the device sent its last answer), time.monotonic()
    timeline: dict[str, list[float]] = field(default_factory=dict)
    #: artifact sha256 or model name -> how this device runs that model (the simulation's setting)
    behaviours: dict[str, Behaviour] = field(default_factory=dict)
    behaviour: Behaviour = HEALTHY
    #: what a rollback goes back to: (version, sha256, behaviour)
    previous: tuple[int, str, Behaviour] | None = None
    restarts: int = 0
    commands_seen: set[str] = field(default_factory=set)
    #: whether it refuses the configuration documents it is sent (the simulation's setting, fixed per device)
    config_refuses: bool = False
    #: the configuration it runs, as its state reports it: (version, sha256), or None (its agent.yaml)
    config: tuple[int, str] | None = None
    #: what a configuration rollback goes back to
    previous_config: tuple[int, str] | None = None

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
            # the configuration it runs, as the agent reports it (none: its agent.yaml)
            version, sha256 = self.config or (None, None)
            message["config"] = {"revision": version, "sha256": sha256,
                                 "source": "agent.yaml" if self.config is None else "fleet"}
        else:
            message["reason"] = "connection lost"
        return encode(message)

    def telemetry(self, rng: random.Random, interval_s: float) -> bytes:
        self.seq += 1
        behaviour = self.behaviour
        infer = rng.uniform(8.0, 14.0) * behaviour.slow
        fps = min(rng.uniform(28.0, 30.0), 1000.0 / (infer * 1.2))
        frames = max(1, round(fps * interval_s))
        failed = behaviour.errors > 0 and rng.random() < behaviour.errors
        pipeline: dict[str, Any] = {"name": "main", "status": "running", "delegate": "xnnpack", "frames": frames,
                                    "dropped": 0, "fps": round(fps, 2), "restarts": self.restarts,
                                    "stages": {"infer": _figures(infer), "latency": _figures(infer + 4.0)},
                                    "degraded": False, "delegate_wanted": None,
                                    "outputs": self._outputs(rng, frames)}
        if failed:
            self.restarts += 1
            pipeline.update(status="restarting", restarts=self.restarts, frames=0, fps=0.0, stages={})
            del pipeline["outputs"]
        return json.dumps({
            "v": PROTOCOL_VERSION, "type": "telemetry", "fleet": self.fleet, "device": self.device_id,
            "ts": time.time(), "boot_id": self.boot_id, "seq": self.seq, "interval_s": interval_s,
            "pipelines": [pipeline],
            "system": {"cpu_percent": round(rng.uniform(20, 60), 1), "rss_bytes": 90_000_000, "throttled": False},
            "spool": {"pending": 0, "dropped": 0}}, separators=(",", ":")).encode()

    def _outputs(self, rng: random.Random, frames: int) -> dict[str, Any]:
        """A window's output summary, as the agent's: each frame's top-1 class, counted (a long window's from
        SAMPLED_FRAMES frames, scaled: an hour's window is 108,000 frames, 0.3 s of CPU drawn one by one)."""
        labels = LABELS[::-1] if self.behaviour.drift else LABELS  # the same scores, other classes
        drawn = min(frames, SAMPLED_FRAMES)
        counts: dict[str, int] = {}
        for label in rng.choices(labels, WEIGHTS, k=drawn):
            counts[label] = counts.get(label, 0) + 1
        if drawn < frames:
            counts = {label: count * frames // drawn for label, count in counts.items()}
        top = sorted(counts.items(), key=lambda item: -item[1])[:TOP_LABELS]
        return {"frames": frames, "top": [{"label": label, "count": count} for label, count in top],
                "detections": 0, "score_mean": round(rng.uniform(0.7, 0.8), 4)}

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
        self.deployments[deployment_id] = TargetState.NOTIFIED
        self.timeline[deployment_id] = [time.monotonic()]
        failing = self.config_refuses if _kind(manifest) == DeploymentKind.CONFIG else self.failing
        states = [*UPDATE_STEPS, TargetState.FAILED if failing else TargetState.ACTIVE]
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
        self.timeline.setdefault(deployment_id, [time.monotonic()])[1:] = [time.monotonic()]
        data: dict[str, Any] = {"deployment_id": deployment_id, "state": state, "version": version}
        level, message = "info", f"update to v{version}: {state}"
        if _kind(manifest) == DeploymentKind.CONFIG:
            return self._config_event(command, manifest, state, data)
        if state == TargetState.FAILED:
            data.update(reason="validation_failed", detail="simulated: the model failed validation")
            level, message = "error", f"update to v{version}: failed (validation_failed)"
        elif state == TargetState.ACTIVE:
            self.previous = (self.version, self.model_sha256, self.behaviour)
            self.version = version
            self.model_sha256 = str(manifest.get("sha256") or self.model_sha256)
            named = self.behaviours.get(str(manifest.get("model_name")))
            self.behaviour = self.behaviours.get(self.model_sha256) or named or HEALTHY
        return self.event(EventKind.UPDATE, level, message, cmd_id=command.get("id"), data=data)

    def _config_event(self, command: dict, manifest: dict, state: str, data: dict[str, Any]) -> bytes:
        """A configuration deployment's step, as the agent reports it: applied, or refused with its reason."""
        data["kind"] = DeploymentKind.CONFIG.value
        level, message = "info", f"configuration v{data['version']}: {state}"
        if state == TargetState.FAILED:
            data.update(reason="config_refused", detail="simulated: the device refused the configuration")
            level, message = "error", f"configuration v{data['version']}: refused (config_refused)"
        elif state == TargetState.ACTIVE:
            self.previous_config = self.config
            self.config = (data["version"], str(manifest.get("sha256")))
        return self.event(EventKind.UPDATE, level, message, cmd_id=command.get("id"), data=data)

    def roll_back(self, command: dict) -> bytes | None:
        """Answer a ``rollback`` command as the agent does (the previous model runs again); None for one seen
        before, or when there is nothing to go back to."""
        command_id = str(command.get("id") or "")
        if command_id in self.commands_seen:
            return None
        self.commands_seen.add(command_id)
        if (command.get("args") or {}).get("kind") == DeploymentKind.CONFIG:
            self.config, self.previous_config = self.previous_config, None
            return self.event(EventKind.UPDATE, "warning", "configuration rolled back", cmd_id=command_id,
                              data={"state": TargetState.ROLLED_BACK.value, "kind": DeploymentKind.CONFIG.value})
        if self.previous is None:
            return self.event(EventKind.CMD_REJECTED, "warning", "rollback: no previous model", cmd_id=command_id,
                              data={"reason": "no_previous"})
        self.version, self.model_sha256, self.behaviour = self.previous
        self.previous = None
        return self.event(EventKind.UPDATE, "warning", f"rolled back to v{self.version}", cmd_id=command_id,
                          data={"state": TargetState.ROLLED_BACK.value, "version": self.version})


def _kind(manifest: dict) -> str:
    """A manifest's deployment kind (none: a model's)."""
    return str(manifest.get("kind") or DeploymentKind.MODEL.value)


def _figures(ms: float) -> dict[str, float]:
    return {"p50": round(ms, 2), "p95": round(ms * 1.3, 2), "p99": round(ms * 1.6, 2), "mean": round(ms * 1.05, 2)}

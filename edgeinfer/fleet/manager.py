"""The fleet manager behind ``edgeinfer fleet serve``.

It subscribes to every device's ``state``, ``telemetry`` and ``events``, keeps the registry and
roll-ups in the fleet database, serves artifacts and the JSON API over HTTP, and runs rollouts:
each deployment is a thread that notifies devices wave by wave on their ``cmd`` topic (through a
spool, so a command survives a manager restart or a broker outage) and follows their ``update``
events. With no broker URL it starts an embedded one.
"""

from __future__ import annotations

import json
import logging
import socket
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import ConfigError, EdgeInferError, ProtocolError
from ..link.protocol import decode, encode, make_command, parse_topic, subscription
from ..updates.signing import PRIVATE_KEY_FILE, SigningKey, new_manifest
from .artifacts import ArtifactStore
from .db import FleetDB
from .rollout import FINISHED_STATES, Rollout, plan_waves

log = logging.getLogger(__name__)

DEFAULT_HTTP = "127.0.0.1:8700"
DEFAULT_DATA_DIR = Path("fleet-data")
DEFAULT_DEVICE_TIMEOUT_S = 600.0
#: update states a device reports in ``update`` events, mapped onto rollout states
UPDATE_EVENT = "update"
DEPLOY_COMMAND = "deploy"


@dataclass(frozen=True, kw_only=True)
class FleetSettings:
    """Where the fleet manager listens and keeps its data."""

    broker: str | None = None  # None: start an embedded broker
    db_url: str | None = None  # None: sqlite in data_dir
    http: str = DEFAULT_HTTP
    data_dir: Path = DEFAULT_DATA_DIR
    public_url: str | None = None  # how devices reach the HTTP server (default: http://<http>)
    embedded_broker_port: int = 1883
    #: for an mqtts:// broker: CA, client certificate and key; username/password for either
    ca: str | None = None
    cert: str | None = None
    key: str | None = None
    username: str | None = None
    password: str | None = field(default=None, repr=False)

    def http_address(self) -> tuple[str, int]:
        host, _, port = self.http.rpartition(":")
        if not host or not port.isdigit():
            raise ConfigError(f"--http must be HOST:PORT, not {self.http!r}")
        return host, int(port)


class FleetManager:
    """Ingest, storage, HTTP and rollouts. ``start()`` then ``close()`` (or use as a context manager)."""

    def __init__(self, settings: FleetSettings) -> None:
        self.settings = settings
        self.data_dir = Path(settings.data_dir)
        self.broker_url = settings.broker
        self.db: FleetDB | None = None
        self.store: ArtifactStore | None = None
        self.key: SigningKey | None = None
        self.http = None
        self._embedded = None
        self._link = None
        self._spool = None
        self._rollouts: dict[str, Rollout] = {}  # deployment id -> running rollout
        self._command_deployments: dict[str, str] = {}  # cmd id -> deployment id
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()
        self.rejected_messages = 0
        self._closed = False

    # ----------------------------------------------------------------------------- lifecycle
    def start(self) -> FleetManager:
        from ..link.mqtt import MqttLink
        from ..link.settings import LinkSettings
        from ..link.spool import Spool
        from .broker import EmbeddedBroker
        from .http import FleetHTTPServer

        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.db = FleetDB(self.settings.db_url or f"sqlite:///{self.data_dir / 'fleet.sqlite3'}")
        self.store = ArtifactStore(self.data_dir / "artifacts")
        self.key = self._load_or_create_key()
        if self.broker_url is None:
            self._embedded = EmbeddedBroker("127.0.0.1", self.settings.embedded_broker_port).start()
            self.broker_url = self._embedded.url
        host, port = self.settings.http_address()
        try:
            self.http = FleetHTTPServer(self.store, self, host=host, port=port).start()
        except OSError as exc:
            raise ConfigError(f"cannot listen on {self.settings.http}: {exc.strerror or exc}") from None
        self._spool = Spool(self.data_dir / "commands-out.sqlite3")
        # the embedded broker (amqtt) speaks MQTT 3.1.1 only
        s = self.settings
        try:
            link_settings = LinkSettings(url=self.broker_url, client_id=f"edgeinfer-fleet-{socket.gethostname()}"[:128],
                                         mqtt_version="3.1.1" if self._embedded else "auto", ca=s.ca, cert=s.cert,
                                         key=s.key, username=s.username, password=s.password)
        except ValueError as exc:
            raise ConfigError(f"--broker: {exc}") from None
        self._link = MqttLink(
            link_settings, spool=self._spool, name="edgeinfer-fleet-mqtt",
            subscriptions=[subscription(kind) for kind in ("state", "telemetry", "events")],
            on_message=self._on_message,
        ).start()
        return self

    def _load_or_create_key(self) -> SigningKey:
        path = self.data_dir / PRIVATE_KEY_FILE
        if path.exists():
            return SigningKey.load(path)
        key = SigningKey.generate()
        key.save(self.data_dir)
        log.warning("created a new fleet signing key in %s; agents must pin %s", self.data_dir,
                    key.public_key_b64())
        return key

    @property
    def public_url(self) -> str:
        return self.settings.public_url or self.http.url

    def wait_connected(self, timeout: float = 10.0) -> bool:
        return self._link.wait_connected(timeout)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for rollout in list(self._rollouts.values()):
            rollout.cancel()
        for thread in self._threads:
            thread.join(timeout=5)
        for part in (self._link, self.http, self._spool, self._embedded):
            if part is not None:
                part.close()
        if self.db is not None:
            self.db.close()

    def __enter__(self) -> FleetManager:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -------------------------------------------------------------------------------- ingest
    def _on_message(self, topic: str, payload: bytes) -> None:
        try:
            fleet, device, kind = parse_topic(topic)
            if kind == "state" and not payload:
                return  # a cleared retained message
            message = decode(kind, payload)
        except ProtocolError as exc:
            self.rejected_messages += 1
            log.warning("ignoring a malformed message on %s: %s", topic, exc)
            return
        try:
            if kind == "state":
                self.db.record_state(fleet, device, message)
            elif kind == "telemetry":
                self.db.record_telemetry(fleet, device, message)
            elif kind == "events":
                self.db.record_event(fleet, device, message)
                self._follow_update(device, message)
        except Exception:  # a database hiccup must not kill the MQTT thread
            log.exception("could not record %s from %s", kind, device)

    def _follow_update(self, device: str, event: dict) -> None:
        data = event.get("data") or {}
        name = event.get("event")
        deployment_id = data.get("deployment_id") or self._command_deployments.get(event.get("cmd_id") or "")
        if not deployment_id:
            return
        if name == UPDATE_EVENT:
            state, detail = data.get("state"), data.get("reason") or event.get("message")
        elif name == "cmd_rejected":
            state, detail = "rejected", data.get("reason") or event.get("message")
        else:
            return
        rollout = self._rollouts.get(deployment_id)
        if rollout is not None:
            rollout.on_progress(device, state, detail)
        elif state in FINISHED_STATES or state in ("downloading", "validating"):
            # a late report after the rollout ended (e.g. a device that was offline): record it
            self.db.set_target_state(deployment_id, device, state, detail)

    # ---------------------------------------------------------------------------- commands
    def send_command(self, device: str, cmd: str, args: dict, *, command_id: str | None = None) -> str:
        """Queue a command for ``device`` (spooled, QoS 1); returns its id."""
        from ..link.protocol import Topics

        record = self.db.get_device(device)
        if record is None:
            raise ValueError(f"unknown device {device!r}")
        command_id = command_id or uuid.uuid4().hex
        message = make_command(command_id, cmd, args)
        self._spool.append(Topics(record["fleet"], device).cmd, encode(message))
        self._link.notify()
        return command_id

    # --------------------------------------------------------------------------- deployments
    def put_artifact(self, path: str | Path) -> tuple[str, int]:
        return self.store.put(path)

    def resolve_targets(self, spec: dict) -> list[str]:
        """Device ids for --device / --group / --all."""
        if spec.get("devices"):
            known = {d["device_id"] for d in self.db.list_devices()}
            unknown = [d for d in spec["devices"] if d not in known]
            if unknown:
                raise ValueError(f"unknown device(s): {', '.join(unknown)} — see `edgeinfer fleet devices`")
            return list(dict.fromkeys(spec["devices"]))
        if spec.get("group"):
            return [d["device_id"] for d in self.db.list_devices(group=spec["group"])]
        if spec.get("all"):
            return [d["device_id"] for d in self.db.list_devices()]
        raise ValueError("a deployment needs devices, a group or all")

    def create_deployment(self, spec: dict) -> dict:
        """Sign a manifest for a stored artifact and start rolling it out; returns the summary."""
        sha256 = str(spec.get("sha256", ""))
        if self.store.get(sha256) is None:
            raise ValueError(f"no artifact {sha256!r} — upload it first")
        try:
            version = int(spec["version"])
        except (KeyError, TypeError, ValueError):
            raise ValueError("version must be an integer") from None
        devices = self.resolve_targets(spec)
        if not devices:
            raise ValueError("no device matches the target")
        canary = float(spec.get("canary_pct", 10.0))
        wave_size = spec.get("wave_size")
        waves = plan_waves(devices, canary_pct=canary, wave_size=int(wave_size) if wave_size else None)
        target = ("all" if spec.get("all") else f"group:{spec['group']}" if spec.get("group")
                  else "device:" + ",".join(devices))
        size = self.store.get(sha256).stat().st_size
        manifest = new_manifest(model_name=str(spec.get("model_name") or sha256), version=version, sha256=sha256,
                                size=size, url=f"{self.public_url}/artifacts/{sha256}", target=target,
                                rollback=bool(spec.get("rollback", False)))
        signature = self.key.sign(manifest)
        options = {"canary_pct": canary, "wave_size": wave_size,
                   "abort_failure_rate": float(spec.get("abort_failure_rate", 0.0)),
                   "device_timeout_s": float(spec.get("device_timeout_s", DEFAULT_DEVICE_TIMEOUT_S)),
                   "pipeline": spec.get("pipeline")}
        self.db.create_deployment(manifest.to_dict(), signature, options, waves)
        deployment_id = manifest.deployment_id
        command_id = f"deploy-{deployment_id}"
        self._command_deployments[command_id] = deployment_id
        args = {"manifest": manifest.to_dict(), "signature": signature}
        if options["pipeline"]:
            args["pipeline"] = options["pipeline"]
        rollout = Rollout(
            waves, lambda device: self.send_command(device, DEPLOY_COMMAND, args, command_id=command_id),
            abort_failure_rate=options["abort_failure_rate"], device_timeout_s=options["device_timeout_s"],
            on_change=lambda device, state, detail: self.db.set_target_state(deployment_id, device, state, detail),
        )
        self._rollouts[deployment_id] = rollout
        thread = threading.Thread(target=self._run_rollout, args=(deployment_id, rollout),
                                  name=f"edgeinfer-rollout-{deployment_id[:8]}", daemon=True)
        self._threads.append(thread)
        thread.start()
        return self.db.get_deployment(deployment_id)

    def _run_rollout(self, deployment_id: str, rollout: Rollout) -> None:
        try:
            result = rollout.run()
            detail = None
            if result.status == "aborted":
                detail = f"failure rate {rollout.failure_rate():.0%} passed the threshold; later waves not notified"
            self.db.set_deployment_status(deployment_id, result.status, detail)
        except Exception as exc:
            log.exception("rollout %s failed", deployment_id)
            self.db.set_deployment_status(deployment_id, "failed", f"{type(exc).__name__}: {exc}")
        finally:
            self._rollouts.pop(deployment_id, None)

    # -------------------------------------------------------------------- FleetAPI (reads)
    def list_devices(self) -> list[dict]:
        return self.db.list_devices()

    def get_device(self, device_id: str) -> dict | None:
        device = self.db.get_device(device_id)
        if device is not None:
            device["events"] = self.db.device_events(device_id, limit=50)
            device["rollups"] = self.db.device_rollups(device_id)[-60:]
        return device

    def list_deployments(self) -> list[dict]:
        return self.db.list_deployments()

    def get_deployment(self, deployment_id: str) -> dict | None:
        return self.db.get_deployment(deployment_id)

    def device_telemetry(self, device_id: str, limit: int) -> list[dict]:
        return self.db.device_telemetry(device_id, limit)


def wait_for_deployment(fetch, deployment_id: str, *, timeout_s: float, on_progress=None,
                        poll_s: float = 0.5) -> dict:
    """Poll ``fetch(deployment_id)`` until the deployment leaves 'running' (or time runs out)."""
    deadline = time.monotonic() + timeout_s
    last: Any = None
    while True:
        current = fetch(deployment_id)
        if current is None:
            raise EdgeInferError(f"deployment {deployment_id} disappeared")
        snapshot = json.dumps(current.get("counts"), sort_keys=True)
        if on_progress and snapshot != last:
            on_progress(current)
            last = snapshot
        if current["status"] != "running" or time.monotonic() > deadline:
            return current
        time.sleep(poll_s)

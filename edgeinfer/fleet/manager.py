"""The fleet manager behind ``edgeinfer fleet serve``.

Parts, each in its own module: the broker (a supervised Mosquitto when no ``--broker`` is given),
the database (SQLAlchemy + Alembic: SQLite or PostgreSQL), ingest (bounded queue, batched writes,
acknowledged once stored), the HTTP API and artifacts (FastAPI on uvicorn), rollouts (driven from
the database under a lease) and retention. Several managers can share one broker and one
PostgreSQL: telemetry and events arrive through MQTT 5 shared subscriptions, so each message is
stored by one of them; every manager sees every ``state`` (retained, idempotent).
"""

from __future__ import annotations

import hashlib
import json
import logging
import socket
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import ConfigError, EdgeInferError
from ..link.protocol import Topics, encode, make_command, subscription
from ..updates.signing import PRIVATE_KEY_FILE, SigningKey
from . import deployments
from .access import MANAGER_USER
from .artifacts import ArtifactStore

log = logging.getLogger(__name__)

DEFAULT_HTTP = "127.0.0.1:8700"

DEFAULT_DATA_DIR = Path("fleet-data")
DAY_S = 86_400.0
RETENTION_EVERY_S = 600.0


@dataclass(frozen=True, kw_only=True)
class FleetSettings:
    """Where the fleet manager listens and keeps its data."""

    broker: str | None = None  # None: start and supervise Mosquitto on broker_port
    db_url: str | None = None  # None: sqlite in data_dir
    http: str = DEFAULT_HTTP
    data_dir: Path = DEFAULT_DATA_DIR
    public_url: str | None = None  # how devices reach the HTTP server (default: http://<http>)
    broker_port: int = 1883
    #: where the managed Mosquitto listens (0.0.0.0: every interface; it takes no anonymous client)
    broker_host: str = "127.0.0.1"
    #: the broker URL enrolled devices are told to use (default: the managed broker's own URL)
    device_broker_url: str | None = None
    #: serve the managed broker as mqtts:// and the API as https://, with certificates of the fleet's own CA
    tls: bool = False
    #: more names or addresses for those certificates (devices reach the manager by them)
    tls_hosts: tuple[str, ...] = ()
    #: for an mqtts:// broker: CA, client certificate and key; username/password for either
    ca: str | None = None
    cert: str | None = None
    key: str | None = None
    username: str | None = None
    password: str | None = field(default=None, repr=False)
    #: this manager's MQTT client id (its persistent session); default: from the host name and data dir
    manager_id: str | None = None
    #: share telemetry and events with the other managers on the broker ($share/<group>/...); None: one manager.
    #: Mosquitto (2.0.11) does not persist shared subscriptions, so only a plain subscription's session keeps
    #: what devices send between a broker crash and the manager's return.
    shared_group: str | None = None
    ingest_queue: int = 20_000
    ingest_batch: int = 1_000
    lease_ttl_s: float = 10.0
    raw_retention_days: float = 7.0
    rollup_retention_days: float = 90.0
    audit_retention_days: float = 365.0
    #: events' evidence (evidence.py): one snapshot, one clip at most; all evidence together (the oldest go)
    evidence_snapshot_max_bytes: int = 4 << 20
    evidence_clip_max_bytes: int = 64 << 20
    evidence_max_bytes: int = 2048 << 20

    def http_address(self) -> tuple[str, int]:
        host, _, port = self.http.rpartition(":")
        if not host or not port.isdigit():
            raise ConfigError(f"--http must be HOST:PORT, not {self.http!r}")
        return host, int(port)

    def client_id(self) -> str:
        if self.manager_id:
            return self.manager_id
        where = hashlib.sha256(str(Path(self.data_dir).resolve()).encode()).hexdigest()[:8]
        return f"edgeinfer-fleet-{socket.gethostname()}-{where}"[:128]


class FleetManager:
    """Ingest, storage, HTTP and rollouts. ``start()`` then ``close()`` (or use as a context manager)."""

    def __init__(self, settings: FleetSettings) -> None:
        self.settings = settings
        self.data_dir = Path(settings.data_dir)
        self.broker_url = settings.broker
        self.db: Any = None
        self.store: ArtifactStore | None = None
        self.key: SigningKey | None = None
        self.http: Any = None
        self.broker: Any = None  # the managed Mosquitto, if we started one
        self.access: Any = None  # tokens, enrolment, the broker's accounts (access.py)
        self.live: Any = None  # the dashboard's live updates (live.py)
        self.evidence: Any = None  # events' snapshots and clips (evidence.py)
        self.link: Any = None
        self.ingest: Any = None
        self.rollouts: Any = None
        self._spool: Any = None
        self._registry: Any = None
        self._stop = threading.Event()
        self._maintenance: threading.Thread | None = None
        self._closed = False

    # ----------------------------------------------------------------------------- lifecycle
    def start(self) -> FleetManager:
        try:
            self._start()
        except BaseException:
            self.close()
            raise
        return self

    def _start(self) -> None:
        from .access import FleetAccess
        from .db import FleetDB
        from .evidence import EvidenceLimits, EvidenceStore
        from .ingest import Ingest
        from .live import LiveFeed
        from .metrics import registry_for
        from .rollout import RolloutDriver

        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.db = FleetDB(self.settings.db_url or f"sqlite:///{self.data_dir / 'fleet.sqlite3'}")
        self.store = ArtifactStore(self.data_dir / "artifacts")
        self.key = self._load_or_create_key()
        s = self.settings
        self.access = FleetAccess(self.db, self.key, self.data_dir, tls=s.tls, tls_hosts=s.tls_hosts,
                                  listen_hosts=(s.broker_host, s.http_address()[0]),
                                  broker_url=s.broker, device_broker_url=s.device_broker_url)
        if self.broker_url is None:
            self.broker = self.access.start_broker(s.broker_host, s.broker_port)
            self.broker_url = self.access.broker_url
        self._registry = registry_for(self)
        self.evidence = EvidenceStore(self.db, self.data_dir / "evidence-incoming",
                                      EvidenceLimits(snapshot_bytes=s.evidence_snapshot_max_bytes,
                                                     clip_bytes=s.evidence_clip_max_bytes,
                                                     total_bytes=s.evidence_max_bytes))
        self.live = LiveFeed(self.db).start()
        self._start_http()
        self.ingest = Ingest(self.db, on_event=self._on_event, on_state=self._on_state,
                             queue_size=self.settings.ingest_queue,
                             batch_size=self.settings.ingest_batch).start()
        self._start_link()
        owner = f"{self.settings.client_id()}-{uuid.uuid4().hex[:6]}"  # a restarted manager is a new owner
        self.rollouts = RolloutDriver(self.db, self._send_deploy, owner=owner, lease_ttl_s=self.settings.lease_ttl_s,
                                      rollback=self._send_rollback).start()
        self._maintenance = threading.Thread(target=self._maintain, name="edgeinfer-fleet-retention", daemon=True)
        self._maintenance.start()

    def _start_http(self) -> None:
        from .http import FleetHTTPServer

        host, port = self.settings.http_address()
        try:
            self.http = FleetHTTPServer(self.store, self, host=host, port=port, auth=self.access.tokens,
                                        access=self.access, tls=self.access.https_files()).start()
        except OSError as exc:
            raise ConfigError(f"cannot listen on {self.settings.http}: {exc.strerror or exc}") from None

    def _start_link(self) -> None:
        from ..link.mqtt import MqttLink
        from ..link.settings import LinkSettings
        from ..link.spool import Spool

        s = self.settings
        self._spool = Spool(self.data_dir / "commands-out.sqlite3")
        try:
            # the receive maximum keeps what the broker sends us within the ingest queue's bound
            managed, ca = self.broker is not None, self.access.ca
            link_settings = LinkSettings(url=self.broker_url, client_id=MANAGER_USER if managed else s.client_id(),
                                         mqtt_version="5", ca=str(ca.ca_file) if managed and ca else s.ca,
                                         cert=s.cert, key=s.key,
                                         username=MANAGER_USER if managed else s.username,
                                         password=self.access.manager_password if managed else s.password,
                                         receive_maximum=min(65535, s.ingest_queue), manual_ack=True,
                                         inflight_window=1000)
        except ValueError as exc:
            raise ConfigError(f"--broker: {exc}") from None
        shared = f"$share/{s.shared_group}/" if s.shared_group else ""
        topics = [subscription("state"), shared + subscription("telemetry"), shared + subscription("events")]
        self.link = MqttLink(link_settings, spool=self._spool, name="edgeinfer-fleet-mqtt", subscriptions=topics,
                             on_delivery=self.ingest.deliver, on_connected=self._on_connected).start()

    def _on_connected(self, _offline_s: float | None) -> None:
        if self.broker is not None:  # our session (and its subscriptions) must survive a broker crash
            threading.Thread(target=self._save_broker, name="edgeinfer-fleet-broker-save", daemon=True).start()

    def _save_broker(self) -> None:
        time.sleep(1.0)  # the SUBACKs first
        try:
            self.broker.save()
        except Exception as exc:
            log.warning("could not make Mosquitto save its persistence: %s", exc)

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

    @property
    def admin_token(self) -> str | None:
        """The admin token in ``<data_dir>/admin.token``, if that file is still there."""
        from .auth import ADMIN_TOKEN_FILE

        path = self.data_dir / ADMIN_TOKEN_FILE
        return path.read_text().strip() if path.exists() else None

    @property
    def rejected_messages(self) -> int:
        return self.ingest.stats.invalid if self.ingest is not None else 0

    def wait_connected(self, timeout: float = 10.0) -> bool:
        return self.link.wait_connected(timeout)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._stop.set()
        for part in (self.live, self.rollouts, self.link, self.ingest, self.http, self._spool, self.broker):
            if part is not None:
                try:
                    part.close()
                except Exception:  # closing: report, go on closing the rest
                    log.exception("closing %s failed", type(part).__name__)
        if self.db is not None:
            self.db.close()

    def __enter__(self) -> FleetManager:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------------ ingest & retention
    def _on_event(self, device: str, event: dict) -> None:
        if deployments.follow_update(self.db, device, event) and self.rollouts is not None:
            self.rollouts.poke()

    def _on_state(self, device: str, state: dict) -> None:
        running = self.rollouts.running if self.rollouts is not None else []
        if running and deployments.follow_state(self.db, running, device, state):
            self.rollouts.poke()

    def _maintain(self) -> None:
        while not self._stop.is_set():
            try:
                deleted = self.db.prune(raw_max_age_s=self.settings.raw_retention_days * DAY_S,
                                        rollup_max_age_s=self.settings.rollup_retention_days * DAY_S,
                                        audit_max_age_s=self.settings.audit_retention_days * DAY_S)
                if any(deleted.values()):
                    log.info("retention: deleted %s", deleted)
                self.evidence.prune()
            except Exception as exc:
                log.warning("retention pass failed: %s", exc)
            self._stop.wait(RETENTION_EVERY_S)

    def metrics(self) -> bytes:
        from .metrics import exposition

        return exposition(self._registry)

    # ---------------------------------------------------------------------------- commands
    def send_command(self, device: str, cmd: str, args: dict, *, command_id: str | None = None) -> str:
        """Queue a command for ``device`` (spooled, QoS 1), signed with the fleet key for that device only;
        returns its id. It expires with its manifest (deploy) or COMMAND_TTL_S from now: agents refuse
        unsigned state-changing commands, and a signed one cannot be replayed on another device or later."""
        from ..updates.signing import COMMAND_TTL_S, sign_command

        record = self.db.get_device(device)
        if record is None:
            raise ValueError(f"unknown device {device!r}")
        if self.key is None:
            raise ConfigError("the fleet signing key is not loaded: start() the manager before sending commands")
        command_id = command_id or uuid.uuid4().hex
        manifest = args.get("manifest") if cmd == deployments.DEPLOY_COMMAND else None
        expires = manifest.get("expires_at") if isinstance(manifest, dict) else None
        if not isinstance(expires, (int, float)) or isinstance(expires, bool):
            expires = time.time() + COMMAND_TTL_S
        if isinstance(manifest, dict) and "grant" not in args and isinstance(manifest.get("sha256"), str):
            args = {**args, "grant": self._download_grant(manifest["sha256"], device, None)}
        message = sign_command(self.key, make_command(command_id, cmd, args), device_id=device, expires=expires)
        self._spool.append(Topics(record["fleet"], device).cmd, encode(message))
        self.link.notify()
        return command_id

    def _download_grant(self, sha256: str, device: str, device_timeout_s: float | None) -> str:
        """A short-lived signed URL grant: valid as long as a rollout waits for the device, an hour at least."""
        from .auth import issue_grant

        return issue_grant(self.key, sha256, device, time.time() + max(3600.0, 2 * (device_timeout_s or 0)))

    def _send_deploy(self, deployment: dict, device: str) -> None:
        args = deployments.deploy_args(deployment)
        timeout = float((deployment.get("options") or {}).get("device_timeout_s") or 0)
        args["grant"] = self._download_grant(deployment["sha256"], device, timeout)
        self.send_command(device, deployments.DEPLOY_COMMAND, args,
                          command_id=deployments.command_id(deployment["deployment_id"]))

    def _send_rollback(self, deployment: dict, device: str) -> None:
        cmd, args, command_id = deployments.rollback_command(deployment, device)
        self.send_command(device, cmd, args, command_id=command_id)

    # --------------------------------------------------------------------------- deployments
    def put_artifact(self, path: str | Path) -> tuple[str, int]:
        return self.store.put(path)

    def create_deployment(self, spec: dict) -> dict:
        """Sign a manifest for a stored artifact and start rolling it out; returns the summary."""

        def size(sha256: str) -> int | None:
            path = self.store.get(sha256)
            return path.stat().st_size if path is not None else None

        deployment_id = deployments.create_deployment(self.db, self.key, spec, artifact_size=size,
                                                      public_url=self.public_url)
        self.rollouts.poke()
        return self.db.get_deployment(deployment_id)

    # -------------------------------------------------------------------- FleetAPI (reads)
    def list_devices(self) -> list[dict]:
        return self.db.list_devices()

    def get_device(self, device_id: str) -> dict | None:
        device = self.db.get_device(device_id)
        if device is not None:
            events = [{**event, "device_id": device_id} for event in self.db.device_events(device_id, limit=50)]
            device["events"] = self.evidence.with_evidence(events) if self.evidence is not None else events
            device["slots"] = (device.get("state") or {}).get("slots")  # as the agent reports them
            device["rollups"] = self.db.device_rollups(device_id)[-60:]
        return device

    def list_deployments(self) -> list[dict]:
        return self.db.list_deployments()

    def get_deployment(self, deployment_id: str) -> dict | None:
        return self.db.get_deployment(deployment_id)

    def device_telemetry(self, device_id: str, limit: int) -> list[dict]:
        return self.db.device_telemetry(device_id, limit)

    def list_events(self, *, device_id: str | None = None, kind: str | None = None, event_id: str | None = None,
                    limit: int = 100) -> list[dict]:
        """Events newest first, each with its evidence (``GET /api/events``)."""
        return self.evidence.with_evidence(self.db.list_events(device_id=device_id, kind=kind, event_id=event_id,
                                                               limit=limit))

    def overview(self) -> dict:
        from .overview import EVENTS_SHOWN, overview

        return overview(self.db.list_devices(), self.db.events_after(None, EVENTS_SHOWN)[1])

    # ----------------------------------------------------------------- FleetAPI (operators)
    def abort_deployment(self, deployment_id: str, detail: str) -> dict:
        """Stop a running rollout (no later wave); LookupError / ValueError when there is none running."""
        found = self.db.get_deployment(deployment_id)
        if found is None:
            raise LookupError(f"no deployment {deployment_id}")
        if not self.db.abort_deployment(deployment_id, detail):
            raise ValueError(f"deployment {deployment_id} is {found['status']}, not running")
        return self.db.get_deployment(deployment_id)

    def device_command(self, device_id: str, cmd: str, args: dict) -> str:
        """Send a signed command to a known device; its id (LookupError for an unknown device)."""
        if self.db.get_device(device_id) is None:
            raise LookupError(f"no device {device_id}")
        return self.send_command(device_id, cmd, args)


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

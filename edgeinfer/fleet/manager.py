"""The fleet manager behind ``edgeinfer fleet serve``.

It starts and stops the parts, each in its own module: the broker (a supervised Mosquitto when no
``--broker`` is given), the database (SQLAlchemy + Alembic: SQLite or PostgreSQL), the services the API
serves from (access, commands, deployments with their rollout driver, devices, evidence), the HTTP API
and artifacts (FastAPI on uvicorn), ingest (bounded queue, batched writes, acknowledged once stored),
the MQTT link and retention. It does no work of its own. Several managers can share one broker and one
PostgreSQL: telemetry and events arrive through MQTT 5 shared subscriptions, so each message is
stored by one of them; every manager sees every ``state`` (retained, idempotent).
"""

from __future__ import annotations

import hashlib
import logging
import socket
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import ConfigError
from ..link.mqtt import MqttLink
from ..link.protocol import subscription
from ..link.settings import LinkSettings
from ..link.spool import Spool
from ..updates.signing import PRIVATE_KEY_FILE, SigningKey
from .access import MANAGER_USER, FleetAccess
from .api.app import build_app
from .api.deps import FleetServices
from .api.rate_limit import RateLimit
from .artifacts import ArtifactStore
from .auth import ADMIN_TOKEN_FILE
from .broker import ManagedMosquitto
from .broker_auth import DEVICE_CERT_DAYS
from .changes import ChangeFeed
from .claims import ClaimService
from .commands import CommandService
from .config_rollout import ConfigRollouts
from .configs import ConfigService
from .db import FleetDB
from .deployments import DeploymentService
from .devices import DeviceService
from .diagnosis import DiagnosisService
from .evidence import EvidenceLimits, EvidenceStore
from .http import FleetHTTPServer
from .ingest import Ingest
from .live_view import LiveView
from .metrics import FleetMetrics
from .rollout import RolloutDriver
from .samples import SampleLimits, SampleStore

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
    #: samples (samples.py): one sample's JPEG; all samples together (the oldest unreviewed go); their age
    sample_max_bytes: int = 4 << 20
    samples_max_bytes: int = 4096 << 20
    samples_retention_days: float = 90.0
    #: the rate limit on what is not authenticated, per client address (api/rate_limit.py): tokens a second (0: no
    #: limit) and the most at once
    unauthenticated_rate: float = RateLimit.rate_per_s
    unauthenticated_burst: int = RateLimit.burst
    #: the lifetime of a provisioned device's certificate (claims.py)
    device_cert_days: float = DEVICE_CERT_DAYS

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
    """Starts and stops the fleet's parts: ``start()`` then ``close()`` (or use as a context manager)."""

    def __init__(self, settings: FleetSettings) -> None:
        self.settings = settings
        self.data_dir = Path(settings.data_dir)
        self.broker_url = settings.broker
        self.db: FleetDB | None = None
        self.store: ArtifactStore | None = None
        self.key: SigningKey | None = None
        self.access: FleetAccess | None = None  # tokens, enrolment, the broker's accounts, the audit log
        self.broker: ManagedMosquitto | None = None  # the managed Mosquitto, if we started one
        self.evidence: EvidenceStore | None = None  # events' snapshots and clips
        self.samples: SampleStore | None = None  # samples for datasets
        self.changes: ChangeFeed | None = None  # the dashboard's change-feed updates
        self.live_view: LiveView | None = None  # devices' live frames and their viewers
        self.diagnosis: DiagnosisService | None = None  # devices' logs and doctor reports, on request
        self.http: FleetHTTPServer | None = None
        self.commands: CommandService | None = None
        self.deployments: DeploymentService | None = None
        self.configs: ConfigService | None = None  # the configuration layers, and their rollouts
        self.devices: DeviceService | None = None
        self.ingest: Ingest | None = None
        self.link: MqttLink | None = None
        self._spool: Spool | None = None
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
        s = self.settings
        self.data_dir.mkdir(parents=True, exist_ok=True)
        db = self.db = FleetDB(s.db_url or f"sqlite:///{self.data_dir / 'fleet.sqlite3'}")
        store = self.store = ArtifactStore(self.data_dir / "artifacts")
        key = self.key = self._load_or_create_key()
        access = self.access = FleetAccess(db, key, self.data_dir, tls=s.tls, tls_hosts=s.tls_hosts,
                                           listen_hosts=(s.broker_host, s.http_address()[0]),
                                           broker_url=s.broker, device_broker_url=s.device_broker_url)
        if self.broker_url is None:
            self.broker = access.start_broker(s.broker_host, s.broker_port)
            self.broker_url = access.broker_url
        evidence = self.evidence = EvidenceStore(db, self.data_dir / "evidence-incoming",
                                                 EvidenceLimits(snapshot_bytes=s.evidence_snapshot_max_bytes,
                                                                clip_bytes=s.evidence_clip_max_bytes,
                                                                total_bytes=s.evidence_max_bytes))
        self.samples = SampleStore(db, SampleLimits(jpeg_bytes=s.sample_max_bytes, total_bytes=s.samples_max_bytes,
                                                    max_age_s=s.samples_retention_days * DAY_S))
        changes = self.changes = ChangeFeed(db).start()
        host, port = s.http_address()
        try:
            self.http = FleetHTTPServer(host, port, tls=access.https_files(),
                                        client_ca=str(access.ca.ca_file) if access.ca is not None else None)
        except OSError as exc:
            raise ConfigError(f"cannot listen on {s.http}: {exc.strerror or exc}") from None
        access.manager_url = self.public_url
        if access.certificates is not None:
            access.certificates.days = s.device_cert_days  # enrolment and renewal: as long as provisioning's
        self._spool = Spool(self.data_dir / "commands-out.sqlite3")
        commands = self.commands = CommandService(db, key, self._spool)
        owner = f"{s.client_id()}-{uuid.uuid4().hex[:6]}"  # a restarted manager is a new owner
        deployments = self.deployments = DeploymentService(db, key, store, commands, public_url=self.public_url,
                                                           owner=owner, lease_ttl_s=s.lease_ttl_s)
        self.devices = DeviceService(db, evidence)
        live_view = self.live_view = LiveView(db, commands, lambda: self.public_url).start()
        self.diagnosis = DiagnosisService(db, commands, lambda: self.public_url)
        configs = self.configs = ConfigService(db, ConfigRollouts(db, deployments, store))
        claims = self.claims = ClaimService(db, access, lambda: self.public_url, cert_days=s.device_cert_days)
        services = FleetServices(access=access, artifacts=store, commands=commands, deployments=deployments,
                                 devices=self.devices, evidence=evidence, changes=changes, live_view=live_view,
                                 metrics=FleetMetrics(self), samples=self.samples, diagnosis=self.diagnosis,
                                 configs=configs, claims=claims,
                                 rate_limit=RateLimit(s.unauthenticated_rate, s.unauthenticated_burst))
        self.http.start(build_app(services))
        self.ingest = Ingest(db, on_event=deployments.follow_event, on_state=self._on_state,
                             queue_size=s.ingest_queue, batch_size=s.ingest_batch).start()
        commands.link = self.link = self._start_link(self.ingest, self._spool)
        deployments.rollouts.start()
        configs.rollouts.start()
        self._maintenance = threading.Thread(target=self._maintain, name="edgeinfer-fleet-retention", daemon=True)
        self._maintenance.start()

    def _start_link(self, ingest: Ingest, spool: Spool) -> MqttLink:
        s = self.settings
        assert self.access is not None and self.broker_url is not None
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
        return MqttLink(link_settings, spool=spool, name="edgeinfer-fleet-mqtt", subscriptions=topics,
                        on_delivery=ingest.deliver, on_connected=self._on_connected).start()

    def _on_state(self, device: str, state: dict) -> None:
        """A device's ``state``: its deployments' progress, and a configuration to catch up on if it is online."""
        assert self.deployments is not None and self.configs is not None
        self.deployments.follow_device_state(device, state)
        self.configs.rollouts.follow_state(device, state)

    def _on_connected(self, _offline_s: float | None) -> None:
        if self.broker is not None:  # our session (and its subscriptions) must survive a broker crash
            threading.Thread(target=self._save_broker, name="edgeinfer-fleet-broker-save", daemon=True).start()

    def _save_broker(self) -> None:
        if self._stop.wait(1.0):  # the SUBACKs first; a manager closed meanwhile has stopped its broker too
            return
        try:
            if self.broker is not None:
                self.broker.save()
        except Exception as exc:
            if not self._stop.is_set():
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
        """How devices reach the HTTP server (artifacts, evidence)."""
        if self.settings.public_url:
            return self.settings.public_url
        assert self.http is not None, "start() the manager first"
        return self.http.url

    @property
    def rollouts(self) -> RolloutDriver | None:
        """The driver of this manager's rollouts (what /metrics reads)."""
        return self.deployments.rollouts if self.deployments is not None else None

    @property
    def admin_token(self) -> str | None:
        """The admin token in ``<data_dir>/admin.token``, if that file is still there."""
        path = self.data_dir / ADMIN_TOKEN_FILE
        return path.read_text().strip() if path.exists() else None

    @property
    def rejected_messages(self) -> int:
        return self.ingest.stats.invalid if self.ingest is not None else 0

    def wait_connected(self, timeout: float = 10.0) -> bool:
        return self.link is not None and self.link.wait_connected(timeout)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._stop.set()
        catching_up = self.configs.rollouts if self.configs is not None else None
        for part in (self.changes, self.live_view, catching_up, self.rollouts, self.link, self.ingest, self.http,
                     self._spool, self.broker):
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

    # ------------------------------------------------------------------------------- retention
    def _maintain(self) -> None:
        while not self._stop.is_set():
            try:
                assert self.db is not None and self.evidence is not None
                deleted = self.db.prune(raw_max_age_s=self.settings.raw_retention_days * DAY_S,
                                        rollup_max_age_s=self.settings.rollup_retention_days * DAY_S,
                                        audit_max_age_s=self.settings.audit_retention_days * DAY_S)
                if any(deleted.values()):
                    log.info("retention: deleted %s", deleted)
                self.evidence.prune()
                if self.samples is not None:
                    self.samples.prune()
                self.db.forget_live_frames(time.time() - self.settings.raw_retention_days * DAY_S)
                self.db.diagnosis.prune(time.time() - self.settings.raw_retention_days * DAY_S)  # devices' log lines
            except Exception as exc:
                log.warning("retention pass failed: %s", exc)
            self._stop.wait(RETENTION_EVERY_S)

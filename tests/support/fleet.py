"""A fleet manager on a test broker, and a TCP proxy that cuts connections after N bytes (a real network fault)."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
import urllib.request
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from edgeinfer.fleet.access import FleetAccess
from edgeinfer.fleet.api.app import build_app
from edgeinfer.fleet.api.deps import MAX_UPLOAD_BYTES, FleetServices
from edgeinfer.fleet.artifacts import ArtifactStore
from edgeinfer.fleet.auth import ADMIN_TOKEN_FILE
from edgeinfer.fleet.broker_auth import hash_password
from edgeinfer.fleet.changes import ChangeFeed
from edgeinfer.fleet.claims import ClaimService
from edgeinfer.fleet.client import FleetClient
from edgeinfer.fleet.commands import CommandService
from edgeinfer.fleet.config_rollout import ConfigRollouts
from edgeinfer.fleet.configs import ConfigService
from edgeinfer.fleet.db import FleetDB
from edgeinfer.fleet.deployments import DeploymentService
from edgeinfer.fleet.devices import DeviceService
from edgeinfer.fleet.diagnosis import DiagnosisService
from edgeinfer.fleet.evidence import EvidenceLimits, EvidenceStore
from edgeinfer.fleet.http import FleetHTTPServer
from edgeinfer.fleet.live_view import LiveView
from edgeinfer.fleet.manager import FleetManager, FleetSettings
from edgeinfer.fleet.metrics import FleetMetrics
from edgeinfer.fleet.samples import SampleStore
from edgeinfer.link.spool import Spool
from edgeinfer.updates.signing import SigningKey

from .processes import wait_until


class CuttingProxy:
    """Forwards to ``target``; each of the first ``cuts`` connections is closed after ``cut_after`` bytes."""

    def __init__(self, target_port: int, *, cut_after: int, cuts: int) -> None:
        self.target_port = target_port
        self.cut_after = cut_after
        self.cuts_left = cuts
        self.connections = 0
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._accept, name="cutting-proxy", daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        self._listener.settimeout(0.2)
        while not self._stop.is_set():
            try:
                client, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            self.connections += 1
            limit = self.cut_after if self.cuts_left > 0 else None
            self.cuts_left -= 1
            threading.Thread(target=self._serve, args=(client, limit), daemon=True).start()

    def _serve(self, client: socket.socket, limit: int | None) -> None:
        upstream = socket.create_connection(("127.0.0.1", self.target_port))

        def pump_up() -> None:
            try:
                while data := client.recv(65536):
                    upstream.sendall(data)
            except OSError:
                pass

        threading.Thread(target=pump_up, daemon=True).start()
        sent = 0
        try:
            while data := upstream.recv(65536):
                if limit is not None and sent + len(data) > limit:
                    client.sendall(data[: limit - sent])
                    break
                client.sendall(data)
                sent += len(data)
        except OSError:
            pass
        finally:
            for sock in (client, upstream):
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                sock.close()

    def close(self) -> None:
        self._stop.set()
        self._listener.close()
        self._thread.join(timeout=2)


@contextlib.contextmanager
def running_fleet(data_dir: Path, broker_url: str) -> Iterator[FleetManager]:
    """A FleetManager on ``broker_url`` (HTTP on a free port), connected before it is handed over."""
    settings = FleetSettings(broker=broker_url, http="127.0.0.1:0", data_dir=data_dir)
    with FleetManager(settings) as manager:
        assert manager.wait_connected(10), "the fleet manager did not connect to the test broker"
        yield manager


def admin_token_file(manager: FleetManager) -> str:
    """The admin token ``fleet serve`` wrote on its first start (what --token-file takes)."""
    return str(manager.data_dir / ADMIN_TOKEN_FILE)


def admin_client(manager: FleetManager) -> FleetClient:
    return FleetClient(manager.http.url, token=manager.admin_token)


def api_get(manager: FleetManager, path: str, timeout: float = 10) -> bytes:
    """GET a path of the manager's API as its admin."""
    request = urllib.request.Request(f"{manager.http.url}{path}",
                                     headers={"Authorization": f"Bearer {manager.admin_token}"})
    with urllib.request.urlopen(request, timeout=timeout) as response:
        return response.read()


DEVICE_LOGIN = ("edgeinfer-test-cam-1", "a-device-password")


@contextlib.contextmanager
def api_server(db: FleetDB, folder: Path, *, artifacts: ArtifactStore | None = None,
               evidence: EvidenceLimits | None = None,
               max_upload_bytes: int = MAX_UPLOAD_BYTES,
               ca: bool = False) -> Iterator[tuple[FleetHTTPServer, FleetServices]]:
    """The fleet manager's HTTP API on ``db`` without a manager or a broker: its real services (tokens and the
    admin token file in ``folder``, a signing key, the artifacts, an evidence store, a command spool; no rollout
    driver, no MQTT link), served by uvicorn on a free port. ``ca``: with the fleet CA in ``folder`` and devices told
    of an mqtts:// broker, so that claims provision devices (the API stays plain HTTP)."""
    folder.mkdir(parents=True, exist_ok=True)
    key = SigningKey.generate()
    store = artifacts or ArtifactStore(folder / "artifacts")
    spool = Spool(folder / "commands-out.sqlite3")
    evidence_store = EvidenceStore(db, folder / "evidence-incoming", evidence or EvidenceLimits())
    commands = CommandService(db, key, spool)
    try:
        with FleetHTTPServer() as server:
            deployments = DeploymentService(db, key, store, commands, public_url=server.url)
            access = FleetAccess(db, key, folder, tls=ca,
                                 device_broker_url="mqtts://127.0.0.1:8883" if ca else None)
            services = FleetServices(
                access=access, artifacts=store, commands=commands,
                deployments=deployments,
                devices=DeviceService(db, evidence_store), evidence=evidence_store, changes=ChangeFeed(db),
                live_view=LiveView(db, commands, lambda: server.url), metrics=FleetMetrics(None),
                samples=SampleStore(db), diagnosis=DiagnosisService(db, commands, lambda: server.url),
                configs=ConfigService(db, ConfigRollouts(db, deployments, store)),
                claims=ClaimService(db, access, lambda: server.url), max_upload_bytes=max_upload_bytes)
            services.live_view.start()
            server.start(build_app(services))
            try:
                yield server, services
            finally:
                services.live_view.close()
    finally:
        spool.close()


def admin_of(folder: Path) -> str:
    """The admin token an :func:`api_server` on ``folder`` wrote on its first start."""
    return (folder / ADMIN_TOKEN_FILE).read_text().strip()


@contextlib.contextmanager
def artifact_server(store: ArtifactStore, folder: Path) -> Iterator[FleetHTTPServer]:
    """The fleet manager's HTTP server on ``store`` with real access checks: one device enrolled in a
    real (SQLite) fleet database, whose login is DEVICE_LOGIN (what an agent shows when it downloads)."""
    db = FleetDB(f"sqlite:///{folder / 'artifact-server.sqlite3'}")
    db.put_credentials([{"device_id": "cam-1", "fleet": "test", "username": DEVICE_LOGIN[0],
                         "password_hash": hash_password(DEVICE_LOGIN[1]), "created_at": 0.0, "revoked_at": None}])
    try:
        with api_server(db, folder, artifacts=store) as (server, _):
            yield server
    finally:
        db.close()


def state_message(device: str, boot: str, *, fleet: str = "f", version: str = "1", groups=("lobby",)) -> dict:
    """A device's retained birth message: online, one pipeline running mobilenet.tflite ``version`` on xnnpack."""
    return {"v": 1, "type": "state", "fleet": fleet, "device": device, "ts": time.time(), "online": True,
            "boot_id": boot, "groups": list(groups),
            "pipelines": [{"name": "main", "status": "running", "delegate": "xnnpack",
                           "model": {"path": "/m/mobilenet.tflite", "sha256": "a" * 64, "version": version}}]}


def telemetry_message(device: str, boot: str, seq: int, *, fleet: str = "f", fps: float = 30.0) -> dict:
    """One window of telemetry: pipeline main at ``fps``, latency p95 9 ms."""
    return {"v": 1, "type": "telemetry", "fleet": fleet, "device": device, "ts": time.time(), "boot_id": boot,
            "seq": seq, "interval_s": 1.0,
            "pipelines": [{"name": "main", "status": "running", "frames": 30, "dropped": 0, "fps": fps,
                           "stages": {"latency": {"p50": 5.0, "p95": 9.0, "p99": 12.0}}}],
            "system": {"cpu_percent": 20.0, "rss_bytes": 1000}, "spool": {"pending": 0, "dropped": 0}}


@dataclass
class SimulatedFleet:
    manager: Any
    simulation: Any
    admin: Any
    ids: list[str]
    #: device id -> (MQTT user name, password): what the device itself signs in with (sample uploads too)
    credentials: dict[str, tuple[str, str]] = field(default_factory=dict)


@contextlib.contextmanager
def simulated_fleet(data_dir: Path, *, devices: int, behaviours: Mapping[str, str] | None = None,
                    interval_s: float = 1.0, fleet: str = "canary",
                    update_delay_s: tuple[float, float] = (0.05, 0.2), ramp_s: float | None = 2.0,
                    online_timeout: float = 60.0, db_url: str | None = None,
                    groups: tuple[str, ...] = (), config_refuse_rate: float = 0.0,
                    seed: int = 0) -> Iterator[SimulatedFleet]:
    """A manager with its managed Mosquitto (and its database at ``db_url``: default SQLite in ``data_dir``),
    ``devices`` enrolled in one call and simulated in this process (``behaviours``: model name → how the devices
    run it; ``groups``: theirs; ``config_refuse_rate``: the share that refuse configuration documents, by ``seed``);
    yielded once every device is online in the manager's database with telemetry."""
    from edgeinfer.tools.simulate import Simulation, SimulationSettings
    from support.ports import free_port

    settings = FleetSettings(broker=None, broker_port=free_port(), http="127.0.0.1:0", data_dir=data_dir,
                             db_url=db_url)
    with FleetManager(settings) as manager:
        assert manager.wait_connected(10), "the fleet manager did not connect to its Mosquitto"
        admin = FleetClient(manager.http.url, token=manager.admin_token)
        ids = [f"sim-{i:05d}" for i in range(devices)]
        issued = admin.enroll_many(ids, fleet)
        credentials = {e["device_id"]: (e["username"], e["password"]) for e in issued}
        simulation = Simulation(SimulationSettings(broker=manager.broker_url, devices=devices, fleet=fleet,
                                                   interval_s=interval_s, update_delay_s=update_delay_s,
                                                   ramp_s=ramp_s, credentials=credentials, groups=groups,
                                                   behaviours=dict(behaviours or {}), seed=seed,
                                                   config_refuse_rate=config_refuse_rate))
        with simulation:
            simulation.start()

            def all_online() -> bool:
                rows = {d["device_id"]: d for d in manager.db.list_devices()}
                return all(i in rows and rows[i]["online"] and rows[i]["last_telemetry"] for i in ids)

            assert wait_until(all_online, online_timeout, 0.2), \
                f"not every device came online: {simulation.online}/{devices} connected"
            yield SimulatedFleet(manager, simulation, admin, ids, credentials)
            simulation.stop(drain_s=1.0)


def api_call(sim: Any, method: str, path: str, body: Any = None, *, token: str | None = None,
             raw: bytes | None = None) -> tuple[int, Any]:
    """(status, JSON answer) of a request to ``sim``'s manager as its admin (or ``token``): a refusal is an answer."""
    import json
    import urllib.error

    data = raw if raw is not None else json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(f"{sim.manager.http.url}{path}", data=data, method=method, headers={
        "Authorization": f"Bearer {token or sim.manager.admin_token}", "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            return answer.status, json.loads(answer.read() or b"null")
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"null")

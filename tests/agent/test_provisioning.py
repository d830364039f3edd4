"""A device's first boot with a claim and its certificate's renewal, on real files: the key made once (0600) and
never sent, the same request re-sent while pending and after a restart, Retry-After honoured, refusals typed and
not repeated, the identity written whole and laid over agent.yaml; renewal against a real fleet manager's HTTPS."""

from __future__ import annotations

import json
import stat
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import yaml
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from support.ports import free_port

from edgeinfer.agent.config import load_config
from edgeinfer.agent.identity import (
    CERT_FILE,
    IDENTITY_FILE,
    KEY_FILE,
    REQUEST_FILE,
    certificate_request,
    hardware,
    identity_dir,
    write_identity,
)
from edgeinfer.agent.provisioning import CertificateRenewer, provision, renew
from edgeinfer.errors import ProvisioningRefused
from edgeinfer.fleet.broker_auth import FleetCA
from edgeinfer.fleet.device_certs import read_csr, sign_csr
from edgeinfer.util.backoff import Backoff

FAST = Backoff(initial_s=0.01, max_s=0.05, jitter=0.0)


def test_the_hardware_is_named_from_a_root_folder(tmp_path, monkeypatch):
    monkeypatch.delenv("EDGEINFER_SERIAL", raising=False)
    root = tmp_path / "root"
    (root / "proc/device-tree").mkdir(parents=True)
    (root / "proc/device-tree/serial-number").write_bytes(b"10000000abcdef01\x00")
    (root / "proc/device-tree/model").write_bytes(b"Raspberry Pi 5 Model B Rev 1.0\x00")
    for name, mac in (("lo", "00:00:00:00:00:00"), ("eth0", "D8:3A:DD:01:02:03"), ("wlan0", "d8:3a:dd:04:05:06")):
        (root / f"sys/class/net/{name}").mkdir(parents=True)
        (root / f"sys/class/net/{name}/address").write_text(mac + "\n")
    assert hardware(root) == {"serial": "10000000abcdef01", "model": "Raspberry Pi 5 Model B Rev 1.0",
                              "mac": "d8:3a:dd:01:02:03"}
    assert hardware(root, serial="sim-7")["serial"] == "sim-7"
    monkeypatch.setenv("EDGEINFER_SERIAL", "sim-8")
    assert hardware(root)["serial"] == "sim-8"
    monkeypatch.delenv("EDGEINFER_SERIAL")
    other = tmp_path / "other"
    (other / "proc").mkdir(parents=True)
    (other / "proc/cpuinfo").write_text("processor\t: 0\nSerial\t\t: 00000000c0ffee42\n")
    assert hardware(other) == {"serial": "00000000c0ffee42", "model": None, "mac": None}
    (other / "proc/cpuinfo").write_text("processor\t: 0\n")
    (other / "etc").mkdir()
    (other / "etc/machine-id").write_text("4f1c0e2d9a8b4c7d8e9f0a1b2c3d4e5f\n")
    assert hardware(other)["serial"] == "4f1c0e2d9a8b4c7d8e9f0a1b2c3d4e5f"
    with pytest.raises(ValueError, match="serial:"):
        hardware(tmp_path / "empty")


class Manager:
    """A stand-in for POST /api/v1/provision that answers from a script and signs with a real FleetCA; records each
    request (the real endpoint is the fleet's: this one checks the agent's side of the contract)."""

    def __init__(self, folder, script: list[tuple[int, dict]]) -> None:
        self.ca = FleetCA(folder / "ca").ensure()
        self.script = script
        self.requests: list[dict] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                outer.requests.append({"path": self.path, **body})
                status, answer = outer.script.pop(0) if outer.script else (500, {"error": "script ended"})
                if answer.get("status") == "approved":
                    cert = sign_csr(outer.ca, read_csr(body["csr"]), answer["device_id"], days=30)
                    answer = {**answer, "certificate": cert.public_bytes(serialization.Encoding.PEM).decode(),
                              "ca": outer.ca.ca_file.read_text()}
                data = json.dumps(answer).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                if "retry" in answer:
                    self.send_header("Retry-After", str(answer["retry"]))
                self.end_headers()
                self.wfile.write(data)

        self.server = ThreadingHTTPServer(("127.0.0.1", free_port()), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_port}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


APPROVED = {"status": "approved", "device_id": "cam-0042", "broker": {"host": "127.0.0.1", "port": 8884, "tls": True},
            "manager_url": "https://fleet.example:8443", "update_key": None, "groups": ["lobby"],
            "not_after": "2030-01-01T00:00:00+00:00"}
PENDING = {"status": "pending", "device_id": "cam-0042", "retry_after_s": 1, "retry": 1}


def test_first_boot_pends_resumes_after_a_restart_and_writes_the_identity_whole(tmp_path):
    manager = Manager(tmp_path, [(202, PENDING), (429, {"error": "slow down", "retry": 1}), (503, {}),
                                 (202, PENDING), (200, dict(APPROVED))])
    folder = identity_dir(tmp_path / "data")
    names = {"serial": "0042", "model": "Pi", "mac": None}
    try:
        stop = threading.Event()
        threading.Timer(0.3, stop.set).start()  # the agent is stopped while pending: nothing is lost
        assert provision(manager.url, "eic_claim", folder, names, stop=stop, backoff=FAST) is None
        assert len(manager.requests) == 1 and not (folder / IDENTITY_FILE).exists()
        assert stat.S_IMODE((folder / KEY_FILE).stat().st_mode) == 0o600
        key_before = (folder / KEY_FILE).read_bytes()
        started = time.monotonic()
        keys = provision(manager.url, "eic_claim", folder, names, backoff=FAST)  # the restarted agent
        assert time.monotonic() - started >= 2.0  # Retry-After (1 s, twice) honoured over the faster backoff
    finally:
        manager.close()
    assert (folder / KEY_FILE).read_bytes() == key_before
    requests = manager.requests
    assert len(requests) == 5 and {r["csr"] for r in requests} == {(folder / REQUEST_FILE).read_text()}
    assert all(r["claim"] == "eic_claim" and r["hardware"] == names for r in requests)
    assert "PRIVATE" not in json.dumps(requests)  # the key never left
    assert keys["device_id"] == "cam-0042" and keys["broker"] == "mqtts://127.0.0.1:8884"
    cert = x509.load_pem_x509_certificate((folder / CERT_FILE).read_bytes())
    key = serialization.load_pem_private_key(key_before, password=None)
    assert cert.public_key() == key.public_key()
    assert not list(folder.glob(".*.tmp*"))  # written atomically: no temporary file left
    # the agent runs with the identity in place of agent.yaml's
    config_file = tmp_path / "agent.yaml"
    config_file.write_text(yaml.safe_dump({"claim": "eic_claim", "manager_url": manager.url,
                                           "data_dir": str(tmp_path / "data"), "device_id": "not-this-one"}))
    config = load_config(config_file)
    assert (config.device_id, config.broker, config.groups) == ("cam-0042", "mqtts://127.0.0.1:8884", ("lobby",))
    assert (config.mqtt.cert, config.mqtt.key) == (str(folder / CERT_FILE), str(folder / KEY_FILE))
    assert config.manager_url == "https://fleet.example:8443"


@pytest.mark.parametrize("status", [400, 401, 403, 409])
def test_a_refusal_is_said_once_and_not_asked_again(tmp_path, status):
    manager = Manager(tmp_path, [(status, {"error": "claim expired"}), (200, dict(APPROVED))])
    try:
        with pytest.raises(ProvisioningRefused, match="claim expired") as info:
            provision(manager.url, "eic_x", identity_dir(tmp_path / "d"), {"serial": "1"}, backoff=FAST)
    finally:
        manager.close()
    assert info.value.status == status and len(manager.requests) == 1


def test_a_claim_needs_the_manager_it_is_traded_with(tmp_path):
    from edgeinfer.errors import ConfigError

    (tmp_path / "agent.yaml").write_text("claim: eic_x\ndevice_id: a\n")
    with pytest.raises(ConfigError, match="claim: needs manager_url"):
        load_config(tmp_path / "agent.yaml")


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    from edgeinfer.fleet.manager import FleetManager, FleetSettings

    settings = FleetSettings(broker=None, broker_port=free_port(), http="127.0.0.1:0", tls=True,
                             data_dir=tmp_path_factory.mktemp("fleet"))
    with FleetManager(settings) as manager:
        assert manager.wait_connected(10)
        yield manager


def provisioned(fleet, folder, device_id: str) -> None:
    """A device's identity folder as a first boot leaves it, its certificate issued by the manager's CA."""
    write_identity(folder, fleet.claims.renew(device_id, certificate_request(folder)))


def test_renewal_gives_the_same_key_a_new_certificate_over_the_managers_https(fleet, tmp_path):
    folder = identity_dir(tmp_path)
    provisioned(fleet, folder, "renew-1")
    old = x509.load_pem_x509_certificate((folder / CERT_FILE).read_bytes())
    keys, answer = renew(folder, fleet.public_url)
    new = x509.load_pem_x509_certificate((folder / CERT_FILE).read_bytes())
    assert answer.status == 200 and keys["device_id"] == "renew-1"
    assert new.serial_number != old.serial_number and new.public_key() == old.public_key()
    assert new.subject == old.subject and new.not_valid_after_utc >= old.not_valid_after_utc
    assert answer.skew_s() is not None and abs(answer.skew_s()) < 60
    # revoked: renewal refused for good (401), said so
    fleet.access.revoke_device("renew-1")
    with pytest.raises(ProvisioningRefused) as info:
        renew(folder, fleet.public_url)
    assert info.value.status == 401


def test_the_renewer_renews_at_two_thirds_and_reports_a_clock_outside_the_certificate(fleet, tmp_path):
    folder = identity_dir(tmp_path)
    provisioned(fleet, folder, "renew-2")
    cert = x509.load_pem_x509_certificate((folder / CERT_FILE).read_bytes())
    start, end = cert.not_valid_before_utc.timestamp(), cert.not_valid_after_utc.timestamp()
    reports: list[str] = []
    now = [start + (end - start) * 0.5]
    renewer = CertificateRenewer(folder, fleet.public_url, report=reports.append, clock=lambda: now[0])
    assert renewer.due_in_s() == pytest.approx((end - start) * (2 / 3 - 0.5), abs=1)
    now[0] = start + (end - start) * 0.7
    assert renewer.due_in_s() < 0 and not reports
    renewed = threading.Event()
    renewer.renewed = renewed.set
    renewer.start()
    try:
        assert renewed.wait(20), reports
    finally:
        renewer.close()
    assert x509.load_pem_x509_certificate((folder / CERT_FILE).read_bytes()).serial_number != cert.serial_number
    now[0] = start - 86_400 * 400  # a board without a clock, back in 1970-ish
    CertificateRenewer(folder, fleet.public_url, report=reports.append, clock=lambda: now[0]).due_in_s()
    assert any("clock" in r and "outside its certificate's life" in r for r in reports)

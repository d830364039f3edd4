"""`edgeinfer fleet simulate --claim`: simulated devices provisioned through the real flow — each makes its key, sends
its CSR with the claim to a real fleet manager (``--tls``, PostgreSQL, its managed Mosquitto), gets its certificate and
connects to the certificate listener with it as soon as it has it, while others still wait — and the broker's password
and ACL files do not grow."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.x509.oid import NameOID
from support.ports import free_port
from support.processes import edgeinfer_cmd, env_with_repo
from support.processes import wait_until as wait

from edgeinfer.agent.identity import identity_dir
from edgeinfer.agent.provisioning import provision
from edgeinfer.fleet.client import FleetClient
from edgeinfer.fleet.manager import FleetManager, FleetSettings
from edgeinfer.tools.simulate.provision import hardware_of

DEVICES = 20
#: the broker's configuration files that grow with password accounts (the CRL aside: revocations grow it)
BROKER_FILES = ("passwd", "acl", "acl-certificates", "mosquitto.conf")


@pytest.fixture(scope="module")
def fleet(tmp_path_factory, postgres):
    # every simulated device asks from 127.0.0.1: the per-address limit of unauthenticated requests is off here
    settings = FleetSettings(broker=None, broker_port=free_port(), http="127.0.0.1:0", tls=True,
                             data_dir=tmp_path_factory.mktemp("fleet"), db_url=postgres.create_database(),
                             unauthenticated_rate=0.0)
    with FleetManager(settings) as manager:
        assert manager.wait_connected(10)
        yield manager


def broker_files(fleet) -> dict[str, bytes]:
    folder = Path(fleet.settings.data_dir) / "mosquitto"
    return {name: (folder / name).read_bytes() for name in BROKER_FILES}


def simulate(fleet, claim: str, folder: Path, *more: str, devices: int = DEVICES) -> subprocess.Popen:
    return subprocess.Popen(
        edgeinfer_cmd("fleet", "simulate", "--devices", str(devices), "--claim", claim, "--manager-url",
                      fleet.http.url, "--ca", str(fleet.access.ca.ca_file), "--identity-dir", str(folder),
                      "--interval", "0.5", "--json", *more),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env_with_repo())


def test_simulated_devices_are_provisioned_by_claim_and_connect_with_their_own_certificates(fleet, tmp_path):
    admin = FleetClient(fleet.http.url, token=fleet.admin_token, ca=str(fleet.access.ca.ca_file))
    claim = admin.create_claim({"groups": ["sim"], "max_devices": DEVICES})["token"]
    before = broker_files(fleet)
    assert all(before.values()), before
    run = simulate(fleet, claim, tmp_path / "ids", "--duration", "300")
    ids = [f"cam-sim-{i:05d}" for i in range(DEVICES)]  # the manager names them: its template, their serials

    def all_online() -> bool:
        rows = {d["device_id"]: d for d in fleet.db.list_devices()}
        return all(i in rows and rows[i]["online"] and rows[i]["last_telemetry"] for i in ids)

    try:
        assert wait(all_online, 120, 0.5), f"not every device came online (simulator: {run.poll()})"
    finally:
        run.send_signal(signal.SIGTERM)
        out, err = run.communicate(timeout=60)
    assert run.returncode == 0, err
    report = json.loads(out)
    assert report["provisioning"]["provisioned"] == DEVICES and report["provisioning"]["refused"] == {}
    assert report["provisioning"]["failed"] == 0 and report["provisioning"]["resumed"] == 0
    assert sorted(report["per_device"]) == ids and report["all_online_s"] is not None
    assert report["acked"] > 0 and report["refused"] == 0  # the pattern ACL lets each write its own topics
    # every device's own key and certificate: CN its id, signed by the fleet CA, the key never sent (0600)
    ca = x509.load_pem_x509_certificate(fleet.access.ca.ca_file.read_bytes())
    for i, device_id in enumerate(ids):
        folder = tmp_path / "ids" / f"sim-{i:05d}" / "identity"
        cert = x509.load_pem_x509_certificate((folder / "device.crt").read_bytes())
        cert.verify_directly_issued_by(ca)
        assert cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == device_id
        key = serialization.load_pem_private_key((folder / "device.key").read_bytes(), password=None)
        assert key.public_key() == cert.public_key()
        assert (folder / "device.key").stat().st_mode & 0o777 == 0o600
    approved = {r["device_id"] for r in admin.provisioning("approved")}
    assert set(ids) <= approved
    # the broker knew each device by its certificate's CN (use_identity_as_username), not by an account
    log = (Path(fleet.settings.data_dir) / "mosquitto" / "mosquitto.log").read_text()
    for device_id in ids:
        assert f"as {device_id} (" in log and f"u'{device_id}')" in log, device_id
    assert broker_files(fleet) == before  # no account, no ACL line per device: the same bytes


def test_a_second_fleet_with_the_same_serials_is_refused_and_says_why(fleet, tmp_path):
    admin = FleetClient(fleet.http.url, token=fleet.admin_token, ca=str(fleet.access.ca.ca_file))
    claim = admin.create_claim({"groups": ["sim"]})["token"]
    first = simulate(fleet, claim, tmp_path / "a", "--serial-prefix", "twice-", "--duration", "1")
    out, err = first.communicate(timeout=120)
    assert first.returncode == 0, err
    assert json.loads(out)["provisioning"]["provisioned"] == DEVICES
    # other keys for the same serials (other hardware claiming to be it): 409, counted by reason, exit 1
    again = simulate(fleet, claim, tmp_path / "b", "--serial-prefix", "twice-", "--duration", "1")
    out, err = again.communicate(timeout=120)
    assert again.returncode == 1
    assert json.loads(out)["provisioning"]["refused"] == {"409 serial taken by another key": DEVICES}
    assert "no device was provisioned" in err and "requested with another key" in err
    # the same keys (a restarted simulator, as a restarted agent): the same certificates, nothing asked again
    resumed = simulate(fleet, claim, tmp_path / "a", "--serial-prefix", "twice-", "--duration", "1")
    out, err = resumed.communicate(timeout=120)
    assert resumed.returncode == 0, err
    assert json.loads(out)["provisioning"]["resumed"] == DEVICES
    assert os.path.exists(tmp_path / "a" / "twice-00000" / "identity" / "identity.yaml")


def test_a_device_connects_as_soon_as_it_has_its_certificate_while_others_still_wait(fleet, tmp_path):
    admin = FleetClient(fleet.http.url, token=fleet.admin_token, ca=str(fleet.access.ca.ca_file))
    auto = admin.create_claim({"groups": ["sim"]})["token"]
    manual = admin.create_claim({"groups": ["sim"], "approve": "manual"})["token"]
    # two devices already hold their certificates (the agent's own first boot, before this run: a restarted simulator
    # keeps them); the other two ask a claim that an operator must approve, and nobody does
    for serial in ("early-00000", "early-00001"):
        provision(fleet.http.url, auto, identity_dir(tmp_path / "ids" / serial), hardware_of(serial),
                  cafile=str(fleet.access.ca.ca_file))
    run = simulate(fleet, manual, tmp_path / "ids", "--serial-prefix", "early-", "--duration", "300", devices=4)
    ready = ["cam-early-00000", "cam-early-00001"]

    def ready_online_while_others_pend() -> bool:
        rows = {d["device_id"]: d for d in fleet.db.list_devices()}
        pending = {r["serial"] for r in admin.provisioning("pending")}
        return (pending == {"early-00002", "early-00003"}
                and all(i in rows and rows[i]["online"] and rows[i]["last_telemetry"] for i in ready))

    try:
        assert wait(ready_online_while_others_pend, 60, 0.5), f"not connected while others wait ({run.poll()})"
    finally:
        run.send_signal(signal.SIGTERM)  # the pending two are given up: counted as failed, exit 1
        out, err = run.communicate(timeout=60)
    assert run.returncode == 1, err
    report = json.loads(out)
    assert report["provisioning"]["resumed"] == 2 and report["provisioning"]["failed"] == 2
    assert sorted(report["per_device"]) == ready and report["all_online_s"] is not None and report["acked"] > 0
    assert "2 unanswered or pending" in err

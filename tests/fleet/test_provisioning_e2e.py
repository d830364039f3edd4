"""One image for many devices, end to end (docs/provisioning.md, *The one-image flow*): a real fleet manager with its
fleet CA (``--tls``), its managed Mosquitto and a real PostgreSQL; real ``edgeinfer agent`` processes; a real
Chromium.

One agent.yaml with an automatic claim (as ``fleet claim create --out`` writes it, plus the team's pipeline), copied
byte for byte to three devices that differ only by their serial: each makes its own key, trades the claim for its
own certificate (CN = the id the manager's template gives it), joins the group, publishes on its own topics only,
and takes a model rollout over mqtts and https. One is revoked: the broker closes its connection (the time is
printed) while the two others go on reporting. A manual claim leaves a fourth device pending — killed and restarted
while it waits, it asks again with the same key — until an admin approves it on the Pending devices page; then it
joins."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest
import yaml
from cryptography import x509
from cryptography.x509.oid import NameOID
from support.agent import AgentProcess
from support.assets import IMAGES, MOBILENET_TINY, MOBILENET_V2
from support.device_certs import CertDevice, https
from support.fleet import state_message
from support.ports import free_port
from support.processes import edgeinfer_cmd
from support.processes import wait_until as wait

from edgeinfer.agent.identity import CA_FILE, CERT_FILE, IDENTITY_FILE, KEY_FILE, identity_dir
from edgeinfer.capture import make_test_clip
from edgeinfer.fleet.client import FleetClient
from edgeinfer.fleet.manager import FleetManager, FleetSettings
from edgeinfer.link.protocol import Topics
from edgeinfer.link.vocabulary import DEFAULT_FLEET

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

GROUP = "lobby"
SERIALS = ("e2e-a", "e2e-b", "e2e-c")


@pytest.fixture(scope="module")
def fleet(tmp_path_factory, postgres):
    settings = FleetSettings(broker=None, broker_port=free_port(), http="127.0.0.1:0", tls=True,
                             data_dir=tmp_path_factory.mktemp("fleet"), db_url=postgres.create_database())
    with FleetManager(settings) as manager:
        assert manager.wait_connected(10)
        yield manager


@pytest.fixture(scope="module")
def admin(fleet):
    return FleetClient(fleet.http.url, token=fleet.admin_token, ca=str(fleet.access.ca.ca_file))


@pytest.fixture(scope="module")
def clip(tmp_path_factory) -> Path:
    return make_test_clip(tmp_path_factory.mktemp("clip") / "clip.avi", [IMAGES / "parrot.jpg", IMAGES / "cat.bmp"],
                          size=(160, 120), fps=10, frames_per_image=5)


def fleet_cli(fleet, *args: str) -> subprocess.CompletedProcess:
    """``edgeinfer ARGS`` as an admin runs it against ``fleet`` (its URL, token and CA from the environment)."""
    env = {**os.environ, "EDGEINFER_FLEET_URL": fleet.http.url, "EDGEINFER_FLEET_TOKEN": fleet.admin_token,
           "EDGEINFER_FLEET_CA": str(fleet.access.ca.ca_file)}
    done = subprocess.run(edgeinfer_cmd(*args), capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr + done.stdout
    return done


def make_image(fleet, folder: Path, clip: Path, approve: str) -> Path:
    """The image's /etc/edgeinfer: what ``fleet claim create --out`` writes (claim, manager_url, ca, update key, the
    CA beside it), and the team's own lines for every device (the pipeline, where data lives, timers)."""
    printed = yaml.safe_load(fleet_cli(fleet, "fleet", "claim", "create", "--group", GROUP, "--approve", approve,
                                       "--out", str(folder)).stdout)
    assert set(printed) == {"claim", "manager_url", "ca", "update_public_key"}
    assert printed["manager_url"] == fleet.public_url and printed["manager_url"].startswith("https://")
    written = yaml.safe_load((folder / "agent.yaml").read_text())
    assert written == printed and (folder / printed["ca"]).read_bytes() == fleet.access.ca.ca_file.read_bytes()
    team = {"data_dir": "data", "telemetry_interval_s": 1.0, "reconnect_min_s": 0.1, "reconnect_max_s": 1.0,
            "profile": "none", "update_health_frames": 2, "update_max_latency_factor": 1000.0,
            "pipelines": [{"name": "main", "model": str(MOBILENET_TINY), "source": str(clip), "task": "classify",
                           "loop": True, "max_fps": 1, "threads": 1, "version": "1"}]}
    with open(folder / "agent.yaml", "a") as out:
        out.write(yaml.safe_dump(team, sort_keys=False))
    return folder


def flash(image: Path, device: Path) -> Path:
    """A device flashed from ``image``: its files byte for byte; the agent.yaml path."""
    shutil.copytree(image, device)
    assert all((device / f.name).read_bytes() == f.read_bytes() for f in image.iterdir())
    return device / "agent.yaml"


def start_device(device: Path, serial: str, log_name: str = "agent.log") -> AgentProcess:
    """The agent of a device whose hardware serial is ``serial`` ($EDGEINFER_SERIAL stands for the device tree)."""
    return AgentProcess(device / "agent.yaml", device / log_name, env={"EDGEINFER_SERIAL": serial}).start()


def reporting(fleet, device_id: str) -> bool:
    row = fleet.db.get_device(device_id)
    return bool(row and row["online"] and row["last_telemetry"] and [
        p.get("status") for p in (row["state"] or {}).get("pipelines") or []] == ["running"])


def telemetry_seq(fleet, device_id: str) -> int:
    return int((fleet.db.get_device(device_id)["last_telemetry"] or {}).get("seq") or 0)


def common_name(path: Path) -> str:
    cert = x509.load_pem_x509_certificate(path.read_bytes())
    return cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value


def test_one_image_three_devices_own_certificates_own_topics_a_rollout_and_one_revoked(fleet, admin, clip, tmp_path):
    image = make_image(fleet, tmp_path / "image", clip, "auto")
    devices = {serial: flash(image, tmp_path / serial).parent for serial in SERIALS}
    ids = {serial: f"cam-{serial}" for serial in SERIALS}  # the claim's default template, cam-{serial}
    agents = {serial: start_device(devices[serial], serial) for serial in SERIALS}
    try:
        assert wait(lambda: all(reporting(fleet, ids[s]) for s in SERIALS), 120, 0.3), \
            {s: a.output()[-3000:] for s, a in agents.items()}

        # each made its own key and got its own certificate, named by the manager; nothing was copied by hand
        ca = x509.load_pem_x509_certificate(fleet.access.ca.ca_file.read_bytes())
        keys = set()
        for serial, device in devices.items():
            folder = identity_dir(device / "data")
            assert oct((folder / KEY_FILE).stat().st_mode & 0o777) == "0o600"
            keys.add((folder / KEY_FILE).read_bytes())
            assert common_name(folder / CERT_FILE) == ids[serial]
            assert x509.load_pem_x509_certificate((folder / CERT_FILE).read_bytes()).issuer == ca.subject
            identity = yaml.safe_load((folder / IDENTITY_FILE).read_text())
            assert identity["broker"] == fleet.access.certificate_broker_url() and identity["groups"] == [GROUP]
            assert identity["manager_url"] == fleet.public_url
        assert len(keys) == 3
        listed = {d["device_id"]: d for d in admin.devices()}
        assert all(GROUP in (listed[ids[s]].get("groups") or []) for s in SERIALS), listed
        requests = {r["device_id"]: r for r in admin.provisioning(None)}
        assert all(requests[ids[s]]["state"] == "approved" and requests[ids[s]]["serial"] == s for s in SERIALS)

        # a model rollout to the group: signed, over mqtts (the certificate listener) and https (the artifact)
        done = fleet_cli(fleet, "deploy", str(MOBILENET_V2), "--version", "2", "--group", GROUP, "--canary", "34",
                         "--no-canary-analysis", "--json")
        final = json.loads(done.stdout)
        assert final["status"] == "succeeded" and final["counts"] == {"active": 3}, final
        sha = hashlib.sha256(MOBILENET_V2.read_bytes()).hexdigest()
        assert wait(lambda: all(fleet.db.get_device(ids[s])["model_version"] == 2 for s in SERIALS), 30, 0.3)

        # one revoked: the broker closes its connection, refuses it again, and its certificate opens nothing
        revoked, others = "e2e-c", ("e2e-a", "e2e-b")
        folder = identity_dir(devices[revoked] / "data")
        assert https(fleet, f"/artifacts/{sha}", str(folder / CERT_FILE), str(folder / KEY_FILE)) == 200
        started = time.monotonic()
        admin.revoke_device(ids[revoked])
        assert wait(lambda: not fleet.db.get_device(ids[revoked])["online"], 30, 0.02), \
            agents[revoked].output()[-3000:]
        print(f"\nrevoked device {ids[revoked]} cut off (its MQTT connection closed, its will received) after "
              f"{time.monotonic() - started:.3f} s")
        seqs = {s: telemetry_seq(fleet, ids[s]) for s in others}
        assert wait(lambda: all(telemetry_seq(fleet, ids[s]) >= seqs[s] + 3 for s in others), 30, 0.3)
        assert not fleet.db.get_device(ids[revoked])["online"]  # it kept trying (reconnect 0.1-1 s): refused
        assert agents[revoked].alive()
        # its log says why, not just "connection lost": once the broker has re-read its CRL, a reconnect is refused
        # with the TLS alert (before, on a loaded machine, its retries may only have met the closed session's EOF)
        assert wait(lambda: "certificate revoked" in agents[revoked].output(), 30, 0.2), \
            agents[revoked].output()[-3000:]
        assert all(reporting(fleet, ids[s]) for s in others)
        assert https(fleet, f"/artifacts/{sha}", str(folder / CERT_FILE), str(folder / KEY_FILE)) == 401

        # its own topics only: with A's certificate (A's agent stopped), a state on B's topic is dropped by the
        # broker's pattern ACL; the next one, on A's own topic, lands
        a, b = (ids[s] for s in others)
        assert agents["e2e-a"].terminate() == 0
        folder = identity_dir(devices["e2e-a"] / "data")
        impostor = CertDevice(fleet, str(folder / CERT_FILE), str(folder / KEY_FILE), str(folder / CA_FILE))
        try:
            assert impostor.connected()
            impostor.client.publish(Topics(DEFAULT_FLEET, b).state, json.dumps(
                state_message(b, "f" * 32, fleet=DEFAULT_FLEET, groups=(GROUP,))), qos=1)
            impostor.client.publish(Topics(DEFAULT_FLEET, a).state, json.dumps(
                state_message(a, "e" * 32, fleet=DEFAULT_FLEET, groups=(GROUP,))), qos=1)
            assert wait(lambda: (fleet.db.get_device(a)["state"] or {}).get("boot_id") == "e" * 32, 10)
            assert (fleet.db.get_device(b)["state"] or {}).get("boot_id") != "f" * 32
            assert reporting(fleet, b)
        finally:
            impostor.close()
    finally:
        for agent in agents.values():
            agent.terminate()


def test_a_manual_claim_keeps_a_device_pending_through_a_restart_until_an_admin_approves_it_in_the_page(
        fleet, admin, clip, tmp_path):
    from support.browser import DESKTOP, Browser, wait_for, wait_js, wait_text
    from support.dashboard import Dashboard, go, sign_in

    image = make_image(fleet, tmp_path / "image", clip, "manual")
    device = flash(image, tmp_path / "pending").parent
    serial, device_id = "e2e-pending", "cam-e2e-pending"
    folder = identity_dir(device / "data")
    agent = start_device(device, serial)
    restarted = None
    try:
        assert agent.wait_for_output("pending approval", 60), agent.output()[-3000:]
        key = (folder / KEY_FILE).read_bytes()
        # killed while it waits (a power cut), then started again: the same key and request, one request kept
        agent.kill()
        restarted = start_device(device, serial, "agent-restarted.log")
        assert restarted.wait_for_output("pending approval", 60), restarted.output()[-3000:]
        assert (folder / KEY_FILE).read_bytes() == key and not (folder / IDENTITY_FILE).exists()
        mine = [r for r in admin.provisioning(None) if r["serial"] == serial]
        assert [(r["device_id"], r["state"]) for r in mine] == [(device_id, "pending")], mine
        assert restarted.alive() and fleet.db.get_device(device_id) is None  # it has not connected

        dashboard = Dashboard(fleet, None, [], {"admin": fleet.admin_token}, {"admin": admin.whoami()["name"]},
                              {"admin": admin})
        with Browser(DESKTOP, accept_insecure_certs=True) as browser:
            sign_in(browser, dashboard, "admin")
            go(browser, dashboard, "#/pending")
            row = f"tr[data-device-id={device_id}]"
            assert serial in wait_for(browser, row, 15).text
            wait_for(browser, f"{row} [data-testid=approve]").click()
            wait_for(browser, "[data-testid=confirm-ok]").click()
            wait_text(browser, "[data-testid=pending-status]", f"Approved {device_id}.", 15)
            wait_js(browser, f"return !document.querySelector('{row}')", 15)
            assert not browser.errors(), browser.errors()
        # its next poll (Retry-After) gets the certificate; it connects and reports
        assert wait(lambda: reporting(fleet, device_id), 120, 0.3), restarted.output()[-3000:]
        assert common_name(folder / CERT_FILE) == device_id
        assert [r["state"] for r in admin.provisioning(None) if r["serial"] == serial] == ["approved"]
    finally:
        agent.kill()
        if restarted is not None:
            restarted.terminate()


def test_the_agents_http_client_presents_the_renewed_certificate_without_a_restart(fleet, admin, tmp_path):
    """Uploads, live frames and diagnosis go through one DeviceHTTP made at the agent's start; a renewal replaces the
    certificate file (atomically) and the old certificate expires later: the client must present the new one."""
    import datetime as dt

    from cryptography.hazmat.primitives import hashes, serialization

    from edgeinfer.agent.identity import device_key
    from edgeinfer.agent.provisioning import provision
    from edgeinfer.agent.uploads import DeviceHTTP
    from edgeinfer.util.fs import atomic_write_bytes

    claim = admin.create_claim({"groups": [GROUP]})["token"]
    folder = identity_dir(tmp_path / "data")
    keys = provision(fleet.public_url, claim, folder, {"serial": "e2e-renew", "model": None, "mac": None},
                     cafile=str(fleet.access.ca.ca_file))
    sha = admin.upload(Path(__file__))["sha256"]
    renewed = (folder / CERT_FILE).read_bytes()  # what the renewal wrote; the agent started with an older one:
    ca_key = serialization.load_pem_private_key(fleet.access.ca.key_file.read_bytes(), password=None)
    ca_cert = x509.load_pem_x509_certificate(fleet.access.ca.ca_file.read_bytes())
    past = dt.datetime.now(dt.timezone.utc) - dt.timedelta(days=3)
    older = (x509.CertificateBuilder()
             .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, keys["device_id"])]))
             .issuer_name(ca_cert.subject).public_key(device_key(folder).public_key())
             .serial_number(x509.random_serial_number()).not_valid_before(past)
             .not_valid_after(past + dt.timedelta(days=1))  # expired since: the broker and the manager refuse it
             .add_extension(x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
             .sign(ca_key, hashes.SHA256()))
    atomic_write_bytes(folder / CERT_FILE, older.public_bytes(serialization.Encoding.PEM))
    http = DeviceHTTP(None, str(folder / CA_FILE), (str(folder / CERT_FILE), str(folder / KEY_FILE)))
    atomic_write_bytes(folder / CERT_FILE, renewed)  # the renewal, as write_identity does it
    assert http.send("GET", f"{fleet.http.url}/artifacts/{sha}", None, {}, timeout=10) == 200


def test_a_renewal_answers_the_broker_and_manager_a_first_boot_was_told(tmp_path):
    """A manager that tells devices of another broker address (``fleet serve --device-broker-url``: a name the
    devices resolve, a load balancer): the renewed identity keeps it, as the first boot's did."""
    from support.provisioning import new_key, provision

    from edgeinfer.agent.identity import write_identity
    from edgeinfer.agent.provisioning import renew
    from edgeinfer.util.fs import atomic_write_bytes

    settings = FleetSettings(broker=None, broker_port=free_port(), http="127.0.0.1:0", tls=True,
                             data_dir=tmp_path / "fleet", device_broker_url="mqtts://devices.example:8883")
    with FleetManager(settings) as manager:
        admin = FleetClient(manager.http.url, token=manager.admin_token, ca=str(manager.access.ca.ca_file))
        claim = admin.create_claim({"groups": [GROUP]})["token"]
        key = new_key()
        status, first, _ = provision(manager, claim, "e2e-lb", key)
        assert status == 200 and first["broker"] == {"host": "devices.example", "port": 8883, "tls": True}
        folder = identity_dir(tmp_path / "data")
        folder.mkdir(parents=True)
        from cryptography.hazmat.primitives import serialization

        atomic_write_bytes(folder / KEY_FILE, key.private_bytes(serialization.Encoding.PEM,
                                                                serialization.PrivateFormat.PKCS8,
                                                                serialization.NoEncryption()), mode=0o600)
        before = write_identity(folder, first)
        after, answer = renew(folder, manager.public_url)
        assert answer.status == 200
        assert {k: answer.body[k] for k in ("broker", "manager_url", "update_key", "groups", "ca")} == \
            {k: first[k] for k in ("broker", "manager_url", "update_key", "groups", "ca")}
        assert after == before

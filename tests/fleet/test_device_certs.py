"""A device is its client certificate: the managed Mosquitto's certificate listener (its CN is the user name, one
ACL of patterns for every device, a CRL), the manager's HTTPS (the same certificate opens a device's routes), a
revoked certificate cut off on both, an expired one refused — a real fleet manager, Mosquitto and HTTPS."""

from __future__ import annotations

import datetime as dt
import json
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from support.device_certs import CertDevice, files_of, https
from support.fleet import state_message
from support.ports import free_port
from support.processes import wait_until as wait

from edgeinfer.fleet.client import FleetClient, FleetRequestError
from edgeinfer.fleet.manager import FleetManager, FleetSettings
from edgeinfer.link.protocol import Topics


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    settings = FleetSettings(broker=None, broker_port=free_port(), http="127.0.0.1:0", tls=True,
                             data_dir=tmp_path_factory.mktemp("fleet"))
    with FleetManager(settings) as manager:
        assert manager.wait_connected(10)
        yield manager


@pytest.fixture(scope="module")
def admin(fleet):
    return FleetClient(fleet.http.url, token=fleet.admin_token, ca=str(fleet.access.ca.ca_file))


def test_a_certificate_device_publishes_on_its_own_topics_only(fleet, admin, tmp_path):
    a = admin.enroll("cert-a", "f", certificate=True)
    admin.enroll("cert-b", "f", certificate=True)
    assert a["broker"] == fleet.access.certificate_broker_url() and "username" not in a  # its identity's keys only
    assert a["manager_url"] == fleet.public_url and a["update_public_key"] == fleet.key.public_key_b64()
    device = CertDevice(fleet, *files_of(a, tmp_path / "a"))
    try:
        assert device.connected()
        device.client.publish(Topics("f", "cert-a").state, json.dumps(state_message("cert-a", "1" * 32)), qos=1)
        assert wait(lambda: fleet.db.get_device("cert-a") is not None)
        # A speaks for B: dropped by the pattern ACL; A's next message on its own topic lands, B's never did
        device.client.publish(Topics("f", "cert-b").state, json.dumps(state_message("cert-b", "2" * 32)), qos=1)
        device.client.publish(Topics("f", "cert-a").state, json.dumps(state_message("cert-a", "5" * 32)), qos=1)
        assert wait(lambda: fleet.db.get_device("cert-a")["state"]["boot_id"] == "5" * 32)
        assert fleet.db.get_device("cert-b") is None
    finally:
        device.close()
    # a certificate with no device's CA, or none at all, does not get in
    stranger = tmp_path / "stranger"
    stranger.mkdir()
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "cert-b")])
    now = dt.datetime.now(dt.timezone.utc)
    forged = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
              .serial_number(1).not_valid_before(now).not_valid_after(now + dt.timedelta(days=1))
              .sign(key, hashes.SHA256()))
    (stranger / "c.crt").write_bytes(forged.public_bytes(serialization.Encoding.PEM))
    (stranger / "c.key").write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                                       serialization.NoEncryption()))
    impostor = CertDevice(fleet, str(stranger / "c.crt"), str(stranger / "c.key"), str(fleet.access.ca.ca_file))
    assert not impostor.connected(2)
    impostor.close()


def test_the_certificate_acl_has_the_same_size_for_any_number_of_devices(fleet, admin):
    acl = fleet.access.broker.certificates.acl_file
    before = acl.read_bytes()
    admin.enroll_many([f"many-{i}" for i in range(60)], "f", certificate=True)
    assert acl.read_bytes() == before
    assert "%u" in before.decode() and "many-" not in before.decode()


def test_a_revoked_certificate_is_cut_off_on_mqtt_and_https(fleet, admin, tmp_path):
    issued = admin.enroll("cert-r", "f", certificate=True)
    cert, key, ca = files_of(issued, tmp_path / "r")
    device = CertDevice(fleet, cert, key, ca)
    other = CertDevice(fleet, *files_of(admin.enroll("cert-s", "f", certificate=True), tmp_path / "s"))
    sha = admin.upload(Path(__file__))["sha256"]
    try:
        assert device.connected() and other.connected()
        assert https(fleet, f"/artifacts/{sha}", cert, key) == 200  # the certificate opens the device's routes
        started = time.monotonic()
        admin.revoke_device("cert-r")
        assert wait(lambda: device.disconnected_at is not None, 5), "the revoked device stayed connected"
        cut_off = device.disconnected_at - started
        print(f"revoked certificate cut off after {cut_off:.3f} s")
        assert https(fleet, f"/artifacts/{sha}", cert, key) == 401
        again = CertDevice(fleet, cert, key, ca)
        assert not again.connected(2)
        again.close()
        assert other.client.is_connected() and other.disconnected_at is None  # the others are unaffected
    finally:
        device.close()
        other.close()
    with pytest.raises(FleetRequestError) as info:
        admin.revoke_device("cert-r")
    assert info.value.status == 404


def test_an_expired_certificate_is_refused_by_the_broker_and_the_api(fleet, tmp_path):
    key = ec.generate_private_key(ec.SECP256R1())
    ca_key = serialization.load_pem_private_key(fleet.access.ca.key_file.read_bytes(), password=None)
    ca_cert = x509.load_pem_x509_certificate(fleet.access.ca.ca_file.read_bytes())
    past = dt.datetime.now(dt.timezone.utc) - dt.timedelta(days=3)
    cert = (x509.CertificateBuilder().subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "cert-old")]))
            .issuer_name(ca_cert.subject).public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(past).not_valid_after(past + dt.timedelta(days=1))
            .add_extension(x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
            .sign(ca_key, hashes.SHA256()))
    folder = tmp_path / "old"
    folder.mkdir()
    (folder / "c.crt").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    (folder / "c.key").write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                                     serialization.NoEncryption()))
    device = CertDevice(fleet, str(folder / "c.crt"), str(folder / "c.key"), str(fleet.access.ca.ca_file))
    assert not device.connected(2)
    device.close()
    with pytest.raises(OSError):  # the handshake refuses it (TLS 1.3: the server closes before any answer)
        https(fleet, "/api/whoami", str(folder / "c.crt"), str(folder / "c.key"))


def test_fleet_enroll_prints_every_key_a_device_needs_for_both_identities(fleet, tmp_path):
    import subprocess

    import yaml
    from support.processes import edgeinfer_cmd

    token = tmp_path / "admin.token"
    token.write_text(fleet.admin_token)
    common = ["--fleet-url", fleet.http.url, "--token-file", str(token), "--ca", str(fleet.access.ca.ca_file)]
    run = subprocess.run([*edgeinfer_cmd(), "fleet", "enroll", "pw-1", *common], capture_output=True, text=True,
                         timeout=60)
    assert run.returncode == 0, run.stderr
    keys = yaml.safe_load(run.stdout)
    assert {"device_id", "broker", "username", "password", "ca", "manager_url", "update_public_key"} <= set(keys)
    assert keys["manager_url"] == fleet.public_url
    out = tmp_path / "cam" / "agent-keys.yaml"
    out.parent.mkdir()
    run = subprocess.run([*edgeinfer_cmd(), "fleet", "enroll", "crt-1", "--certificate", "--out", str(out), *common],
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    keys = yaml.safe_load(run.stdout)
    assert keys["broker"] == fleet.access.certificate_broker_url() and "password" not in keys
    assert keys["manager_url"] == fleet.public_url and keys["update_public_key"] == fleet.key.public_key_b64()
    assert oct(Path(keys["key"]).stat().st_mode & 0o777) == "0o600"
    device = CertDevice(fleet, keys["cert"], keys["key"], keys["ca"])  # the files work as written
    try:
        assert device.connected()
    finally:
        device.close()
    # and the agent's one HTTP client presents them to the manager (artifacts, evidence, samples, live frames)
    from edgeinfer.agent.uploads import DeviceHTTP

    sha = FleetClient(fleet.http.url, token=fleet.admin_token, ca=keys["ca"]).upload(Path(__file__))["sha256"]
    assert DeviceHTTP(None, keys["ca"], (keys["cert"], keys["key"])).send(
        "GET", f"{fleet.http.url}/artifacts/{sha}", None, {}, timeout=10) == 200
    with pytest.raises(urllib.error.HTTPError) as refused:  # without its certificate: no way in
        DeviceHTTP(None, keys["ca"]).send("GET", f"{fleet.http.url}/artifacts/{sha}", None, {}, timeout=10)
    assert refused.value.code == 401


def test_the_agents_first_boot_against_the_real_provisioning_route_and_revocation_of_what_it_got(fleet, admin,
                                                                                               tmp_path):
    """The agent's client (agent/provisioning.py) against the manager's own POST /api/v1/provision: the device
    it provisions connects to the certificate listener with the files it wrote, and revoking it cuts it off."""
    from edgeinfer.agent.identity import CA_FILE, CERT_FILE, KEY_FILE, identity_dir
    from edgeinfer.agent.provisioning import provision

    claim = admin.create_claim({"groups": ["lobby"]})
    folder = identity_dir(tmp_path / "data")
    keys = provision(fleet.public_url, claim["token"], folder, {"serial": "0000beef", "model": None, "mac": None},
                     cafile=str(fleet.access.ca.ca_file))
    assert keys["device_id"] == "cam-0000beef" and keys["broker"] == fleet.access.certificate_broker_url()
    assert keys["groups"] == ["lobby"] and keys["manager_url"] == fleet.public_url
    device = CertDevice(fleet, str(folder / CERT_FILE), str(folder / KEY_FILE), str(folder / CA_FILE))
    try:
        assert device.connected()
        admin.revoke_device("cam-0000beef")  # what the claim's approval signed is on the CRL
        assert wait(lambda: device.disconnected_at is not None, 5)
    finally:
        device.close()
    again = CertDevice(fleet, str(folder / CERT_FILE), str(folder / KEY_FILE), str(folder / CA_FILE))
    assert not again.connected(2)
    again.close()


def test_the_broker_sends_no_session_ticket_so_every_connection_is_a_full_handshake(fleet, admin, tmp_path):
    """OpenSSL 3.0 re-decodes the client's certificate to build each TLS 1.3 session ticket: the managed Mosquitto
    runs with its own OpenSSL configuration (no tickets), on both listeners; the certificate still decides."""
    import socket
    import ssl

    cert, key, ca = files_of(admin.enroll("cert-ticket", "f", certificate=True), tmp_path / "t")
    connect = b"\x10\x17\x00\x04MQTT\x04\x02\x00\x0a\x00\x0bcert-ticket"  # MQTT 3.1.1 CONNECT, clean session
    for port, certificate in ((fleet.access.certificate_broker["port"], True), (fleet.broker.port, False)):
        context = ssl.create_default_context(cafile=ca)
        if certificate:
            context.load_cert_chain(cert, key)
        with socket.create_connection(("127.0.0.1", port), timeout=10) as raw, \
                context.wrap_socket(raw, server_hostname="127.0.0.1") as tls:
            tls.sendall(connect if certificate else b"\xc0\x00")  # a PINGREQ before CONNECT: the broker hangs up
            answer = tls.recv(4)  # what the broker sends after the handshake's tickets would have come first
            assert tls.version() == "TLSv1.3" and not tls.session_reused
            assert not tls.session.has_ticket, port
        if certificate:
            assert answer == b"\x20\x02\x00\x00"  # CONNACK, accepted: the certificate is the identity
    assert (fleet.broker.folder / "openssl.cnf").read_text().count("NumTickets = 0") == 1

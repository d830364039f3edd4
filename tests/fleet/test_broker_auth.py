"""The managed Mosquitto admits no anonymous client: per-device accounts confined by ACLs, a manager
account, revocation by reload, a TLS listener from the fleet's own CA — checked against a real Mosquitto."""

from __future__ import annotations

import os
import signal
import socket
import ssl
import stat
import subprocess
import threading
from pathlib import Path

import paho.mqtt.client as mqtt
import pytest
from cryptography import x509
from cryptography.hazmat.primitives.serialization import Encoding
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from support.processes import wait_until as wait

from edgeinfer.errors import ConfigError
from edgeinfer.fleet.broker import ManagedMosquitto
from edgeinfer.fleet.broker_auth import (
    DeviceAccount,
    FleetCA,
    ManagerAccount,
    device_username,
    hash_password,
    new_password,
    verify_password,
    write_auth_files,
)

FLEET = "f1"
PASSWORDS = {name: new_password() for name in ("manager", "a", "b")}
MANAGER = ManagerAccount("edgeinfer-manager", hash_password(PASSWORDS["manager"]))


def device(device_id: str) -> DeviceAccount:
    return DeviceAccount(device_username(FLEET, device_id), FLEET, device_id, hash_password(PASSWORDS[device_id]))


def topic(device_id: str, kind: str) -> str:
    return f"edgeinfer/v1/{FLEET}/{device_id}/{kind}"


class Conn:
    """A paho client that records what comes back; no automatic reconnect (a refusal stays visible)."""

    def __init__(self, broker: ManagedMosquitto, username: str | None = None, password: str | None = None, *,
                 client_id: str = "", protocol: int = mqtt.MQTTv5, ca: Path | None = None,
                 session_expiry: int = 0) -> None:
        self.connack = threading.Event()
        self.session_present = False
        self.gone = threading.Event()
        self.reason: mqtt.ReasonCode | None = None
        self.messages: list[tuple[str, bytes]] = []
        self.acks: dict[int, list] = {}
        self.client = c = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=client_id, protocol=protocol)
        c.reconnect_delay_set(60, 60)
        if username is not None:
            c.username_pw_set(username, password)
        if ca is not None:
            c.tls_set(ca_certs=str(ca))
        c.on_connect = self._on_connect
        c.on_disconnect = lambda *_a: self.gone.set()
        c.on_message = lambda _c, _u, m: self.messages.append((m.topic, bytes(m.payload)))
        c.on_subscribe = lambda _c, _u, mid, codes, _p: self.acks.setdefault(mid, list(codes))
        c.on_publish = lambda _c, _u, mid, code, _p: self.acks.setdefault(mid, [code])
        if protocol == mqtt.MQTTv5:
            props = Properties(PacketTypes.CONNECT)
            props.SessionExpiryInterval = session_expiry
            c.connect(broker.host, broker.port, clean_start=not session_expiry, properties=props)
        else:
            c.connect(broker.host, broker.port)
        c.loop_start()
        assert self.connack.wait(5), "no CONNACK"

    def _on_connect(self, _c, _u, flags, reason, _props) -> None:
        self.reason = reason
        self.session_present = bool(flags.session_present)
        self.connack.set()

    @property
    def refused(self) -> bool:
        return self.reason is not None and self.reason.is_failure and str(self.reason) == "Not authorized"

    def subscribe(self, topic_filter: str) -> list:
        _rc, mid = self.client.subscribe(topic_filter, qos=1)
        assert wait(lambda: mid in self.acks, 5)
        return self.acks[mid]

    def publish(self, to: str, payload: bytes) -> list:
        info = self.client.publish(to, payload, qos=1)
        assert wait(lambda: info.mid in self.acks, 5)
        return self.acks[info.mid]

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()


def login(broker: ManagedMosquitto, who: str, **kw) -> Conn:
    username = MANAGER.username if who == "manager" else device_username(FLEET, who)
    kw.setdefault("client_id", username)
    return Conn(broker, username, PASSWORDS[who], **kw)


def plain_connack(port: int) -> bytes:
    """What a plain (not TLS) MQTT 3.1.1 CONNECT gets back: b"" when the broker just closes the connection."""
    connect = b"\x10\x10\x00\x04MQTT\x04\x02\x00\x3c\x00\x04anon"
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(connect)
        try:
            return sock.recv(4)
        except ConnectionResetError:
            return b""


@pytest.fixture
def broker(tmp_path):
    files = write_auth_files(tmp_path / "auth", MANAGER, [device("a"), device("b")])
    with ManagedMosquitto(tmp_path, port=0, auth=files) as b:
        yield b


def test_hashes_are_mosquitto_passwds_and_the_files_are_private_and_strict(tmp_path):
    passwd = tmp_path / "from-mosquitto_passwd"
    subprocess.run(["mosquitto_passwd", "-c", "-b", str(passwd), "someone", "s3cret"], check=True,
                   capture_output=True)
    theirs = passwd.read_text().strip().split(":", 1)[1]
    assert verify_password("s3cret", theirs) and not verify_password("s3cret!", theirs)
    ours = hash_password("s3cret")
    iterations, salt, digest = ours.split("$")[2:]
    assert ours.startswith("$7$") and theirs.split("$")[2] == iterations == "101"
    assert (len(salt), len(digest)) == (len(theirs.split("$")[3]), len(theirs.split("$")[4]))  # 12 and 64 bytes
    assert verify_password("s3cret", ours) and not verify_password("other", ours)
    assert not verify_password("s3cret", "$7$bad") and len(new_password()) >= 22

    files = write_auth_files(tmp_path / "auth", MANAGER, [device("a")])
    for path in (files.password_file, files.acl_file):
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
    acl = files.acl_file.read_text()
    assert f"user edgeinfer-{FLEET}-a\ntopic write {topic('a', 'state')}\n" in acl
    assert f"topic read {topic('a', 'cmd')}" in acl and "topic write edgeinfer/v1/+/+/cmd" in acl
    for bad in ("a b", "a\nuser x", "a/#", "a:b", "x" * 65, ""):
        with pytest.raises(ValueError):
            write_auth_files(tmp_path / "auth", MANAGER, [DeviceAccount("u", FLEET, bad, ours)])
    with pytest.raises(ValueError, match="twice"):
        write_auth_files(tmp_path / "auth", MANAGER, [device("a"), device("a")])
    assert "user edgeinfer-f1-b" not in files.acl_file.read_text(), "a refused write leaves the files alone"


def test_no_account_no_broker_and_no_anonymous_or_wrong_password_client(broker, tmp_path):
    with pytest.raises(ConfigError, match="allow_anonymous"):
        ManagedMosquitto(tmp_path / "open", port=0).start()
    config = broker.config_file.read_text()
    assert "allow_anonymous false" in config and "use_username_as_clientid true" in config
    for protocol in (mqtt.MQTTv5, mqtt.MQTTv311):
        attempts = [Conn(broker, client_id="anon", protocol=protocol),
                    Conn(broker, device_username(FLEET, "a"), PASSWORDS["b"], protocol=protocol),
                    Conn(broker, "nobody", PASSWORDS["a"], protocol=protocol)]
        assert all(c.refused for c in attempts), [str(c.reason) for c in attempts]
        ok = login(broker, "a", protocol=protocol)  # our hash, checked by Mosquitto
        assert not ok.reason.is_failure
        for c in [*attempts, ok]:
            c.close()


def test_a_device_reaches_only_its_own_topics(broker):
    manager = login(broker, "manager")
    assert manager.subscribe("edgeinfer/v1/+/+/telemetry") == [1]
    assert manager.subscribe("$share/managers/edgeinfer/v1/+/+/events") == [1]
    assert manager.subscribe("$share/managers/edgeinfer/v1/+/+/state") == [1]
    a = login(broker, "a")
    b = login(broker, "b", protocol=mqtt.MQTTv311)
    assert b.subscribe(topic("b", "cmd")) == [1]
    assert [str(code) for code in a.publish(topic("a", "telemetry"), b"mine")] == ["Success"]
    for kind in ("telemetry", "state", "events"):  # Mosquitto 2.0.11 answers a denied QoS 1 publish 0x87
        assert [str(code) for code in a.publish(topic("b", kind), b"forged")] == ["Not authorized"]
    # a denied subscription is granted all the same (2.0.11); what it matches is never delivered
    assert a.subscribe(topic("b", "cmd")) == [1]
    assert [str(code) for code in manager.publish(topic("b", "cmd"), b"for b")] == ["Success"]
    assert [str(code) for code in manager.publish(topic("b", "telemetry"), b"forged")] == ["Not authorized"]
    assert wait(lambda: b.messages, 5) and b.messages == [(topic("b", "cmd"), b"for b")]
    a.publish(topic("a", "events"), b"sync")  # everything before it has been routed
    assert wait(lambda: len(manager.messages) == 2, 5)
    assert manager.messages == [(topic("a", "telemetry"), b"mine"), (topic("a", "events"), b"sync")]
    assert a.messages == []
    for c in (manager, a, b):
        c.close()


def test_a_device_cannot_take_another_devices_client_id(broker):
    b = login(broker, "b")
    assert b.subscribe(topic("b", "cmd")) == [1]
    intruder = login(broker, "a", client_id=device_username(FLEET, "b"))  # B's client id, A's account
    assert not intruder.reason.is_failure
    assert wait(lambda: "as edgeinfer-f1-a (p5" in broker.log_file.read_text(), 5), "renamed to its username"
    manager = login(broker, "manager")
    manager.publish(topic("b", "cmd"), b"still there?")
    assert wait(lambda: b.messages, 5) and not b.gone.is_set() and b.client.is_connected()
    assert intruder.messages == []
    for c in (b, intruder, manager):
        c.close()


def test_sessions_are_named_by_username_whatever_client_id_is_sent(broker):
    first = login(broker, "a", client_id="something-else", session_expiry=3600)
    assert first.subscribe(topic("a", "cmd")) == [1]
    first.close()
    back = login(broker, "a", session_expiry=3600)  # the agent's own client id: the same session
    assert back.session_present
    back.close()


def test_revoke_by_reload_disconnects_the_device_and_refuses_it_after(broker):
    a, b, manager = login(broker, "a"), login(broker, "b"), login(broker, "manager")
    assert b.subscribe(topic("b", "cmd")) == [1]
    assert not a.gone.is_set()
    files = write_auth_files(broker.auth.password_file.parent, MANAGER, [device("b")])
    assert files == broker.auth
    broker.reload()
    assert wait(a.gone.is_set, 5), "Mosquitto 2.0.11 drops a client whose account vanished on reload"
    again = login(broker, "a")
    assert again.refused
    manager.publish(topic("b", "cmd"), b"after")
    assert wait(lambda: b.messages == [(topic("b", "cmd"), b"after")], 5)
    assert not b.gone.is_set() and not manager.gone.is_set()
    for c in (a, b, manager, again):
        c.close()


def test_a_reload_that_fails_is_a_config_error(tmp_path):
    files = write_auth_files(tmp_path / "auth", MANAGER, [])
    broker = ManagedMosquitto(tmp_path, port=0, auth=files)
    with pytest.raises(ConfigError, match="not running"):
        broker.reload()
    with broker:
        files.acl_file.write_text(f"user {MANAGER.username}\nnot an acl line\n")
        with pytest.raises(ConfigError, match="Invalid line in acl_file"):
            broker.reload()


def test_tls_listener_from_the_fleet_ca(tmp_path):
    ca = FleetCA(tmp_path / "tls").ensure()
    assert stat.S_IMODE(ca.key_file.stat().st_mode) == 0o600
    first = ca.ca_file.read_bytes()
    tls = ca.tls_files(["broker.example"])
    assert FleetCA(tmp_path / "tls").ensure().ca_file.read_bytes() == first, "the CA is made once"
    cert = x509.load_pem_x509_certificate(tls.certfile.read_bytes())
    sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert {str(v) for v in sans.get_values_for_type(x509.IPAddress)} == {"127.0.0.1"}
    assert set(sans.get_values_for_type(x509.DNSName)) == {"localhost", "broker.example"}
    ca.server_cert(["broker.example"])
    assert tls.certfile.read_bytes() == cert.public_bytes(Encoding.PEM), "same names: the certificate is reused"
    ca.server_cert(["other.example"])
    assert tls.certfile.read_bytes() != cert.public_bytes(Encoding.PEM), "other names: a new one"
    tls = ca.tls_files(["broker.example"])
    client_pem, _key = ca.client_cert("edgeinfer-f1-a")
    x509.load_pem_x509_certificate(client_pem).verify_directly_issued_by(x509.load_pem_x509_certificate(first))

    files = write_auth_files(tmp_path / "auth", MANAGER, [device("a")])
    with ManagedMosquitto(tmp_path, port=0, auth=files, tls=tls) as broker:
        assert broker.url.startswith("mqtts://") and "tls_version tlsv1.2" in broker.config_text()
        ok = login(broker, "a", ca=ca.ca_file)
        assert not ok.reason.is_failure
        other = FleetCA(tmp_path / "other").ensure()
        with pytest.raises(ssl.SSLError):
            login(broker, "a", ca=other.ca_file)
        assert plain_connack(broker.port) == b"", "no plain MQTT on the one, TLS, listener"
        ok.close()


def test_a_restarted_broker_keeps_the_accounts(broker):
    first = broker.pid
    os.kill(first, signal.SIGKILL)
    assert wait(lambda: broker.restarts == 1 and broker.pid not in (None, first), 15)
    assert Conn(broker, client_id="anon").refused
    a = login(broker, "a")
    assert not a.reason.is_failure
    a.close()

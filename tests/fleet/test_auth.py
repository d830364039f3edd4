"""Nobody gets in who does not belong: API tokens and roles on every route, artifacts for enrolled devices
and download grants only, per-device MQTT accounts on the managed Mosquitto, the audit log — against a
real fleet manager, its real Mosquitto and real HTTP, and the CLI as a user runs it."""

from __future__ import annotations

import base64
import json
import os
import re
import stat
import subprocess
import time
import urllib.error
import urllib.request
import uuid

import paho.mqtt.client as mqtt
import pytest
from support.assets import MODELS
from support.fleet import state_message
from support.ports import free_port
from support.processes import edgeinfer_cmd
from support.processes import wait_until as wait

from edgeinfer.fleet.api import web
from edgeinfer.fleet.api.app import ROUTERS
from edgeinfer.fleet.api.rate_limit import PROVISION_PATH
from edgeinfer.fleet.api.schemas import DeploymentSpec
from edgeinfer.fleet.auth import issue_grant
from edgeinfer.fleet.client import FleetClient, FleetRequestError
from edgeinfer.fleet.manager import FleetManager, FleetSettings
from edgeinfer.link.protocol import Topics

BIRDS = MODELS / "mobilenet_v2_1.0_224_inat_bird_quant.tflite"


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    """One manager with its managed Mosquitto for the module (starting one costs seconds); no rate limit on what is not
    authenticated: these tests send hundreds of bad tokens from one address (test_claims.py holds the limit)."""
    settings = FleetSettings(broker=None, broker_port=free_port(), http="127.0.0.1:0",
                             data_dir=tmp_path_factory.mktemp("fleet"), unauthenticated_rate=0)
    with FleetManager(settings) as manager:
        assert manager.wait_connected(10)
        yield manager


@pytest.fixture(scope="module")
def admin(fleet):
    return FleetClient(fleet.http.url, token=fleet.admin_token)


def call(url: str, method: str = "GET", token: str | None = None, body: bytes | None = None,
         headers: dict | None = None) -> tuple[int, dict]:
    headers = dict(headers or {})
    if token:
        headers["Authorization"] = f"Bearer {token}"
    if body is not None:
        headers.setdefault("Content-Type", "application/json")
    request = urllib.request.Request(url, data=body, method=method, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            payload = response.read()
            status = response.status
    except urllib.error.HTTPError as exc:
        payload, status = exc.read(), exc.code
    try:
        return status, json.loads(payload or b"null")
    except ValueError:
        return status, {"raw": payload[:80]}


def every_route(fleet) -> list[tuple[str, str]]:
    """(method, path) of every route the app serves (its own and its routers'), path parameters filled in."""
    routes = []
    for route in [*fleet.http.app.routes, *(route for router in (*ROUTERS, web.router) for route in router.routes)]:
        for method in sorted(getattr(route, "methods", None) or ()):
            path = re.sub(r"\{sha256\}", "0" * 64, route.path)
            routes.append((method, re.sub(r"\{[a-z_]+\}", "x", path)))
    return routes


def test_every_route_but_healthz_and_the_page_answers_401_without_a_valid_token(fleet):
    routes = every_route(fleet)
    assert len(routes) >= 20, routes
    forged = "eit_" + "0" * 12 + "_" + "A" * 43
    for method, path in routes:
        for token in (None, forged, "not-a-token"):
            status, body = call(f"{fleet.http.url}{path}", method, token, b"{}" if method in ("POST", "PUT") else None)
            if path in ("/healthz", "/"):  # liveness; the dashboard's page, whose figures come from the API
                assert status in (200, 404), (path, status)
                continue
            if path == PROVISION_PATH:  # a device's request: its claim is its credential, and {} holds none
                assert status == 400, (path, status, body)
                continue
            assert status == 401, (method, path, token, status, body)
    status, _ = call(f"{fleet.http.url}/api/devices", headers={"Authorization": f"Basic {forged}"})
    assert status == 401


def test_roles_decide_what_a_token_may_do(fleet, admin):
    viewer = FleetClient(fleet.http.url, token=admin.create_token("dashboard", "viewer")["token"])
    operator = FleetClient(fleet.http.url, token=admin.create_token("ci-deployer", "operator")["token"])
    assert viewer.whoami()["role"] == "viewer" and isinstance(viewer.devices(), list)
    spec = DeploymentSpec(sha256="0" * 64, version=2, all=True)
    for forbidden in (lambda: viewer.upload(BIRDS), lambda: viewer.create_deployment(spec), lambda: viewer.abort("x"),
                      lambda: viewer.rollback("cam-1"), lambda: viewer.tokens(),
                      lambda: operator.tokens(), lambda: operator.create_token("x", "admin"),
                      lambda: operator.enroll("cam-1"), lambda: operator.audit()):
        with pytest.raises(FleetRequestError) as info:
            forbidden()
        assert info.value.status == 403, info.value
    assert operator.upload(BIRDS)["size"] == BIRDS.stat().st_size  # an operator may deploy
    with pytest.raises(FleetRequestError, match="no device"):
        operator.create_deployment(DeploymentSpec(sha256=operator.upload(BIRDS)["sha256"], version=2, all=True))
    listed = {t["name"]: t for t in admin.tokens()}
    assert {"admin", "dashboard", "ci-deployer"} <= set(listed)
    assert all("token" not in t and "token_hash" not in t for t in listed.values())  # never shown again


def test_a_revoked_or_expired_token_is_refused(fleet, admin):
    created = admin.create_token("short-lived", "viewer", expires_s=3)
    brief = FleetClient(fleet.http.url, token=created["token"])
    assert brief.whoami()["name"] == "short-lived"
    revoked = admin.create_token("leaver", "operator")
    leaver = FleetClient(fleet.http.url, token=revoked["token"])
    assert leaver.whoami()["role"] == "operator"
    assert admin.revoke_token(revoked["token_id"])["revoked_at"] is not None
    with pytest.raises(FleetRequestError, match="revoked") as info:
        leaver.devices()
    assert info.value.status == 401
    time.sleep(max(0.0, created["expires_at"] - time.time()) + 0.2)  # however long the steps above took
    with pytest.raises(FleetRequestError, match="expired") as info:
        brief.devices()
    assert info.value.status == 401
    with pytest.raises(FleetRequestError) as info:
        admin.revoke_token("ffffffffffff")
    assert info.value.status == 404
    for bad in ({"name": "x", "role": "root"}, {"name": "", "role": "viewer"}, {"name": "x\n", "role": "viewer"},
                {"name": "x", "role": "viewer", "expires_s": -5}, {"name": "x", "role": "viewer", "expires_s": "1d"}):
        status, body = call(f"{fleet.http.url}/api/tokens", "POST", fleet.admin_token, json.dumps(bad).encode())
        assert status == 400 and body["error"], bad


def test_artifacts_open_to_enrolled_devices_and_grants_only(fleet, admin):
    sha = admin.upload(BIRDS)["sha256"]
    url = f"{fleet.http.url}/artifacts/{sha}"
    issued = admin.enroll("cam-art", "f")

    def basic(username: str, password: str) -> dict:
        return {"Authorization": "Basic " + base64.b64encode(f"{username}:{password}".encode()).decode()}

    assert call(url)[0] == 401
    assert call(url, method="HEAD", headers=basic(issued["username"], issued["password"]))[0] == 200
    assert call(url, headers=basic(issued["username"], "wrong"))[0] == 401
    assert call(url, headers=basic("edgeinfer-f-nobody", issued["password"]))[0] == 401
    good = issue_grant(fleet.key, sha, "cam-art", time.time() + 60)
    assert call(f"{url}?grant={good}", method="HEAD")[0] == 200
    other = f"{fleet.http.url}/artifacts/{'1' * 64}"
    assert call(f"{other}?grant={good}")[0] == 401  # a grant opens its own artifact only
    expired = issue_grant(fleet.key, sha, "cam-art", time.time() - 1)
    tampered = good.replace(good.split(".")[0], str(int(time.time()) + 10**6), 1)
    from edgeinfer.updates.signing import SigningKey

    forged = issue_grant(SigningKey.generate(), sha, "cam-art", time.time() + 60)
    for grant in (expired, tampered, forged, "garbage", ""):
        assert call(f"{url}?grant={grant}", method="HEAD")[0] == 401, grant
    admin.revoke_device("cam-art")
    assert call(url, method="HEAD", headers=basic(issued["username"], issued["password"]))[0] == 401


class Device:
    """An MQTT client with a device's credential (MQTT 5), recording what it is told."""

    def __init__(self, fleet, username: str | None, password: str | None) -> None:
        port = int(fleet.broker_url.rsplit(":", 1)[1])
        self.client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=username or "", protocol=mqtt.MQTTv5)
        if username is not None:
            self.client.username_pw_set(username, password)
        self.connected: list = []
        self.disconnected: list = []
        self.client.on_connect = lambda c, u, f, reason, p: self.connected.append(reason)
        self.client.on_disconnect = lambda c, u, f, reason, p: self.disconnected.append(reason)
        self.client.connect("127.0.0.1", port)
        self.client.loop_start()

    def accepted(self, timeout: float = 10) -> bool:
        assert wait(lambda: self.connected, timeout)
        return not self.connected[0].is_failure

    def close(self) -> None:
        self.client.loop_stop()
        self.client.disconnect()


def test_enrolled_devices_reach_only_their_own_topics_and_a_revoked_one_is_out(fleet, admin):
    a, b = admin.enroll("cam-a", "f"), admin.enroll("cam-b", "f")
    assert a["username"] == "edgeinfer-f-cam-a" and a["broker"] == fleet.broker_url
    assert a["update_public_key"] == fleet.key.public_key_b64()
    anonymous = Device(fleet, None, None)
    assert not anonymous.accepted()
    device_a = Device(fleet, a["username"], a["password"])
    assert device_a.accepted()
    try:
        device_a.client.publish(Topics("f", "cam-a").state, json.dumps(state_message("cam-a", "1" * 32)), qos=1,
                                retain=True)
        assert wait(lambda: fleet.db.get_device("cam-a") is not None)
        # A speaks for B: the broker drops it, B is never recorded
        device_a.client.publish(Topics("f", "cam-b").state, json.dumps(state_message("cam-b", "2" * 32)), qos=1)
        impostor = Device(fleet, a["username"], b["password"])  # A's name, B's password
        assert not impostor.accepted()
        # A's next message on its own topic is stored: what A sent before it, B's state, would have been too
        device_a.client.publish(Topics("f", "cam-a").state, json.dumps(state_message("cam-a", "5" * 32)), qos=1,
                                retain=True)
        assert wait(lambda: fleet.db.get_device("cam-a")["state"]["boot_id"] == "5" * 32)
        assert fleet.db.get_device("cam-b") is None
        assert fleet.db.get_device("cam-a")["online"]
        # revoked: dropped now, refused from now on, downloads refused (above)
        admin.revoke_device("cam-a")
        assert wait(lambda: device_a.disconnected, 10), "Mosquitto kept the revoked device connected"
        again = Device(fleet, a["username"], a["password"])
        assert not again.accepted()
        device_b = Device(fleet, b["username"], b["password"])
        assert device_b.accepted()  # the others are unaffected
        device_b.close()
    finally:
        device_a.close()
    with pytest.raises(FleetRequestError) as info:
        admin.revoke_device("cam-a")
    assert info.value.status == 404
    for bad in ("../x", "a b", "x" * 65):
        with pytest.raises(FleetRequestError) as info:
            admin.enroll(bad, "f")
        assert info.value.status in (400, 404)


def test_the_audit_log_says_who_did_what_from_where(fleet, admin):
    operator = FleetClient(fleet.http.url, token=admin.create_token("release-bot", "operator")["token"])
    boot = uuid.uuid4().hex
    enrolled = admin.enroll("cam-audit", "f")
    device = Device(fleet, enrolled["username"], enrolled["password"])
    try:
        assert device.accepted()
        device.client.publish(Topics("f", "cam-audit").state, json.dumps(state_message("cam-audit", boot)),
                              qos=1)
        assert wait(lambda: fleet.db.get_device("cam-audit") is not None)
        sha = operator.upload(BIRDS)["sha256"]
        created = operator.create_deployment(DeploymentSpec(sha256=sha, model_name="birds", version=5,
                                                            devices=["cam-audit"]))
        assert operator.abort(created["deployment_id"])["status"] == "aborted"
        with pytest.raises(FleetRequestError) as info:
            operator.abort(created["deployment_id"])
        assert info.value.status == 409
        sent = operator.rollback("cam-audit")
        assert sent["cmd"] == "rollback"
        with pytest.raises(FleetRequestError) as info:
            operator.restart("cam-audit", "")
        assert info.value.status == 400
    finally:
        device.close()
    entries = admin.audit(1000)
    mine = [(e["actor"], e["action"], e["target"]) for e in entries if e["actor"] == "release-bot"]
    deployment_id = created["deployment_id"]
    assert mine == [("release-bot", "artifact.upload", sha), ("release-bot", "deployment.create", deployment_id),
                    ("release-bot", "deployment.abort", deployment_id), ("release-bot", "device.rollback", "cam-audit")]
    assert all(e["remote"] == "127.0.0.1" and e["role"] == "operator" for e in entries if e["actor"] == "release-bot")
    actions = {(e["actor"], e["action"]) for e in entries}
    assert {("fleet serve", "token.create"), ("admin", "token.create"), ("admin", "device.enroll"),
            ("admin", "device.revoke"), ("admin", "token.revoke")} <= actions


def test_fleet_serve_writes_an_admin_token_once_and_the_cli_manages_tokens(tmp_path):
    data = tmp_path / "fleet-data"
    env = {**os.environ, "EDGEINFER_FLEET_TOKEN": "", "EDGEINFER_FLEET_TOKEN_FILE": ""}

    def serve() -> tuple[subprocess.Popen, str, str]:
        with open(tmp_path / "serve.log", "w") as log:
            proc = subprocess.Popen(edgeinfer_cmd("fleet", "serve", "--broker-port", "0", "--http", "127.0.0.1:0",
                                                  "--data-dir", str(data)), stdout=log, stderr=subprocess.STDOUT,
                                    env=env)
        assert wait(lambda: "fleet manager: " in (tmp_path / "serve.log").read_text() or proc.poll() is not None, 60)
        text = (tmp_path / "serve.log").read_text()
        url = re.search(r"HTTP (http://[^,]+),", text).group(1)
        return proc, url, text

    def cli(*args: str, token_file: str | None = None) -> subprocess.CompletedProcess:
        extra = ("--token-file", token_file) if token_file else ()
        return subprocess.run(edgeinfer_cmd("fleet", *args, "--fleet-url", url, *extra), capture_output=True,
                              text=True, timeout=60, env=env)

    proc, url, text = serve()
    try:
        token_file = data / "admin.token"
        assert f"admin token: {token_file}" in text
        assert "in clear" not in text  # everything on loopback: no warning
        assert stat.S_IMODE(token_file.stat().st_mode) == 0o600
        refused = cli("devices")
        assert refused.returncode == 1 and "401" in refused.stderr and "--token-file" in refused.stderr
        made = cli("token", "create", "--role", "viewer", "--name", "grafana", "--expires", "30d", "--json",
                   token_file=str(token_file))
        assert made.returncode == 0, made.stderr
        viewer = json.loads(made.stdout)
        assert viewer["role"] == "viewer" and viewer["token"].startswith("eit_")
        assert viewer["expires_at"] == pytest.approx(time.time() + 30 * 86_400, abs=120)
        (tmp_path / "viewer.token").write_text(viewer["token"])
        assert cli("devices", token_file=str(tmp_path / "viewer.token")).returncode == 0
        denied = cli("token", "list", token_file=str(tmp_path / "viewer.token"))
        assert denied.returncode == 1 and "403" in denied.stderr
        listed = cli("token", "list", token_file=str(token_file))
        assert "grafana" in listed.stdout and viewer["token"] not in listed.stdout
        assert cli("token", "revoke", viewer["token_id"], token_file=str(token_file)).returncode == 0
        assert cli("devices", token_file=str(tmp_path / "viewer.token")).returncode == 1
        enrolled = cli("enroll", "cam-9", "--json", token_file=str(token_file))
        assert json.loads(enrolled.stdout)["username"] == "edgeinfer-default-cam-9"
        listed = cli("enrollments", token_file=str(token_file))
        password = json.loads(enrolled.stdout)["password"]
        assert "edgeinfer-default-cam-9" in listed.stdout and password not in listed.stdout
        audit = json.loads(cli("audit", "--json", token_file=str(token_file)).stdout)
        assert [e["action"] for e in audit] == ["token.create", "token.create", "token.revoke", "device.enroll"]
        missing = cli("devices", token_file=str(tmp_path / "nope.token"))
        assert missing.returncode == 1 and "cannot read the token file" in missing.stderr
    finally:
        proc.terminate()
        proc.wait(30)
    first = token_file.read_text()
    proc, url, text = serve()  # a second start keeps the admin token (and says nothing of it)
    try:
        assert "admin token:" not in text and token_file.read_text() == first
        assert cli("token", "list", token_file=str(token_file)).returncode == 0
    finally:
        proc.terminate()
        proc.wait(30)


def test_tls_end_to_end_broker_and_api_from_the_fleet_ca(tmp_path):
    """--tls: the managed broker speaks mqtts only and the API https only, both with the fleet CA's
    certificates; an enrolled device connects with the CA and its password, and downloads over https."""
    import ssl

    from edgeinfer.updates.download import download

    settings = FleetSettings(broker=None, broker_port=free_port(), http="127.0.0.1:0", data_dir=tmp_path / "fleet",
                             tls=True)
    with FleetManager(settings) as fleet:
        assert fleet.wait_connected(10)
        assert fleet.broker_url.startswith("mqtts://") and fleet.http.url.startswith("https://")
        ca = str(fleet.access.ca.ca_file)
        with pytest.raises(Exception, match="CERTIFICATE_VERIFY_FAILED"):
            FleetClient(fleet.http.url, token=fleet.admin_token).whoami()  # the system CAs do not know it
        admin = FleetClient(fleet.http.url, token=fleet.admin_token, ca=ca)
        issued = admin.enroll("cam-tls", "f")
        assert issued["broker"].startswith("mqtts://") and issued["ca"] == ca
        port = int(fleet.broker_url.rsplit(":", 1)[1])
        plain = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=issued["username"], protocol=mqtt.MQTTv5)
        plain.username_pw_set(issued["username"], issued["password"])
        try:  # no plain-text port: the password never crosses in clear
            plain.connect("127.0.0.1", port)
            plain.loop_start()
            connected = wait(plain.is_connected, 3)
        except OSError:
            connected = False
        plain.loop_stop()
        assert not connected
        device = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=issued["username"], protocol=mqtt.MQTTv5)
        device.username_pw_set(issued["username"], issued["password"])
        device.tls_set(ca_certs=ca)
        device.connect("127.0.0.1", port)
        device.loop_start()
        try:
            assert wait(device.is_connected, 10)
            device.publish(Topics("f", "cam-tls").state, json.dumps(state_message("cam-tls", "3" * 32)), qos=1)
            assert wait(lambda: fleet.db.get_device("cam-tls") is not None)
        finally:
            device.loop_stop()
            device.disconnect()
        sha = admin.upload(BIRDS)["sha256"]
        got = download(f"{fleet.http.url}/artifacts/{sha}", tmp_path / "m.tflite", sha256=sha,
                       size=BIRDS.stat().st_size, context=ssl.create_default_context(cafile=ca),
                       headers={"Authorization": "Basic " + base64.b64encode(
                           f"{issued['username']}:{issued['password']}".encode()).decode()})
        assert got.read_bytes() == BIRDS.read_bytes()


def test_a_batch_of_simulated_devices_enrolled_at_once_reports_through_the_managed_broker(fleet, admin):
    from edgeinfer.tools.simulate import Simulation, SimulationSettings

    ids = [f"sim-{i:05d}" for i in range(5)]
    issued = admin.enroll_many(ids, "sims")
    assert [e["device_id"] for e in issued] == ids and len({e["password"] for e in issued}) == 5
    credentials = {e["device_id"]: (e["username"], e["password"]) for e in issued}
    with Simulation(SimulationSettings(broker=fleet.broker_url, devices=5, fleet="sims", interval_s=0.2,
                                       credentials=credentials)) as sim:
        sim.start()
        assert wait(lambda: sim.online == 5, 20)
        assert wait(lambda: all((d := fleet.db.get_device(i)) and d["last_telemetry"] for i in ids), 20)
        sim.stop()
    with Simulation(SimulationSettings(broker=fleet.broker_url, devices=1, fleet="sims", prefix="nobody")) as sim:
        sim.start()  # no credentials: refused
        time.sleep(1.0)
        assert sim.online == 0
        sim.stop()
    assert fleet.db.get_device("nobody-00000") is None
    with pytest.raises(ValueError, match="no credentials"):
        SimulationSettings(broker=fleet.broker_url, devices=6, fleet="sims", credentials=credentials)
    status, body = call(f"{fleet.http.url}/api/enrollments", "POST", fleet.admin_token,
                        json.dumps({"devices": ["a", "a"]}).encode())
    assert status == 400 and "twice" in body["error"]


def test_your_own_mosquitto_gets_the_same_accounts_from_fleet_broker_auth(tmp_path):
    """`fleet serve --broker` on a Mosquitto the operator runs: `fleet broker-auth` writes its password and ACL
    files from the fleet database (the managers' accounts, every enrolled device); after a SIGHUP an enrolled
    device gets in and reaches its own topics, as on the managed broker."""
    from edgeinfer.fleet.broker import ManagedMosquitto
    from edgeinfer.fleet.broker_auth import AuthFiles

    db_url = f"sqlite:///{tmp_path / 'fleet.sqlite3'}"
    secret = tmp_path / "manager.password"
    secret.write_text("manager-secret\n")
    auth_dir = tmp_path / "mosquitto-auth"

    def broker_auth() -> dict:
        done = subprocess.run(edgeinfer_cmd("fleet", "broker-auth", "--db", db_url, "--out", str(auth_dir),
                                            "--manager", f"fleet-a:{secret}", "--json"),
                              capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout)

    assert broker_auth()["devices"] == 0
    files = AuthFiles(auth_dir / "passwd", auth_dir / "acl")
    with ManagedMosquitto(tmp_path / "own-broker", port=0, auth=files) as own:  # stands for the operator's broker
        settings = FleetSettings(broker=own.url, db_url=db_url, http="127.0.0.1:0", data_dir=tmp_path / "fleet",
                                 username="fleet-a", password="manager-secret", manager_id="fleet-a")
        with FleetManager(settings) as fleet:
            assert fleet.wait_connected(10)
            issued = FleetClient(fleet.http.url, token=fleet.admin_token).enroll("cam-own", "f")
            early = Device(fleet, issued["username"], issued["password"])
            assert not early.accepted()  # the broker has not been told yet
            early.close()
            assert broker_auth()["devices"] == 1
            own.reload()
            device = Device(fleet, issued["username"], issued["password"])
            try:
                assert device.accepted()
                device.client.publish(Topics("f", "cam-own").state,
                                      json.dumps(state_message("cam-own", "4" * 32)), qos=1)
                assert wait(lambda: fleet.db.get_device("cam-own") is not None)
            finally:
                device.close()
    bad = subprocess.run(edgeinfer_cmd("fleet", "broker-auth", "--db", db_url, "--out", str(auth_dir),
                                       "--manager", "no-colon"), capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "USER:PASSWORD_FILE" in bad.stderr


def test_serve_warns_when_it_listens_beyond_this_machine_without_tls():
    from edgeinfer.cli.fleet import _exposed

    assert not _exposed("127.0.0.1:8700", "127.0.0.1", None)
    assert _exposed("0.0.0.0:8700", "127.0.0.1", None)  # the API on the network, in clear
    assert not _exposed("0.0.0.0:8700", "127.0.0.1", "https://fleet.example")  # a TLS proxy in front
    assert _exposed("127.0.0.1:8700", "0.0.0.0", None)  # the managed broker on the network, in clear
    assert not _exposed("127.0.0.1:8700", None, None)  # --broker: the operator's broker, its own TLS


def test_one_server_certificate_names_every_listener():
    """The broker and the API share one certificate: it names both listen addresses (a second, per-listener
    issue would overwrite the first's file without its name — the broker would lose it at its next restart)."""
    import socket

    from edgeinfer.fleet.access import _certificate_hosts

    hosts = _certificate_hosts(("10.0.0.5", "0.0.0.0"), ("fleet.example",))
    assert set(hosts) == {"127.0.0.1", "localhost", socket.gethostname(), "fleet.example", "10.0.0.5"}
    assert len(hosts) == len(set(hosts)) and "0.0.0.0" not in hosts

"""The fleet's side of logs and diagnosis from afar (fleet/diagnosis.py, db/diagnosis.py, api/diagnosis.py), on real
databases (SQLite and PostgreSQL) and the real API: lines stored once, bounded per device and aged out; a request
claimed once per interval however many managers or callers ask, renewed while someone follows, never sent to a
device that is offline; a device's upload taken under its own credential only, bounded, redacted again before it is
stored; reading needs an operator."""

from __future__ import annotations

import base64
import json
import time
import urllib.error
import urllib.request

import pytest
from support.fleet import admin_of, api_server, state_message

from edgeinfer.fleet.broker_auth import hash_password
from edgeinfer.fleet.commands import CommandService
from edgeinfer.fleet.db import FleetDB
from edgeinfer.fleet.diagnosis import MIN_RESEND_S, RENEW_S, WATCH_S, DiagnosisService
from edgeinfer.link.logs import MAX_UPLOAD_BYTES
from edgeinfer.link.protocol import decode
from edgeinfer.link.spool import Spool
from edgeinfer.link.vocabulary import Command
from edgeinfer.updates.signing import SigningKey

BOOT = "b" * 32
LOGIN = ("edgeinfer-f-cam-1", "device-password")


def lines(first: int, count: int, **extra) -> list[dict]:
    return [{"seq": n, "ts": time.time(), "level": 20, "logger": "edgeinfer.x", "message": f"line {n}", **extra}
            for n in range(first, first + count)]


def test_lines_are_stored_once_bounded_per_device_and_aged_out(db_url):
    db = FleetDB(db_url)
    try:
        rows = db.diagnosis
        assert rows.add("cam-1", BOOT, lines(1, 5), dropped=0, complete=True) == 5
        assert rows.add("cam-1", BOOT, lines(1, 7), dropped=2, complete=False) == 2  # a retry: 6 and 7 are new
        assert rows.newest_seq("cam-1", BOOT) == 7 and rows.newest_seq("cam-1", "c" * 32) == 0
        state = rows.state("cam-1")
        assert state["logs_dropped"] == 2 and state["logs_complete"] is False and state["logs_received_at"]
        assert [r["seq"] for r in rows.lines("cam-1", limit=3)] == [5, 6, 7]  # the newest, oldest first
        first = rows.lines("cam-1", limit=2, after=0)
        assert [r["seq"] for r in first] == [1, 2]
        assert [r["seq"] for r in rows.lines("cam-1", after=first[-1]["id"], limit=100)] == [3, 4, 5, 6, 7]
        rows.add("cam-1", BOOT, [{**lines(8, 1)[0], "level": 40}], dropped=0, complete=True)
        assert [r["seq"] for r in rows.lines("cam-1", min_level=30)] == [8]
        rows.max_lines = 5  # the bound: the device's oldest lines go
        rows.add("cam-1", "c" * 32, lines(1, 3), dropped=0, complete=True)
        assert rows.count("cam-1") == 5
        assert [(r["boot_id"][0], r["seq"]) for r in rows.lines("cam-1")] == [
            ("b", 7), ("b", 8), ("c", 1), ("c", 2), ("c", 3)]
        rows.add("cam-2", BOOT, lines(1, 2, ts=time.time() - 10 * 86_400), dropped=0, complete=True)
        assert rows.prune(time.time() - 7 * 86_400) == 2 and rows.count("cam-2") == 0 and rows.count("cam-1") == 5
    finally:
        db.close()


@pytest.fixture
def fleet(db_url, tmp_path):
    """Two managers' services on one database (two engines), each with its own command spool."""
    dbs = [FleetDB(db_url), FleetDB(db_url)]
    spools = [Spool(tmp_path / f"out-{n}.sqlite3") for n in range(2)]
    key = SigningKey.generate()
    services = [DiagnosisService(db, CommandService(db, key, spool), lambda: "http://fleet.example:8700")
                for db, spool in zip(dbs, spools)]
    dbs[0].record_state("f", "cam-1", state_message("cam-1", BOOT, fleet="f"))
    try:
        yield services, spools
    finally:
        for spool in spools:
            spool.close()
        for db in dbs:
            db.close()


def commands(spools) -> list[dict]:
    return [decode("cmd", row.payload) for spool in spools for row in spool.fetch(0, 1000)]


def test_a_request_goes_out_once_per_interval_however_many_ask_and_never_to_an_offline_device(fleet):
    (one, two), spools = fleet
    now = time.time()
    answers = [service.request_logs("cam-1", now=now + n * 0.01) for n in range(50) for service in (one, two)]
    assert sum(a["sent"] for a in answers) == 1
    [sent] = commands(spools)
    assert sent["cmd"] == Command.LOGS and sent["device"] == "cam-1"
    assert sent["args"] == {"url": "http://fleet.example:8700/api/devices/cam-1/logs", "boot_id": BOOT, "after": 0}
    assert answers[-1]["command_id"] == sent["id"] and answers[-1]["requested_at"] == pytest.approx(now)
    assert one.request_logs("cam-1", now=now + MIN_RESEND_S + 0.1)["sent"]  # later: asked again
    # a follower: sent at once, then renewed only every RENEW_S however often it reads, until moved WATCH_S on
    t0 = now + 10
    assert one.request_logs("cam-1", follow=True, now=t0)["sent"]
    assert not any(s.request_logs("cam-1", follow=True, now=t0 + 1)["sent"] for s in (one, two))
    renewed = two.request_logs("cam-1", follow=True, now=t0 + RENEW_S + 0.1)
    assert renewed["sent"] and renewed["follow_until"] == pytest.approx(t0 + RENEW_S + 0.1 + WATCH_S, abs=0.01)
    assert [c["args"].get("until") for c in commands(spools)][-2:] == [
        pytest.approx(t0 + WATCH_S, abs=0.01), pytest.approx(t0 + RENEW_S + 0.1 + WATCH_S, abs=0.01)]
    # the doctor likewise; and nothing at all for a device that is offline, whatever is asked
    assert [s.request_doctor("cam-1", now=now)["sent"] for s in (one, two)] == [True, False]
    before = len(commands(spools))
    one.db.record_state("f", "cam-1", {**state_message("cam-1", BOOT, fleet="f"), "online": False})
    for service in (one, two):
        assert service.request_logs("cam-1", now=now + 100)["sent"] is False
        assert service.request_logs("cam-1", follow=True, now=now + 200)["online"] is False
        assert service.request_doctor("cam-1", now=now + 300)["sent"] is False
    assert len(commands(spools)) == before
    with pytest.raises(LookupError, match="no device cam-9"):
        one.request_logs("cam-9")


# ---------------------------------------------------------------------------------------------- the API
def call(url: str, method: str, path: str, *, token: str | None = None, basic: tuple[str, str] | None = None,
         body: bytes | None = None, headers: dict | None = None) -> tuple[int, object]:
    sent = {"Content-Type": "application/json", **(headers or {})}
    if token:
        sent["Authorization"] = f"Bearer {token}"
    if basic:
        sent["Authorization"] = "Basic " + base64.b64encode(":".join(basic).encode()).decode()
    request = urllib.request.Request(url + path, data=body, method=method, headers=sent)
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            data = answer.read()
            return answer.status, json.loads(data) if data else None
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read() or b"null")


@pytest.fixture
def api(tmp_path):
    db = FleetDB(f"sqlite:///{tmp_path / 'fleet.sqlite3'}")
    db.put_credentials([{"device_id": "cam-1", "fleet": "f", "username": LOGIN[0],
                         "password_hash": hash_password(LOGIN[1]), "created_at": 0.0, "revoked_at": None}])
    for device in ("cam-1", "cam-2"):
        db.record_state("f", device, state_message(device, BOOT, fleet="f"))
    try:
        with api_server(db, tmp_path / "api") as (server, services):
            admin = admin_of(tmp_path / "api")
            tokens = {role: services.access.tokens.create(name=f"t-{role}", role=role)["token"]
                      for role in ("viewer", "operator")}
            yield server.url, tokens, services, admin
    finally:
        db.close()


def upload(secret: str = "hunter2") -> dict:
    return {"boot_id": BOOT, "command_id": "c-1", "complete": True, "dropped": 3, "lines": [
        {"seq": 1, "ts": time.time(), "level": "info", "logger": "edgeinfer.agent.daemon", "message": "started"},
        {"seq": 2, "ts": time.time(), "level": "error", "logger": "edgeinfer.agent.daemon",
         "message": f"cannot open rtsp://admin:{secret}@cam/x\nTraceback: password={secret}"}]}


def test_a_device_uploads_under_its_own_credential_and_what_is_stored_is_redacted(api):
    url, tokens, _services, _admin = api
    body = json.dumps(upload()).encode()
    assert call(url, "POST", "/api/devices/cam-1/logs", basic=LOGIN, body=body) == (
        200, {"device_id": "cam-1", "stored": 2})
    assert call(url, "POST", "/api/devices/cam-1/logs", basic=LOGIN, body=body)[1]["stored"] == 0  # a retry
    assert call(url, "POST", "/api/devices/cam-2/logs", basic=LOGIN, body=body)[0] == 403  # not its own id
    assert call(url, "POST", "/api/devices/cam-1/logs", basic=(LOGIN[0], "wrong"), body=body)[0] == 401
    assert call(url, "POST", "/api/devices/cam-1/logs", token=tokens["viewer"], body=body)[0] == 403
    assert call(url, "POST", "/api/devices/cam-9/logs", token=tokens["operator"], body=body)[0] == 404
    status, error = call(url, "POST", "/api/devices/cam-1/logs", basic=LOGIN,
                         body=json.dumps({**upload(), "lines": [{**upload()["lines"][0], "level": "loud"}]}).encode())
    assert status == 400 and error["error"].startswith("lines.0.level:"), error
    huge = json.dumps({**upload(), "lines": [{**upload()["lines"][0], "message": "x" * 3000, "seq": n}
                                             for n in range(1, 100)]}).encode()
    assert len(huge) > MAX_UPLOAD_BYTES
    assert call(url, "POST", "/api/devices/cam-1/logs", basic=LOGIN, body=huge)[0] == 413

    # reading: an operator's; the password is nowhere, the device's counters are
    assert call(url, "GET", "/api/devices/cam-1/logs", token=tokens["viewer"])[0] == 403
    status, logs = call(url, "GET", "/api/devices/cam-1/logs", token=tokens["operator"])
    assert status == 200 and "hunter2" not in json.dumps(logs)
    assert [line["level"] for line in logs["lines"]] == ["info", "error"] and logs["dropped"] == 3
    assert logs["lines"][1]["message"] == "cannot open rtsp://admin:***@cam/x\nTraceback: password=***"
    assert call(url, "GET", "/api/devices/cam-1/logs?level=error", token=tokens["operator"])[1]["lines"][0]["seq"] == 2
    assert call(url, "GET", f"/api/devices/cam-1/logs?after={logs['next']}", token=tokens["operator"])[1]["lines"] == []
    assert call(url, "GET", "/api/devices/cam-9/logs", token=tokens["operator"])[0] == 404


def test_asking_is_an_operators_and_audited_when_a_command_goes_out(api):
    url, tokens, services, _admin = api
    assert call(url, "POST", "/api/devices/cam-1/logs/request", token=tokens["viewer"], body=b"{}")[0] == 403
    status, state = call(url, "POST", "/api/devices/cam-1/logs/request", token=tokens["operator"], body=b"{}")
    assert status == 202 and state["sent"] is True and state["online"] is True
    status, again = call(url, "POST", "/api/devices/cam-1/logs/request", token=tokens["operator"], body=b"{}")
    assert status == 202 and again["sent"] is False and again["command_id"] == state["command_id"]
    status, doctor = call(url, "POST", "/api/devices/cam-1/doctor", token=tokens["operator"])
    assert status == 202 and doctor["sent"] is True and doctor["report"] is None
    audit = [(e["action"], e["target"]) for e in services.access.db.list_audit() if e["action"].startswith("device.")]
    assert audit == [("device.logs", "cam-1"), ("device.doctor", "cam-1")]

    # the device's doctor report, redacted; then read back by an operator
    result = {"command_id": doctor["command_id"], "exit_code": 1, "duration_s": 0.4, "ran_at": time.time(),
              "report": {"problems": 1, "findings": [{"check": "camera", "status": "problem",
                                                      "detail": "rtsp://u:topsecret@h/ refused", "fix": None}]},
              "error": None}
    assert call(url, "POST", "/api/devices/cam-1/doctor/report", basic=LOGIN,
                body=json.dumps(result).encode()) == (204, None)
    status, read = call(url, "GET", "/api/devices/cam-1/doctor", token=tokens["operator"])
    assert status == 200 and read["answered_command_id"] == doctor["command_id"] and read["exit_code"] == 1
    assert read["report"]["findings"][0]["detail"] == "rtsp://u:***@h/ refused"
    assert read["received_at"] >= read["requested_at"]
    assert call(url, "GET", "/api/devices/cam-1/doctor", token=tokens["viewer"])[0] == 403

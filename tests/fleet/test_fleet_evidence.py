"""Events with evidence, the fleet's side, against a real fleet manager (its managed Mosquitto, a real
PostgreSQL, HTTP on a real socket) and real JPEGs: devices upload an event's snapshot and clip with their
own MQTT credential, byte-exact round trips, idempotent retries and immutable files, every refusal keeping
nothing, retention by bytes, the events list joined with the evidence of a rule_triggered event published
through the broker, a clip played at its rate, and the dashboard in a real Chromium showing the snapshot and
playing the clip."""

from __future__ import annotations

import contextlib
import hashlib
import http.client
import json
import os
import re
import socket
import struct
import subprocess
import time
import tracemalloc
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import pytest
from support.fleet import api_server
from support.live_view import basic, request
from support.processes import edgeinfer_cmd, wait_until

from edgeinfer.fleet.api.deps import FleetServices
from edgeinfer.fleet.auth import TokenStore
from edgeinfer.fleet.client import FleetClient
from edgeinfer.fleet.db import FleetDB
from edgeinfer.fleet.evidence import EvidenceLimits, JpegFrames
from edgeinfer.fleet.manager import FleetManager, FleetSettings
from edgeinfer.forms.evidence import EVENT_ID, new_event_id
from edgeinfer.link.protocol import Topics

FLEET = "evi"
SNAPSHOT_LIMIT = 256 << 10
CLIP_LIMIT = 4 << 20


def jpeg(width: int, height: int, seed: int, *, quality: int = 85, progressive: bool = False) -> bytes:
    """A real JPEG: a gradient with noise and the seed's own colour (every seed encodes differently)."""
    rng = np.random.default_rng(seed)
    ramp = np.linspace(0, 255, width, dtype=np.float32)[None, :, None]
    image = np.clip(ramp + rng.normal(0, 40, (height, width, 3)) + (seed * 37) % 200, 0, 255).astype(np.uint8)
    params = [cv2.IMWRITE_JPEG_QUALITY, quality, cv2.IMWRITE_JPEG_PROGRESSIVE, int(progressive)]
    ok, encoded = cv2.imencode(".jpg", image, params)
    assert ok
    return encoded.tobytes()


def clip(frames: int, seed: int, width: int = 96, height: int = 72) -> tuple[bytes, list[bytes]]:
    parts = [jpeg(width, height, seed * 1000 + i) for i in range(frames)]
    return b"".join(parts), parts


def path_of(device: str, event_id: str, name: str) -> str:
    return f"/api/devices/{device}/events/{event_id}/{name}"


@dataclass
class Fleet:
    manager: FleetManager
    devices: dict[str, tuple[str, str]]  # device id -> (MQTT username, password)
    tokens: dict[str, str]  # role -> token

    @property
    def url(self) -> str:
        return self.manager.http.url

    def device(self, device_id: str) -> str:
        return basic(*self.devices[device_id])

    def bearer(self, role: str) -> str:
        return f"Bearer {self.tokens[role]}"

    def put(self, device: str, event_id: str, name: str, body: bytes, *, as_: str | None = None) -> tuple[int, dict]:
        auth = self.device(as_ or device) if (as_ or device) in self.devices else self.bearer(as_ or "operator")
        status, _, answer = request(self.url, "PUT", path_of(device, event_id, name), body=body, auth=auth)
        return status, json.loads(answer)

    def get(self, device: str, event_id: str, name: str, role: str = "viewer",
            query: str = "") -> tuple[int, Any, bytes]:
        return request(self.url, "GET", path_of(device, event_id, name) + query, auth=self.bearer(role))

    def events(self, query: str) -> list[dict]:
        status, _, body = request(self.url, "GET", f"/api/events?{query}", auth=self.bearer("viewer"))
        assert status == 200, body
        return json.loads(body)


@pytest.fixture(scope="module")
def fleet(postgres, tmp_path_factory):
    """A manager with its managed Mosquitto and a PostgreSQL database; cam-a and cam-b enrolled; a viewer and an
    operator token."""
    from support.ports import free_port

    settings = FleetSettings(broker=None, broker_port=free_port(), http="127.0.0.1:0",
                             db_url=postgres.create_database(), data_dir=tmp_path_factory.mktemp("evidence") / "fleet",
                             evidence_snapshot_max_bytes=SNAPSHOT_LIMIT, evidence_clip_max_bytes=CLIP_LIMIT)
    with FleetManager(settings) as manager:
        assert manager.wait_connected(10)
        admin = FleetClient(manager.http.url, token=manager.admin_token)
        issued = admin.enroll_many(["cam-a", "cam-b"], FLEET)
        tokens = {role: admin.create_token(f"evidence-{role}", role)["token"] for role in ("viewer", "operator")}
        tokens["admin"] = manager.admin_token
        yield Fleet(manager, {e["device_id"]: (e["username"], e["password"]) for e in issued}, tokens)


def incoming(manager: FleetManager) -> list[str]:
    return [p.name for p in (manager.data_dir / "evidence-incoming").iterdir()]


# ------------------------------------------------------------------------------------------ uploads
def test_a_device_uploads_its_evidence_and_it_comes_back_byte_exact(fleet):
    event_id = new_event_id(417)
    snapshot = jpeg(160, 120, 1)
    # big enough for several 1 MiB rows: 12 noisy 640x480 frames at quality 95
    movie = b"".join(jpeg(640, 480, 100 + i, quality=95) for i in range(12))
    assert len(movie) > 2 << 20
    for name, body in (("snapshot.jpg", snapshot), ("clip.mjpeg", movie)):
        status, answer = fleet.put("cam-a", event_id, name, body)
        assert status == 201, answer
        assert answer == {"device_id": "cam-a", "event_id": event_id, "file": name, "size": len(body),
                          "sha256": hashlib.sha256(body).hexdigest()}
    status, headers, body = fleet.get("cam-a", event_id, "snapshot.jpg")
    assert (status, headers["Content-Type"], body) == (200, "image/jpeg", snapshot)
    status, headers, body = fleet.get("cam-a", event_id, "clip.mjpeg")
    assert (status, headers["Content-Type"], int(headers["Content-Length"])) == (200, "video/x-motion-jpeg", len(movie))
    assert body == movie
    row = fleet.manager.db.evidence_file("cam-a", event_id, "clip.mjpeg")
    assert (row["chunks"], row["frames"]) == (3, 12)

    # an agent retrying after a network cut: the same bytes are answered 200, as stored
    status, answer = fleet.put("cam-a", event_id, "snapshot.jpg", snapshot)
    assert status == 200 and answer["sha256"] == hashlib.sha256(snapshot).hexdigest()
    # other bytes for a stored file: refused, the stored one untouched
    status, answer = fleet.put("cam-a", event_id, "snapshot.jpg", jpeg(160, 120, 2))
    assert status == 409 and "immutable" in answer["error"] and answer["sha256"] == hashlib.sha256(snapshot).hexdigest()
    assert fleet.get("cam-a", event_id, "snapshot.jpg")[2] == snapshot
    assert incoming(fleet.manager) == []


def test_who_may_upload(fleet):
    event_id = new_event_id(1)
    snapshot = jpeg(64, 48, 3)
    assert fleet.put("cam-a", event_id, "snapshot.jpg", snapshot, as_="cam-b")[0] == 403  # another device's path
    for auth in (None, basic(fleet.devices["cam-a"][0], "not-the-password"), basic("edgeinfer-evi-ghost", "x"),
                 "Basic %%%", "Bearer eit_000000000000_" + "A" * 43):
        status, headers, body = request(fleet.url, "PUT", path_of("cam-a", event_id, "snapshot.jpg"), body=snapshot,
                                        auth=auth)
        assert status == 401 and json.loads(body)["error"] and "WWW-Authenticate" in headers, (auth, body)
    status, _, body = request(fleet.url, "PUT", path_of("cam-a", event_id, "snapshot.jpg"), body=snapshot,
                              auth=fleet.bearer("viewer"))
    assert status == 403 and "operator" in json.loads(body)["error"]
    assert fleet.get("cam-a", event_id, "snapshot.jpg")[0] == 404  # none of them stored anything

    # an operator's token may (tools, tests), and is audited; the device need not be known to the fleet yet
    status, answer = fleet.put("cam-z", event_id, "snapshot.jpg", snapshot, as_="operator")
    assert status == 201, answer
    audit = FleetClient(fleet.url, token=fleet.tokens["admin"]).audit(limit=50)
    assert any(e["action"] == "evidence.upload" and e["target"] == f"cam-z/{event_id}/snapshot.jpg" for e in audit)
    # a revoked device's credential no longer uploads
    admin = FleetClient(fleet.url, token=fleet.tokens["admin"])
    issued = admin.enroll("cam-gone", FLEET)
    cam_gone = basic(issued["username"], issued["password"])
    for expected, body in ((201, snapshot), (401, jpeg(64, 48, 4))):
        if expected == 401:
            admin.revoke_device("cam-gone")
        status, _, answer = request(fleet.url, "PUT", path_of("cam-gone", event_id, "snapshot.jpg"), body=body,
                                    auth=cam_gone)
        assert status == expected, answer
    # reading needs a token: a device's credential does not read evidence
    status, _, _ = request(fleet.url, "GET", path_of("cam-z", event_id, "snapshot.jpg"), auth=fleet.device("cam-a"))
    assert status == 401


def test_refused_uploads_keep_nothing(fleet):
    base, auth, event_id = fleet.url, fleet.device("cam-a"), new_event_id(2)
    before = fleet.manager.db.evidence_bytes()
    snapshot, (movie, _) = jpeg(64, 48, 4), clip(3, 5)

    def raw(head: bytes, body: bytes = b"", *, close_after: bool = False) -> int | None:
        """Send a request by hand; its status (None when the server answered nothing)."""
        with socket.create_connection(("127.0.0.1", fleet.manager.http.port), timeout=10) as sock:
            sock.sendall(head + body)
            if close_after:
                return None
            answer = sock.recv(65536)
        return int(answer.split(b" ", 2)[1]) if answer else None

    target = path_of("cam-a", event_id, "snapshot.jpg").encode()
    header = b"PUT " + target + b" HTTP/1.1\r\nHost: x\r\nAuthorization: " + auth.encode()
    # no Content-Length (chunked): 411; over the limit, announced: 413 before a byte is read
    assert raw(header + b"\r\nTransfer-Encoding: chunked\r\n\r\n", b"5\r\nhello\r\n0\r\n\r\n") == 411
    assert raw(header + f"\r\nContent-Length: {SNAPSHOT_LIMIT + 1}\r\n\r\n".encode()) == 413
    clip_header = header.replace(b"snapshot.jpg", b"clip.mjpeg")
    assert raw(clip_header + f"\r\nContent-Length: {CLIP_LIMIT + 1}\r\n\r\n".encode()) == 413
    # a body cut short: the client promises more than it sends and goes away
    raw(header + f"\r\nContent-Length: {len(snapshot)}\r\n\r\n".encode(), snapshot[:len(snapshot) // 2],
        close_after=True)
    raw(clip_header + f"\r\nContent-Length: {len(movie)}\r\n\r\n".encode(), movie[:-10], close_after=True)

    for name, body, why in (
        ("snapshot.jpg", b"GIF89a" + snapshot, "does not start with FF D8"),
        ("snapshot.jpg", snapshot[:-2], "does not end with FF D9"),
        ("snapshot.jpg", b"", "empty"),
        ("clip.mjpeg", b"\x00" + movie, "does not start with FF D8"),
        ("clip.mjpeg", b"\xff\xd8" + b"\x00" * 500, "no whole JPEG frame"),
    ):
        status, answer = fleet.put("cam-a", event_id, name, body)
        assert status == 400 and why in answer["error"], (name, status, answer)

    good = new_event_id(3)
    for path, expected in (
        (path_of("cam-a", "..%2F..%2F..%2Fetc", "snapshot.jpg"), {404}),
        (path_of("cam-a", good, "..%2F..%2Fpasswd"), {404}),
        (path_of("cam-a", good, "%2e%2e"), {404}),
        (path_of("cam-a", good, "snapshot.png"), {404}),
        (path_of("cam-a", good, "event.json"), {404}),
        (path_of("cam-a", good, "snapshot.jpg" + "x" * 5000), {404}),
        (path_of("cam-a", "9" * 5000, "snapshot.jpg"), {400}),
        (path_of("cam-a", good + "%0A", "snapshot.jpg"), {400}),
        (path_of("cam-a", good.lower(), "snapshot.jpg"), {400}),
        (path_of("cam-a", good + "/..", "snapshot.jpg"), {404}),
        (path_of("..%2Fcam-a", good, "snapshot.jpg"), {400, 403, 404}),
    ):
        for who in (auth, fleet.bearer("operator")):
            status, _, body = request(base, "PUT", path, body=snapshot, auth=who)
            assert status in expected, (path[:120], status, body[:200])
            status, _, body = request(base, "GET", path, auth=fleet.bearer("viewer"))
            assert status in expected | {404}, (path[:120], status, body[:200])
    # the operator's token passes the device check, so the path itself is what is refused
    status, _, body = request(base, "PUT", path_of("cam%00a", good, "snapshot.jpg"), body=snapshot,
                              auth=fleet.bearer("operator"))
    assert status == 400 and "device id" in json.loads(body)["error"]

    time.sleep(0.3)  # the cut-short uploads' handlers have seen their clients go
    assert fleet.get("cam-a", event_id, "snapshot.jpg")[0] == 404
    assert fleet.get("cam-a", event_id, "clip.mjpeg")[0] == 404
    assert fleet.manager.db.evidence_bytes() == before
    assert wait_until(lambda: incoming(fleet.manager) == [], 5), incoming(fleet.manager)
    # and the same uploads, whole, are taken
    assert fleet.put("cam-a", event_id, "snapshot.jpg", snapshot)[0] == 201
    assert fleet.put("cam-a", event_id, "clip.mjpeg", movie)[0] == 201


# ------------------------------------------------------------------------------------------ reading
def publish_event(fleet: Fleet, device: str, seq: int, data: dict) -> None:
    """A rule_triggered event from ``device``, published with its own credential through the managed Mosquitto."""
    import paho.mqtt.client as paho
    from paho.mqtt.enums import CallbackAPIVersion

    username, password = fleet.devices[device]
    message = {"v": 1, "type": "event", "fleet": FLEET, "device": device, "ts": data["timestamp"],
               "boot_id": "b" * 32, "seq": seq, "event": "rule_triggered", "level": "info", "message": data["rule"],
               "pipeline": "main", "data": data}
    client = paho.Client(CallbackAPIVersion.VERSION2, client_id=username, protocol=paho.MQTTv311)
    client.username_pw_set(username, password)
    port = int(fleet.manager.broker_url.rpartition(":")[2])
    client.connect("127.0.0.1", port)
    client.loop_start()
    try:
        info = client.publish(Topics(FLEET, device).events, json.dumps(message), qos=1)
        info.wait_for_publish(10)
        assert info.is_published()
    finally:
        client.disconnect()
        client.loop_stop()


def event_data(event_id: str, *, frames: int, duration_s: float, snapshot: bytes = b"", movie: bytes = b"",
               upload: bool = True, track_id: int | None = 7) -> dict:
    return {"event_id": event_id, "stream": "door-cam", "rule": "line_crossed:door/person", "kind": "line_crossed",
            "name": "door", "label": "person", "track_id": track_id, "score": 0.91, "frame_id": 417,
            "timestamp": time.time(), "snapshot_bytes": len(snapshot), "clip_bytes": len(movie), "frames": frames,
            "duration_s": duration_s, "upload": upload}


def test_events_list_a_rule_triggered_event_with_its_evidence(fleet):
    with_evidence, without = new_event_id(10), new_event_id(11)
    snapshot, (movie, parts) = jpeg(160, 120, 20), clip(6, 21)
    assert fleet.put("cam-b", with_evidence, "snapshot.jpg", snapshot)[0] == 201
    assert fleet.put("cam-b", with_evidence, "clip.mjpeg", movie)[0] == 201
    publish_event(fleet, "cam-b", 1, event_data(with_evidence, frames=6, duration_s=1.0, snapshot=snapshot,
                                                movie=movie))
    publish_event(fleet, "cam-b", 2, event_data(without, frames=6, duration_s=1.0, upload=False, track_id=None))

    assert wait_until(lambda: len(fleet.events("device=cam-b&event=rule_triggered")) == 2, 15, 0.1), \
        fleet.events("device=cam-b")
    listed = fleet.events("device=cam-b&event=rule_triggered")
    assert [e["data"]["event_id"] for e in listed] == [without, with_evidence]  # newest first
    first = listed[1]
    assert first["device_id"] == "cam-b" and first["event"] == "rule_triggered" and first["data"]["label"] == "person"
    assert first["evidence"] == {"event_id": with_evidence, "snapshot": True, "clip": True,
                                 "snapshot_bytes": len(snapshot), "clip_bytes": len(movie), "frames": 6,
                                 "plain_snapshot": False, "clip_name": "clip.mjpeg"}
    assert listed[0]["evidence"]["snapshot"] is False and listed[0]["evidence"]["clip"] is False
    assert [e["data"]["event_id"] for e in fleet.events(f"event_id={with_evidence}")] == [with_evidence]
    assert fleet.events("device=cam-b&event=pipeline_failed") == []
    for bad in ("limit=0", "limit=5000", "device=a%20b", "event=Not-A-Name", "event_id=nope"):
        status, _, body = request(fleet.url, "GET", f"/api/events?{bad}", auth=fleet.bearer("viewer"))
        assert status == 400 and json.loads(body)["error"], bad
    assert request(fleet.url, "GET", "/api/events", auth=None)[0] == 401
    # the device's own page lists its events with the same evidence object
    device = json.loads(request(fleet.url, "GET", "/api/devices/cam-b", auth=fleet.bearer("viewer"))[2])
    mine = {e["data"]["event_id"]: e["evidence"] for e in device["events"] if e.get("event") == "rule_triggered"}
    assert mine[with_evidence]["clip"] is True and mine[without]["snapshot"] is False

    # the clip played: one JPEG a part, at the event's rate (6 frames in 1 s)
    host, port = fleet.url.removeprefix("http://").split(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=10)
    connection.request("GET", path_of("cam-b", with_evidence, "clip.mjpeg") + "?play=1",
                       headers={"Authorization": fleet.bearer("viewer")})
    started = time.monotonic()
    response = connection.getresponse()
    kind, _, boundary = response.headers["Content-Type"].partition("; boundary=")
    assert kind == "multipart/x-mixed-replace" and float(response.headers["X-Frame-Rate"]) == 6.0
    frames, arrived = [], []
    while True:
        line = response.readline().strip()
        if line == f"--{boundary}--".encode():
            break
        assert line == f"--{boundary}".encode(), line
        part = {}
        while header := response.readline().strip():
            key, _, value = header.decode().partition(": ")
            part[key.lower()] = value
        assert part["content-type"] == "image/jpeg"
        frames.append(response.read(int(part["content-length"])))
        arrived.append(time.monotonic() - started)
        assert response.readline() == b"\r\n"
    connection.close()
    assert frames == parts
    assert arrived[-1] - arrived[0] >= 5 / 6 * 0.8, arrived  # paced, not sent at once
    status, headers, body = fleet.get("cam-b", with_evidence, "snapshot.jpg", query="?play=1")
    assert (status, headers["Content-Type"], body) == (200, "image/jpeg", snapshot)  # play is a clip's only


@contextlib.contextmanager
def evidence_server(db_url: str, folder: Path, limits: EvidenceLimits
                    ) -> Iterator[tuple[Any, FleetDB, str, FleetServices]]:
    """The manager's HTTP API with its evidence store bounded by ``limits``, on ``db_url``, without a broker:
    (server, db, an operator's bearer header, the services)."""
    db = FleetDB(db_url)
    try:
        token = TokenStore(db).create(name="evidence", role="operator")["token"]
        with api_server(db, folder / "api", evidence=limits) as (server, services):
            yield server, db, f"Bearer {token}", services
    finally:
        db.close()


def test_retention_deletes_the_oldest_events_evidence_first(db_url, tmp_path):
    """Evidence bounded at 100 KiB: uploads past it delete the events stored first, whole (SQLite and PostgreSQL)."""
    with evidence_server(db_url, tmp_path, EvidenceLimits(total_bytes=100 << 10)) as (server, db, operator,
                                                                                   services):
        events, sizes = [], []
        for n in range(8):
            event_id, snapshot = new_event_id(n), jpeg(160, 120, 300 + n, quality=95)
            movie = clip(2, 400 + n, 64, 48)[0]
            for name, body in (("snapshot.jpg", snapshot), ("clip.mjpeg", movie)):
                status, _, answer = request(server.url, "PUT", path_of("cam-r", event_id, name), body=body,
                                            auth=operator)
                assert status == 201, answer
            events.append(event_id)
            sizes.append(len(snapshot) + len(movie))
            assert db.evidence_bytes() <= 100 << 10 or n == 0
        kept = [e for e in events if db.evidence_file("cam-r", e, "snapshot.jpg") is not None]
        assert kept == events[len(events) - len(kept):], (events, kept)  # the newest, in one piece
        assert 0 < len(kept) < len(events)
        assert sum(sizes[len(events) - len(kept):]) <= 100 << 10 < sum(sizes[len(events) - len(kept) - 1:])
        for gone in events[:len(events) - len(kept)]:
            assert db.evidence_file("cam-r", gone, "clip.mjpeg") is None
            assert request(server.url, "GET", path_of("cam-r", gone, "clip.mjpeg"), auth=operator)[0] == 404
        with db.engine.connect() as conn:  # no chunk outlives its file
            chunks = conn.execute(db.t.evidence_chunks.select().with_only_columns(
                db.t.evidence_chunks.c.event_id)).scalars().all()
        assert set(chunks) == set(kept)
        # the manager's retention pass (a tighter bound after a restart) deletes the same way
        store = services.evidence
        store.limits = EvidenceLimits(total_bytes=sizes[-1])
        assert store.prune() == len(kept) - 1
        assert [e for e in events if db.evidence_file("cam-r", e, "snapshot.jpg")] == events[-1:]


def test_a_large_clip_never_passes_through_memory_whole_and_retries_race_safely(db_url, tmp_path):
    """A 32 MiB clip goes up from a file and comes back in pieces: the server's traced peak stays far below its
    size. Four agents' retries of one file at once: one stores it, the others are told it is there."""
    frame = jpeg(1280, 720, 7, quality=100)
    movie = tmp_path / "clip.mjpeg"
    with open(movie, "wb") as out:
        while out.tell() < 32 << 20:
            out.write(frame)
    size, event_id = movie.stat().st_size, new_event_id(9)
    with evidence_server(db_url, tmp_path, EvidenceLimits(clip_bytes=48 << 20)) as (server, db, operator, _):
        host, port = server.url.removeprefix("http://").split(":")
        tracemalloc.start()
        try:
            connection = http.client.HTTPConnection(host, int(port), timeout=60)
            with open(movie, "rb") as body:
                connection.request("PUT", path_of("cam-m", event_id, "clip.mjpeg"), body=body,
                                   headers={"Authorization": operator, "Content-Length": str(size)})
                response = connection.getresponse()
                assert response.status == 201, response.read()
                response.read()
            digest = hashlib.sha256()
            connection.request("GET", path_of("cam-m", event_id, "clip.mjpeg"), headers={"Authorization": operator})
            response = connection.getresponse()
            while data := response.read(1 << 20):
                digest.update(data)
            connection.close()
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        assert digest.hexdigest() == hashlib.sha256(movie.read_bytes()).hexdigest()
        assert db.evidence_file("cam-m", event_id, "clip.mjpeg")["frames"] == size // len(frame)
        assert peak < 16 << 20, f"{peak / 2**20:.0f} MiB traced moving a 32 MiB clip: it went through memory"

        snapshot, racer = jpeg(320, 240, 8), new_event_id(10)
        with ThreadPoolExecutor(4) as pool:
            answers = list(pool.map(lambda _: request(server.url, "PUT", path_of("cam-m", racer, "snapshot.jpg"),
                                                      body=snapshot, auth=operator), range(4)))
        assert sorted(status for status, _, _ in answers) == [200, 200, 200, 201], answers
        assert len({body for _, _, body in answers}) == 1


def test_fleet_serve_takes_the_evidence_limits(tmp_path):
    """`fleet serve --evidence-snapshot-max-mb`: a snapshot over it is refused, one under it stored."""
    data = tmp_path / "fleet-data"
    log_file = tmp_path / "serve.log"
    env = {**os.environ, "EDGEINFER_FLEET_TOKEN": "", "EDGEINFER_FLEET_TOKEN_FILE": ""}
    with open(log_file, "w") as log:
        proc = subprocess.Popen(edgeinfer_cmd("fleet", "serve", "--broker-port", "0", "--http", "127.0.0.1:0",
                                              "--data-dir", str(data), "--evidence-snapshot-max-mb", "0.01",
                                              "--evidence-clip-max-mb", "0.5", "--evidence-max-mb", "1"),
                                stdout=log, stderr=subprocess.STDOUT, env=env)
    try:
        assert wait_until(lambda: "fleet manager: " in log_file.read_text() or proc.poll() is not None, 60), \
            log_file.read_text()
        url = re.search(r"HTTP (http://[^,]+),", log_file.read_text()).group(1)
        admin = f"Bearer {(data / 'admin.token').read_text().strip()}"
        event_id = new_event_id(1)
        small, large = jpeg(32, 24, 1), jpeg(320, 240, 2, quality=100)
        assert len(small) < 0.01 * 2**20 < len(large)
        status, _, body = request(url, "PUT", path_of("cam-1", event_id, "snapshot.jpg"), body=large, auth=admin)
        assert status == 413 and str(round(0.01 * 2**20)) in json.loads(body)["error"]
        status, _, body = request(url, "PUT", path_of("cam-1", event_id, "snapshot.jpg"), body=small, auth=admin)
        assert status == 201, body
        status, _, body = request(url, "PUT", path_of("cam-1", event_id, "clip.mjpeg"), body=large * 20, auth=admin)
        assert status == 413 and str(round(0.5 * 2**20)) in json.loads(body)["error"]
    finally:
        proc.terminate()
        proc.wait(30)


# ------------------------------------------------------------------------------------------ frames
def app1_with_thumbnail(frame: bytes, thumbnail: bytes) -> bytes:
    """``frame`` with an EXIF-like APP1 segment carrying a whole JPEG (its own FF D8 … FF D9) after the SOI."""
    payload = b"Exif\x00\x00" + thumbnail
    return frame[:2] + b"\xff\xe1" + struct.pack(">H", len(payload) + 2) + payload + frame[2:]


def test_clips_are_split_by_their_jpeg_markers():
    plain = [jpeg(64, 48, i) for i in range(3)]
    progressive = [jpeg(64, 48, 10 + i, progressive=True) for i in range(2)]
    with_thumbnail = app1_with_thumbnail(jpeg(64, 48, 20), jpeg(16, 12, 21))
    frames = [plain[0], with_thumbnail, progressive[0], plain[1], progressive[1], plain[2]]
    stream = b"junk" + frames[0] + frames[1] + b"\x00\xff" + b"".join(frames[2:]) + frames[0][:100]
    for step in (1, 2, 3, 7, 64, 1000, len(stream)):
        splitter = JpegFrames()
        out = []
        for start in range(0, len(stream), step):
            out += splitter.feed(stream[start:start + step])
        assert out == frames, step
        assert splitter.pending == 100 and splitter.broken == 0
    # a naive search for FF D9 would end the second frame inside its thumbnail
    assert with_thumbnail.index(b"\xff\xd9") < len(with_thumbnail) - 2
    assert all(cv2.imdecode(np.frombuffer(f, np.uint8), cv2.IMREAD_COLOR) is not None for f in frames)
    assert EVENT_ID.match(new_event_id(5))


# ------------------------------------------------------------------------------------------ dashboard
def _shown_event(fleet, seq: int, event_id: str, snapshot: bytes, clip_file: tuple[str, bytes], **data):
    """An event of cam-a with its snapshot and clip uploaded and its message stored: the dashboard to open and
    the event's list item's selector."""
    from support.dashboard import Dashboard

    name, movie = clip_file
    assert fleet.put("cam-a", event_id, "snapshot.jpg", snapshot)[0] == 201
    assert fleet.put("cam-a", event_id, name, movie)[0] == 201
    publish_event(fleet, "cam-a", seq, event_data(event_id, snapshot=snapshot, movie=movie, **data))
    assert wait_until(lambda: fleet.events(f"event_id={event_id}"), 15, 0.1)
    dash = Dashboard(fleet.manager, None, ["cam-a", "cam-b"], fleet.tokens,
                     {role: f"evidence-{role}" for role in fleet.tokens})
    return dash, f'li[data-testid=evidence-event][data-event-id="{event_id}"]'


def test_the_dashboard_shows_the_snapshot_and_plays_the_clip(fleet):
    from support.browser import shared_browser, wait_for, wait_js
    from support.dashboard import go, sign_in

    shown = new_event_id(30)
    snapshot, (movie, parts) = jpeg(200, 150, 40), clip(8, 41, 120, 90)
    dash, item = _shown_event(fleet, 10, shown, snapshot, ("clip.mjpeg", movie), frames=8, duration_s=1.0)
    with shared_browser() as browser:
        sign_in(browser, dash, "viewer")
        go(browser, dash, "#/events")
        wait_for(browser, item, 15)
        natural = "const i = document.querySelector(arguments[0]); return i && i.complete && i.naturalWidth;"
        assert wait_js(browser, natural, 15, f"{item} img[data-testid=evidence-snapshot]") == 200
        text = browser.driver.find_element("css selector", item).text
        assert "line_crossed:door/person" in text and "person" in text and "#7" in text and "cam-a" in text

        # every frame the player shows is recorded by the page itself as it loads (polling from here missed frames
        # on a loaded machine: between two polls, a frame came and went, or was caught still decoding)
        browser.driver.execute_script("""
            window.clipFrames = new Set();
            document.addEventListener('load', event => {
              const img = event.target;
              if (img.matches && img.matches('img[data-testid=evidence-clip]') && img.naturalWidth === 120)
                window.clipFrames.add(img.dataset.frame + '/' + img.dataset.frames);
            }, true);""")
        wait_for(browser, f"{item} [data-testid=evidence-play]").click()
        clip_img = f"{item} img[data-testid=evidence-clip]"
        assert wait_js(browser, natural, 15, clip_img) == 120
        wait_js(browser, "return window.clipFrames.size >= 5", 30)  # bounds the wait only: a loaded machine is slower
        seen = set(browser.driver.execute_script("return Array.from(window.clipFrames)"))
        assert len(seen) >= 5 and all(s.endswith(f"/{len(parts)}") for s in seen), seen  # frames advance

        # live: an event published while the page is open appears, and its snapshot once it is uploaded
        live = new_event_id(31)
        later = jpeg(120, 90, 50)
        publish_event(fleet, "cam-a", 11, event_data(live, frames=2, duration_s=0.4, snapshot=later))
        live_item = f'li[data-testid=evidence-event][data-event-id="{live}"]'
        wait_for(browser, live_item, 15)
        assert fleet.put("cam-a", live, "snapshot.jpg", later)[0] == 201
        assert wait_js(browser, natural, 20, f"{live_item} img[data-testid=evidence-snapshot]") == 120

        # the device's page lists its detections the same way
        go(browser, dash, "#/devices/cam-a")
        on_device = f"[data-testid=device-detections] {item}"
        browser.driver.execute_script("arguments[0].scrollIntoView()", wait_for(browser, on_device, 15))
        assert wait_js(browser, natural, 15, f"{on_device} img[data-testid=evidence-snapshot]") == 200
        assert browser.errors() == []



@dataclass
class SceneRun:
    """What a real agent running the scene left: the events the manager lists, the agent's evidence folder, and
    the wall-clock bounds of its run."""

    listed: list[dict]
    folder: Path
    started: float
    ended: float


@pytest.fixture(scope="module")
def scene_run(fleet, tmp_path_factory) -> SceneRun:
    """An agent process (enrolled credential, the managed broker) runs the face detector on the generated scene —
    a file, read far faster than real time — with a line and a zone, until every event and its evidence is in."""
    from support import scenes
    from support.agent import AgentProcess, write_config
    from support.pipeline import ULTRAFACE

    tmp_path = tmp_path_factory.mktemp("scene-agent")
    scene = scenes.make_scene_clip(tmp_path / "scene.avi")
    # a device of its own: the other tests' events for cam-a and cam-b must not be counted here
    [enrolled] = FleetClient(fleet.url, token=fleet.tokens["admin"]).enroll_many(["cam-e2e"], FLEET)
    username, password = enrolled["username"], enrolled["password"]
    config = write_config(
        tmp_path / "agent.yaml", device_id="cam-e2e", fleet=FLEET, broker=fleet.manager.broker_url,
        username=username, password=password, data_dir=str(tmp_path / "data"), telemetry_interval_s=0.5,
        manager_url=fleet.url, pipelines=[{
            "name": "main", "model": str(ULTRAFACE), "source": str(scene), "task": "detect", "restart": "never",
            "lines": ["door=" + ",".join(str(v) for v in scenes.LINE)], "line_band": scenes.BAND,
            "zones": ["shop=" + ",".join(f"{x},{y}" for x, y in scenes.ZONE)],
            "events": ["line_crossed:door", "zone_entered:shop"]}])
    truth = scenes.SCENE_TRUTH
    expected = truth["in"] + truth["out"] + truth["zone_entries"]

    def arrived() -> list[dict]:
        listed = fleet.events("device=cam-e2e&event=rule_triggered")
        return listed if len(listed) == expected and all(e["evidence"]["clip"] for e in listed) else []

    folder = tmp_path / "data" / "evidence" / "main"
    started = time.time()
    with AgentProcess(config, tmp_path / "agent.log") as agent:
        assert wait_until(lambda: bool(arrived()), 90, 0.2), (fleet.events("device=cam-e2e"), agent.output())
        # the agent marks a folder uploaded once the manager's answer is back, after the manager has stored it:
        # stopping the agent as soon as the manager lists everything could leave the last mark unwritten
        assert wait_until(lambda: all((folder / e["data"]["event_id"] / "uploaded").exists()
                                      for e in arrived()), 30, 0.1), agent.output()
    return SceneRun(arrived(), folder, started, time.time())


def test_a_real_agent_counts_the_scene_and_its_events_arrive_with_their_evidence(fleet, scene_run):
    """End to end: every crossing and entry is a rule_triggered event in the manager's list, and the snapshot and
    clip it uploaded are the device's files byte for byte."""
    from support import scenes

    truth = scenes.SCENE_TRUTH
    listed, folder = scene_run.listed, scene_run.folder
    assert sorted(e["data"]["kind"] for e in listed) == sorted(["line_crossed"] * (truth["in"] + truth["out"])
                                                                + ["zone_entered"] * truth["zone_entries"])
    for event in listed:
        event_id = event["data"]["event_id"]
        clip = event["evidence"]["clip_name"]
        assert event["data"]["upload"] is True and clip in ("clip.mp4", "clip.mjpeg")
        if clip == "clip.mjpeg":  # the manager counts an MJPEG clip's frames (an MP4's count is the event's)
            assert event["evidence"]["frames"] == event["data"]["frames"]
        for name in ("snapshot.jpg", "frame.jpg", clip):
            status, _, body = fleet.get("cam-e2e", event_id, name)
            assert status == 200 and body == (folder / event_id / name).read_bytes(), (event_id, name)
        assert (folder / event_id / "uploaded").exists()


def test_events_from_a_file_source_land_with_wall_clock_time_and_their_source_time_apart(scene_run):
    """Issue 35: a file source's line and zone events carried the clip's own time as their time (``79.3``: the
    Events page said "20785 d ago"). On the Events API each has the wall clock — ``ts`` and ``data.timestamp``
    within the agent's run — and the clip's own time as ``data.source_time``."""
    from support import scenes

    assert scene_run.listed
    for event in scene_run.listed:
        data = event["data"]
        assert scene_run.started <= event["ts"] <= scene_run.ended, event
        assert scene_run.started <= data["timestamp"] <= event["ts"] + 0.001, event  # the frame's time, then its report
        assert data["source_time"] == pytest.approx(data["frame_id"] / scenes.FPS, abs=1e-3), event
        stored = json.loads((scene_run.folder / data["event_id"] / "event.json").read_text())
        assert stored["event"]["timestamp"] == data["timestamp"]
        assert stored["snapshot_time"] == pytest.approx(data["source_time"], abs=1e-3)  # the clip: source time


def test_the_events_page_says_when_a_file_sources_events_happened_and_where_in_the_file(fleet, scene_run):
    """The Events page in Chromium, with the real agent's events from a file: each says it happened seconds ago
    (it said "20785 d ago", the clip's time read as a date) and, as a file's, where in the clip."""
    from support.browser import shared_browser, wait_for
    from support.dashboard import Dashboard, go, sign_in

    dash = Dashboard(fleet.manager, None, ["cam-e2e"], fleet.tokens,
                     {role: f"evidence-{role}" for role in fleet.tokens})
    with shared_browser() as browser:
        sign_in(browser, dash, "viewer")
        go(browser, dash, "#/events")
        for event in scene_run.listed:
            data = event["data"]
            item = wait_for(browser, f'li[data-testid=evidence-event][data-event-id="{data["event_id"]}"]', 15)
            when = item.find_element("css selector", "time")
            assert re.fullmatch(r"\d+ (s|min) ago", when.text), when.text
            assert abs(int(when.get_attribute("datetime")[:4]) - time.gmtime().tm_year) <= 1
            position = item.find_element("css selector", "[data-testid=evidence-source-time]").text
            minutes, seconds = position.split(":")
            assert int(minutes) * 60 + float(seconds) == pytest.approx(data["source_time"], abs=0.051), position
        assert browser.errors() == []


def test_an_mp4_clip_and_the_plain_snapshot_are_stored_and_served_as_what_they_are(fleet, tmp_path):
    from edgeinfer.pipeline.evidence import EncodedFrame
    from edgeinfer.pipeline.evidence_clip import h264_encoder, write_clip

    if h264_encoder() is None:
        pytest.skip("PyAV with an H.264 encoder is not installed")
    frames = [EncodedFrame(i, i / 5, jpeg(320, 240, 300 + i)) for i in range(7)]
    assert write_clip(tmp_path, frames)[0] == "clip.mp4"
    movie, plain = (tmp_path / "clip.mp4").read_bytes(), jpeg(160, 120, 2)
    event_id = new_event_id(52)
    assert fleet.put("cam-a", event_id, "clip.mp4", plain)[0] == 400  # a JPEG is no MP4
    assert fleet.put("cam-a", event_id, "frame.jpg", movie)[0] == 400  # nor an MP4 a JPEG
    for name, body in (("snapshot.jpg", jpeg(160, 120, 1)), ("frame.jpg", plain), ("clip.mp4", movie)):
        assert fleet.put("cam-a", event_id, name, body)[0] == 201, name
    status, headers, body = fleet.get("cam-a", event_id, "clip.mp4")
    assert status == 200 and body == movie and headers["Content-Type"] == "video/mp4"
    status, headers, body = fleet.get("cam-a", event_id, "frame.jpg")
    assert status == 200 and body == plain and headers["Content-Type"] == "image/jpeg"
    flags = fleet.manager.evidence.with_evidence([{"device_id": "cam-a", "data": {"event_id": event_id}}])
    assert {k: flags[0]["evidence"][k] for k in ("clip", "clip_name", "plain_snapshot", "clip_bytes")} == {
        "clip": True, "clip_name": "clip.mp4", "plain_snapshot": True, "clip_bytes": len(movie)}


def test_the_dashboard_plays_an_mp4_clip_in_a_video_element(fleet, tmp_path):
    from support.browser import shared_browser, wait_for, wait_js
    from support.dashboard import go, sign_in

    from edgeinfer.pipeline.evidence import EncodedFrame
    from edgeinfer.pipeline.evidence_clip import h264_encoder, write_clip

    if h264_encoder() is None:
        pytest.skip("PyAV with an H.264 encoder is not installed")
    write_clip(tmp_path, [EncodedFrame(i, i / 5, jpeg(320, 240, 60 + i)) for i in range(10)])
    shown, snapshot, movie = new_event_id(40), jpeg(200, 150, 59), (tmp_path / "clip.mp4").read_bytes()
    dash, item = _shown_event(fleet, 20, shown, snapshot, ("clip.mp4", movie), frames=10, duration_s=1.8)
    with shared_browser() as browser:
        sign_in(browser, dash, "viewer")
        go(browser, dash, "#/events")
        wait_for(browser, item, 15)
        wait_for(browser, f"{item} [data-testid=evidence-play]").click()
        video = wait_for(browser, f"{item} video[data-testid=evidence-clip]", 15)
        assert video.get_attribute("src").startswith("blob:")
        h264 = browser.driver.execute_script("return document.createElement('video')"
                                             ".canPlayType('video/mp4; codecs=\"avc1.64001e\"')")
        if h264:  # a Chromium built without the H.264 decoder (no proprietary codecs) cannot play it
            width = "const v = document.querySelector(arguments[0]); return v && v.readyState >= 1 && v.videoWidth;"
            assert wait_js(browser, width, 15, f"{item} video[data-testid=evidence-clip]") == 320
        assert browser.errors() == []

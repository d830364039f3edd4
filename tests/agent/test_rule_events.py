"""A real agent whose pipeline has event rules: ``rule_triggered`` events over a real Mosquitto, the
evidence in its data dir, and the evidence sent to an HTTP server that fails, refuses and comes back.

The HTTP server here is a fault injector in front of a folder (503 on demand, 409 for one event),
standing where the fleet manager is; tests/fleet/test_fleet_evidence.py runs the manager's own route.
"""

from __future__ import annotations

import hashlib
import http.server
import json
import shutil
import threading
import time
from pathlib import Path

from support import scenes
from support.agent import AgentProcess, write_config
from support.broker import Collector
from support.pipeline import ULTRAFACE

from edgeinfer.agent.uploads import REFUSED_MARK, UPLOADED_MARK, DeviceUploader
from edgeinfer.link.protocol import validate
from edgeinfer.pipeline.evidence import PLAIN_SNAPSHOT_NAME, SNAPSHOT_NAME, EvidenceStore

LINE = "door=" + ",".join(str(v) for v in scenes.LINE)
ZONE = "shop=" + ",".join(f"{x},{y}" for x, y in scenes.ZONE)
TRUTH = scenes.SCENE_TRUTH


class EvidenceServer:
    """PUT /api/devices/<device>/events/<id>/<file> into a folder, answering like the fleet manager
    (201 new, 200 same bytes, 409 different bytes); ``fail_next`` 503s, ``refuse`` ids get 403."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.fail_next = 0
        self.refuse: set[str] = set()
        self.requests: list[tuple[str, int]] = []
        self.auth: set[str] = set()
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_PUT(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                server.auth.add(self.headers.get("Authorization", ""))
                parts = self.path.strip("/").split("/")
                status = server.store(parts, body)
                server.requests.append((self.path, status))
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.end_headers()
                self.wfile.write(json.dumps({"error": "no"} if status >= 400 else {"ok": True}).encode())

            def log_message(self, *args) -> None:
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def store(self, parts: list[str], body: bytes) -> int:
        if self.fail_next:
            self.fail_next -= 1
            return 503
        _api, _devices, device, _events, event_id, name = parts
        if event_id in self.refuse:
            return 403
        path = self.root / device / event_id / name
        if path.exists():
            return 200 if path.read_bytes() == body else 409
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(body)
        return 201

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def __enter__(self) -> EvidenceServer:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def rule_events(collector: Collector) -> list[dict]:
    return [m for m in collector.of_kind("events") if m["event"] == "rule_triggered"]



def test_an_agent_reports_each_rule_event_and_sends_its_evidence_through_a_failing_server(tmp_path, broker):
    clip = scenes.make_scene_clip(tmp_path / "scene.avi")
    with EvidenceServer(tmp_path / "received") as server:
        server.fail_next = 3  # the manager is down for the first three requests
        config = write_config(
            tmp_path / "agent.yaml", device_id="cam-01", fleet="test", broker=broker.url, username="cam-01",
            password="s3cret", data_dir=str(tmp_path / "data"), telemetry_interval_s=0.25,
            manager_url=server.url + "/", pipelines=[{
                "name": "main", "model": str(ULTRAFACE), "source": str(clip), "task": "detect", "restart": "never",
                "lines": [LINE], "zones": [ZONE], "line_band": scenes.BAND,
                "events": ["line_crossed:door", "zone_entered:shop"]}])
        with Collector(broker.port) as collector, AgentProcess(config, tmp_path / "agent.log") as agent:
            assert collector.wait_subscribed()
            expected = TRUTH["in"] + TRUTH["out"] + TRUTH["zone_entries"]
            assert collector.wait_until(lambda c: len(rule_events(c)) >= expected, 60), agent.output()
            store = EvidenceStore(tmp_path / "data" / "evidence" / "main")
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and not all((e.folder / UPLOADED_MARK).exists() for e in store.list()):
                time.sleep(0.2)
            time.sleep(0.5)
            found = rule_events(collector)
        assert len(found) == expected
        for message in found:
            validate("events", message)
            data = message["data"]
            assert message["pipeline"] == "main" and data["upload"] is True and data["stream"] == ""
            assert data["kind"] in ("line_crossed", "zone_entered") and data["track_id"] is not None
            assert "snapshot" not in data and "clip" not in data  # the device's paths stay on the device
        crossings = sorted(m["data"]["direction"] for m in found if m["data"]["kind"] == "line_crossed")
        assert crossings == sorted(["in"] * TRUTH["in"] + ["out"] * TRUTH["out"])
        stored = {e.event_id: e for e in store.list()}
        assert set(stored) == {m["data"]["event_id"] for m in found}
        for event_id, event in stored.items():  # every file arrived byte for byte, after the 503s
            for name in (SNAPSHOT_NAME, PLAIN_SNAPSHOT_NAME, event.clip_path.name):
                sent = (tmp_path / "received" / "cam-01" / event_id / name).read_bytes()
                assert hashlib.sha256(sent).digest() == hashlib.sha256((event.folder / name).read_bytes()).digest()
        assert [status for _, status in server.requests[:3]] == [503, 503, 503]
        assert server.auth == {"Basic Y2FtLTAxOnMzY3JldA=="}  # cam-01:s3cret, the device's MQTT credential


def test_unsent_evidence_is_sent_after_a_restart_and_a_refusal_is_reported_once(tmp_path):
    """The uploader alone, on a store an earlier run left: what was not sent goes, oldest first; a
    refused event is marked, reported, and not tried again; one deleted meanwhile is skipped."""
    import cv2
    import numpy as np

    from edgeinfer.pipeline.evidence import EncodedFrame, new_event_id

    root = tmp_path / "evidence" / "main"
    store = EvidenceStore(root)
    jpeg = cv2.imencode(".jpg", np.full((48, 64, 3), 128, np.uint8))[1].tobytes()
    ids = []
    for n in range(4):
        frame = EncodedFrame(n, 1000.0 + n, jpeg)
        ids.append(store.write(new_event_id(n, 1000.0 + n), {"n": n}, frame, [frame, frame])["event_id"])
    (root / ids[0] / UPLOADED_MARK).write_text("{}")  # sent by the earlier run
    emitted: list[tuple] = []
    with EvidenceServer(tmp_path / "received") as server:
        server.refuse = {ids[2]}
        uploader = DeviceUploader(server.url, "cam-01", credentials=("cam-01", "pw"),
                                    emit=lambda *a, **k: emitted.append((a, k)))
        assert uploader.scan([("main", tmp_path / "evidence" / "main")]) == 3
        shutil.rmtree(root / ids[3])  # the store's bound took it before its turn
        uploader.start()
        deadline = time.monotonic() + 20
        while uploader.pending and time.monotonic() < deadline:
            time.sleep(0.05)
        uploader.close()
    received = tmp_path / "received" / "cam-01"
    assert [p.name for p in received.iterdir()] == [ids[1]]
    assert (root / ids[2] / REFUSED_MARK).exists() and not (root / ids[2] / UPLOADED_MARK).exists()
    assert uploader.sent == 1 and uploader.refused == 1
    [(args, kwargs)] = emitted
    assert args[0] == "evidence_upload_failed" and kwargs["data"]["status"] == 403
    assert DeviceUploader(server.url, "cam-01", credentials=None).scan([("main", root)]) == 0  # all marked
    assert len(EvidenceStore(root)) == 3  # the marks are not events and do not upset the store

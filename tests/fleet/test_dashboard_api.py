"""What the dashboard reads: the overview (from device rows and events) and the live stream (Server-Sent
Events) of a real fleet manager on a real Mosquitto; the page's security headers. Browser tests of the page
itself: test_dashboard.py."""

from __future__ import annotations

import http.client
import json
import time
import uuid

from support.assets import MODELS
from support.broker import Collector
from support.fleet import admin_client, state_message, telemetry_message
from support.processes import wait_until as wait

from edgeinfer.fleet.api.schemas import DeploymentSpec
from edgeinfer.fleet.overview import device_summary, overview
from edgeinfer.link.protocol import Topics


def row(device_id: str, *, online=True, fps=(10.0,), p95=(20.0,), temperature=None, throttled=None, pending=0,
        fallback=None, status="running", last_seen=1000.0, version=1, delegate="xnnpack") -> dict:
    return {"device_id": device_id, "online": online, "model_name": "m.tflite", "model_version": version,
            "delegate": delegate, "last_seen": last_seen,
            "state": {"pipelines": [{"name": "main", "status": status, "delegate": delegate,
                                     "fallback_reason": fallback}]},
            "last_telemetry": {"interval_s": 5.0, "spool": {"pending": pending},
                               "system": {"cpu_percent": 40.0, "rss_bytes": 2**27, "throttled": throttled,
                                          "temperature_c": temperature or {}},
                               "pipelines": [{"name": f"p{i}", "fps": f, "stages": {"latency": {"p95": p}}}
                                             for i, (f, p) in enumerate(zip(fps, p95))]}}


def test_the_overview_counts_and_lists_what_an_operator_looks_for():
    devices = [
        row("ok"),
        row("fallback", fallback="libedgetpu.so.1 not found", delegate="xnnpack"),
        row("failed", status="failed"),
        row("hot", temperature={"cpu": 84.5, "gpu": 70.0}, throttled=True),
        row("behind", pending=12, version=2),
        row("quiet", last_seen=900.0),  # 100 s silent, interval 5 s: past 3 intervals and 30 s
        row("off", online=False, last_seen=10.0),
    ]
    events = [{"device_id": "hot", "ts": 990.0, "event": "throttled"}, {"device_id": "ok", "ts": 999.0, "event": "x"}]
    seen = overview(devices, events, now=1000.0)
    assert seen["devices"] == {"total": 7, "online": 6, "offline": 1, "degraded": 2}
    assert seen["versions"] == {"m.tflite v1": 5, "m.tflite v2": 1}
    assert seen["fallbacks"] == [{"device_id": "fallback", "pipeline": "main", "delegate": "xnnpack",
                                  "reason": "libedgetpu.so.1 not found"}]
    assert (seen["throttling"], seen["hot"], seen["backlogged"], seen["silent"]) == (["hot"], ["hot"], ["behind"],
                                                                                      ["quiet"])
    assert [e["event"] for e in seen["events"]] == ["x", "throttled"]  # newest first
    two = device_summary(row("two", fps=(10.0, 2.5), p95=(20.0, 31.0)))
    assert (two["fps"], two["latency_p95_ms"], two["degraded"]) == (12.5, 31.0, False)
    assert overview([], [])["devices"] == {"total": 0, "online": 0, "offline": 0, "degraded": 0}


class Stream:
    """GET /api/changes, read frame by frame (what the page's fetch() reader does)."""

    def __init__(self, url: str, token: str | None) -> None:
        host, port = url.removeprefix("http://").split(":")
        self.connection = http.client.HTTPConnection(host, int(port), timeout=15)
        self.connection.request("GET", "/api/changes", headers={"Authorization": f"Bearer {token}"} if token else {})
        self.response = self.connection.getresponse()

    def frames(self, until, timeout: float = 15) -> list[tuple[str, object]]:
        """(event, data) frames until ``until(frames)`` holds (comments skipped)."""
        got: list[tuple[str, object]] = []
        deadline = time.monotonic() + timeout
        event, data = None, []
        while time.monotonic() < deadline and not until(got):
            line = self.response.fp.readline().decode().rstrip("\n")
            if line.startswith("event: "):
                event = line[7:]
            elif line.startswith("data: "):
                data.append(line[6:])
            elif line == "" and event:
                got.append((event, json.loads("\n".join(data))))
                event, data = None, []
        return got

    def close(self) -> None:
        self.connection.close()


def test_the_live_stream_pushes_what_changed_to_a_viewer(manager, broker):
    admin = admin_client(manager)
    viewer = admin.create_token("wall-screen", "viewer")["token"]
    refused = Stream(manager.http.url, None)
    assert refused.response.status == 401
    refused.close()
    boot = uuid.uuid4().hex
    with Collector(broker.port) as device:
        assert device.wait_subscribed()
        device.publish(Topics("f", "cam-1").state, json.dumps(state_message("cam-1", boot)))
        assert wait(lambda: manager.db.get_device("cam-1") is not None)
        stream = Stream(manager.http.url, viewer)
        try:
            assert stream.response.status == 200
            assert stream.response.getheader("Content-Type").startswith("text/event-stream")
            assert wait(lambda: manager.changes.listeners == 1)
            assert wait(lambda: manager.changes.polls >= 1)  # the feed has taken stock of what the page loaded
            device.publish(Topics("f", "cam-1").telemetry, json.dumps(telemetry_message("cam-1", boot, 1, fps=12.5)))

            def has_device(frames):
                return any(e == "devices" and any(d["device_id"] == "cam-1" and d["last_telemetry"] for d in data)
                           for e, data in frames)

            frames = stream.frames(has_device)
            assert has_device(frames), frames
            rows = [d for e, data in frames if e == "devices" for d in data]
            assert rows[-1]["last_telemetry"]["pipelines"][0]["fps"] == 12.5
            sha = admin.upload(MODELS / "mobilenet_v2_1.0_224_inat_bird_quant.tflite")["sha256"]
            created = admin.create_deployment(DeploymentSpec(sha256=sha, model_name="birds", version=2,
                                                             devices=["cam-1"]))
            frames = stream.frames(lambda f: any(e == "deployment" for e, _ in f))
            (full,) = [data for e, data in frames if e == "deployment"][:1]
            assert full["deployment_id"] == created["deployment_id"] and full["devices"][0]["device_id"] == "cam-1"
            assert any(e == "deployments" for e, _ in frames)
        finally:
            stream.close()
    assert wait(lambda: manager.changes.listeners == 0, 10)  # a closed page stops costing the database
    summary = admin._request("GET", "/api/overview")
    assert summary["devices"]["total"] == 1 and summary["versions"] == {"mobilenet.tflite v1": 1}


def test_api_answers_carry_security_headers(manager):
    import urllib.request

    request = urllib.request.Request(f"{manager.http.url}/api/whoami",
                                     headers={"Authorization": f"Bearer {manager.admin_token}"})
    with urllib.request.urlopen(request, timeout=10) as response:
        assert "default-src 'self'" in response.headers["Content-Security-Policy"]
        assert response.headers["X-Content-Type-Options"] == "nosniff"
        assert response.headers["X-Frame-Options"] == "DENY"

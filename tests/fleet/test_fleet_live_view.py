"""The live view against a real manager and a real Mosquitto: a device (its enrolled credential) posts real
JPEGs, a viewer reads them back as MJPEG, the manager asks the device for frames with a signed live_view
command on its command topic and renews it while anyone watches; an operator sends a pipeline its lines and
zones (a signed set_analytics command, an audit entry), and what is not a line or a zone is refused."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request

import pytest
from support.broker import Collector
from support.fleet import running_fleet, state_message
from support.jpegs import noise_jpeg
from support.live import Watcher, basic, post_frame
from support.processes import wait_until as wait

from edgeinfer.fleet import liveview
from edgeinfer.link.protocol import validate
from edgeinfer.link.vocabulary import Command
from edgeinfer.updates.signing import VerifyKey

FLEET = "f"
FRAMES = [noise_jpeg(seed, 320, 240) for seed in range(4)]


@pytest.fixture
def live(tmp_path, broker, monkeypatch):
    monkeypatch.setattr(liveview, "RENEW_S", 1.0)  # renewals every second, not every ten, to see them soon
    with running_fleet(tmp_path / "fleet", broker.url) as manager, Collector(broker.port) as wire:
        assert wire.wait_subscribed()
        for device in ("cam-1", "cam-2"):
            manager.db.record_state(FLEET, device, state_message(device, "0" * 32, fleet=FLEET))
        logins = {d["device_id"]: basic(d["username"], d["password"])
                  for d in manager.access.enroll_devices(["cam-1", "cam-2"], FLEET)}
        tokens = {role: manager.access.tokens.create(name=f"t-{role}", role=role)["token"]
                  for role in ("viewer", "operator")}
        yield manager, wire, logins, tokens


def commands(wire: Collector, cmd: Command) -> list[dict]:
    return [m for m in wire.of_kind("cmd") if m.get("cmd") == cmd.value]


def call(url: str, method: str, path: str, token: str, body: dict | None = None) -> tuple[int, dict]:
    request = urllib.request.Request(url + path, method=method, data=None if body is None else json.dumps(
        body).encode(), headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, json.loads(response.read() or b"null")
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"null")


def test_frames_reach_a_viewer_while_it_watches_and_the_device_is_asked_for_them(live):
    manager, wire, logins, tokens = live
    url = manager.http.url
    assert post_frame(url, "cam-1", "main", FRAMES[0], logins["cam-1"]) == 410  # nobody watches: stop
    with Watcher(url, "/api/devices/cam-1/live/main?fps=8&width=480", tokens["viewer"]) as viewer:
        assert viewer.status == 200 and viewer.content_type.startswith("multipart/x-mixed-replace")
        assert wait(lambda: commands(wire, Command.LIVE_VIEW))
        first = commands(wire, Command.LIVE_VIEW)[0]
        validate("cmd", first)
        VerifyKey(manager.key.public_key_b64()).verify_command(first, device_id="cam-1")
        args = first["args"]
        assert args["url"] == f"{url}/api/devices/cam-1/live/main/frames"
        assert (args["pipeline"], args["stream"], args["fps"], args["width"], args["max_kbps"]) == \
            ("main", "", 8.0, 480, 2000)
        assert time.time() + 20 < args["until"] <= time.time() + 31
        sent = []
        for i, jpeg in enumerate(FRAMES):
            sent.append(time.time())
            assert post_frame(url, "cam-1", "main", jpeg, logins["cam-1"], frame_time=sent[-1],
                              frame_id=str(i)) == 204
            assert wait(lambda n=i + 1: len(viewer.parts) >= n)
        assert [p.jpeg for p in viewer.parts] == FRAMES
        assert [float(p.headers["x-frame-time"]) for p in viewer.parts] == pytest.approx(sent, abs=1e-5)
        assert wait(lambda: len(commands(wire, Command.LIVE_VIEW)) >= 2, timeout=10)  # renewed while watched
        renewed = commands(wire, Command.LIVE_VIEW)[-1]
        assert renewed["id"] != first["id"] and renewed["args"]["until"] > args["until"]
    assert wait(lambda: manager.liveview.viewers == 0)  # the client went: its stream ended
    last = urllib.request.Request(f"{url}/api/devices/cam-1/live/main/last.jpg",
                                  headers={"Authorization": f"Bearer {tokens['viewer']}"})
    with urllib.request.urlopen(last, timeout=10) as response:
        assert response.read() == FRAMES[-1] and response.headers["Content-Type"] == "image/jpeg"
    assert call(url, "GET", "/api/devices/cam-1/live/other/last.jpg", tokens["viewer"])[0] == 404
    assert call(url, "GET", "/api/devices/nobody/live/main", tokens["viewer"])[0] == 404


def test_only_the_device_itself_posts_its_frames_and_junk_is_refused(live):
    manager, _wire, logins, tokens = live
    url = manager.http.url
    with Watcher(url, "/api/devices/cam-1/live/main", tokens["viewer"]):
        assert wait(lambda: manager.db.live_frame_size("cam-1", "main", None) is None and
                    manager.liveview.viewers == 1)
        assert post_frame(url, "cam-1", "main", FRAMES[0], basic("edgeinfer-f-cam-1", "wrong")) == 401
        assert post_frame(url, "cam-1", "main", FRAMES[0], logins["cam-2"]) == 403  # another device's credential
        assert post_frame(url, "cam-1", "main", FRAMES[0], f"Bearer {tokens['viewer']}") == 403
        assert post_frame(url, "cam-1", "main", b"not a jpeg at all", logins["cam-1"]) == 400
        assert post_frame(url, "cam-1", "main", FRAMES[0][:-200], logins["cam-1"]) == 400  # cut short
        assert post_frame(url, "cam-1", "main", b"", logins["cam-1"]) == 400
        huge = FRAMES[0][:-2] + bytes(liveview.MAX_FRAME_BYTES) + b"\xff\xd9"
        assert post_frame(url, "cam-1", "main", huge, logins["cam-1"]) == 413
        assert post_frame(url, "cam-1", "main", FRAMES[1], logins["cam-1"]) == 204
    assert manager.db.live_frame(("cam-1", "main", ""))["jpeg"] == FRAMES[1]  # only the newest frame is kept


def test_an_operator_sends_lines_and_zones_as_a_signed_command_with_a_new_revision(live):
    manager, wire, logins, tokens = live
    url, path = manager.http.url, "/api/devices/cam-1/pipelines/main/analytics"
    body = {"lines": {"door": [[10, 200], [300, 200]]}, "zones": {"desk": [[0, 0], [100, 0], [100, 80]]}}
    status, sent = call(url, "PUT", path, tokens["operator"], body)
    assert status == 202 and sent["revision"] == 1
    assert wait(lambda: commands(wire, Command.SET_ANALYTICS))
    command = commands(wire, Command.SET_ANALYTICS)[0]
    VerifyKey(manager.key.public_key_b64()).verify_command(command, device_id="cam-1")
    assert command["id"] == sent["command_id"]
    assert command["args"] == {"pipeline": "main", "lines": {"door": [10.0, 200.0, 300.0, 200.0]},
                               "zones": {"desk": [[0.0, 0.0], [100.0, 0.0], [100.0, 80.0]]}, "revision": 1}
    status, shown = call(url, "GET", path, tokens["viewer"])
    assert status == 200 and shown["sent"] == {"revision": 1, **body, "command_id": sent["command_id"],
                                               "at": pytest.approx(time.time(), abs=60)}
    assert shown["state"] == "sent" and shown["refused"] is None  # the device has not answered: nothing applied
    assert shown["applied"] == {"revision": 0, "lines": {}, "zones": {}, "command_id": None, "at": None}
    [entry] = [e for e in manager.db.list_audit(50) if e["action"] == "device.set_analytics"]
    assert (entry["target"], entry["actor"], entry["detail"]["revision"]) == ("cam-1/main", "t-operator", 1)
    assert call(url, "PUT", path, tokens["operator"], {"lines": {}, "zones": {}})[1]["revision"] == 2
    refused = {
        400: [{"zones": {"z": [[0, 0], [5, 5]]}}, {"lines": {"l": [[1, 1], [-1, 1]]}}, {"lines": {"\n": []}},
              {"lines": {"a/b": [[1, 1], [9, 9]]}}, {"lines": {"l": [[1, 1], [2, 2], [3, 3]]}}, {"zones": []}],
        # what the document cannot state, in the device's words (_regions)
        409: [{"lines": {"same": [[0, 0], [1, 1]]}, "zones": {"same": [[0, 0], [1, 0], [1, 1]]}},
              {"zones": {"z": [[0, 0], [0, 0], [5, 5]]}}, {"zones": {"z": [[0, 0], [5, 5], [9, 9]]}},
              {"lines": {"l": [[1, 1], [1.5, 1]]}}, {"lines": {"l": [[1, 1], [1, 1.0]]}}],
    }
    for status, bodies in refused.items():
        for bad in bodies:
            assert call(url, "PUT", path, tokens["operator"], bad)[0] == status, bad
    with Watcher(url, "/api/devices/cam-1/live/main", tokens["viewer"]):  # a frame tells the manager its size
        assert wait(lambda: manager.liveview.viewers == 1)
        assert post_frame(url, "cam-1", "main", FRAMES[0], logins["cam-1"]) == 204
    outside = {"lines": {"l": [[0, 0], [321, 10]]}}
    status, answer = call(url, "PUT", path, tokens["operator"], outside)
    assert status == 409 and "320x240" in answer["error"]
    assert call(url, "PUT", path, tokens["viewer"], body)[0] == 403
    assert call(url, "PUT", "/api/devices/nobody/pipelines/main/analytics", tokens["operator"], body)[0] == 404
    assert wait(lambda: len(commands(wire, Command.SET_ANALYTICS)) >= 2)
    time.sleep(0.5)
    assert [c["args"]["revision"] for c in commands(wire, Command.SET_ANALYTICS)] == [1, 2]  # none refused was sent

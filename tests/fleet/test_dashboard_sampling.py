"""Capturing frames from the device page in a real headless Chromium against a real manager: a device (an MQTT
client with its own enrolled credential) reports a pipeline of one camera and one of two streams; an operator asks
for the next 5 frames of one, and the manager audits ``device.sample`` and sends the device the signed sample
command with them; the page says so and links the Samples page filtered to that device and pipeline. A number out
of bounds (0, 5000) is refused in the page with the API's words, and nothing is audited or sent; a viewer sees no
Capture control."""

from __future__ import annotations

import threading
import urllib.parse
import uuid

import paho.mqtt.client as mqtt
import pytest
from support.browser import DESKTOP, Browser, shared_browser, wait_for, wait_js, wait_text
from support.dashboard import go, running_dashboard, settle, sign_in
from support.fleet import state_message
from support.processes import wait_until as wait

from edgeinfer.link.protocol import Topics, decode, encode
from edgeinfer.link.vocabulary import Command
from edgeinfer.updates.signing import VerifyKey

DEVICE = "cam-gate"
ACTION = f"device.{Command.SAMPLE.value}"
#: [pipeline, stream] rows the page offers for the state below: each pipeline, and each stream of a multi-stream one
ROWS = [["door", ""], ["yard", ""], ["yard", "north"], ["yard", "south"]]


class DeviceLink:
    """The device's side of the broker, with its own credential: publishes its state, records its commands."""

    def __init__(self, issued: dict) -> None:
        url = urllib.parse.urlsplit(issued["broker"])
        self.topics = Topics(issued["fleet"], issued["device_id"])
        self.commands: list[dict] = []
        self._subscribed = threading.Event()
        self.client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=issued["username"],
                                  protocol=mqtt.MQTTv5)
        self.client.username_pw_set(issued["username"], issued["password"])
        self.client.on_connect = lambda c, u, f, reason, p: None if reason.is_failure else \
            c.subscribe(self.topics.cmd, qos=1)
        self.client.on_subscribe = lambda *a: self._subscribed.set()
        self.client.on_message = lambda c, u, message: self.commands.append(decode("cmd", message.payload))
        self.client.connect(url.hostname, url.port)
        self.client.loop_start()
        assert self._subscribed.wait(10), "the device never subscribed to its commands"

    def publish_state(self, message: dict) -> None:
        self.client.publish(self.topics.state, encode(message), qos=1, retain=True).wait_for_publish(10)

    def close(self) -> None:
        self.client.loop_stop()
        self.client.disconnect()


@pytest.fixture(scope="module")
def dash(tmp_path_factory):
    with running_dashboard(tmp_path_factory.mktemp("capture"), devices=1, interval_s=1.0) as dashboard:
        manager = dashboard.manager
        [issued] = manager.access.enroll_devices([DEVICE], "dash")
        device = DeviceLink(issued)
        try:
            state = state_message(DEVICE, uuid.uuid4().hex, fleet="dash")
            state["pipelines"] = [
                {"name": "door", "status": "running", "delegate": "xnnpack"},
                {"name": "yard", "status": "running", "delegate": "xnnpack",
                 "streams": [{"name": s, "source": f"rtsp://cam/{s}", "status": "running", "error": None}
                             for s in ("north", "south")]}]
            device.publish_state(state)
            assert wait(lambda: [p["name"] for p in ((manager.db.get_device(DEVICE) or {}).get("state") or {})
                                 .get("pipelines", [])] == ["door", "yard"], 15)
            yield dashboard, device
        finally:
            device.close()


def captures(dashboard) -> list[dict]:
    """The audit log's capture entries, oldest first: (actor, target, detail)."""
    return [{"actor": e["actor"], "target": e["target"], "detail": e["detail"]}
            for e in dashboard.clients["admin"].audit(limit=1000) if e["action"] == ACTION]


def form(pipeline: str, stream: str = "") -> str:
    return f'[data-testid=sampling-form][data-pipeline="{pipeline}"][data-stream="{stream}"]'


def capture(browser: Browser, pipeline: str, stream: str, frames: str) -> None:
    """Type ``frames`` into the row's box and press its Sample button, as a person would."""
    from selenium.webdriver.common.keys import Keys

    box = wait_for(browser, f"{form(pipeline, stream)} [data-testid=sampling-frames]")
    box.send_keys(Keys.CONTROL, "a")
    box.send_keys(Keys.DELETE)
    box.send_keys(frames)
    wait_for(browser, f"{form(pipeline, stream)} [data-testid=sampling-submit]").click()


def open_device(browser: Browser, dashboard, role: str) -> None:
    sign_in(browser, dashboard, role)
    go(browser, dashboard, f"#/devices/{DEVICE}")
    wait_for(browser, "[data-testid=delegate-plan] tr[data-pipeline=yard]", 10)  # the state is on the page


def test_an_operator_captures_the_next_frames_of_a_pipeline_and_of_one_stream(dash):
    dashboard, device = dash
    pinned = VerifyKey(dashboard.manager.key.public_key_b64())
    before = captures(dashboard)
    with shared_browser(DESKTOP) as browser:
        open_device(browser, dashboard, "operator")
        shown = browser.driver.execute_script(
            "return Array.from(document.querySelectorAll('[data-testid=sampling-form]'))"
            ".map(f => [f.dataset.pipeline, f.dataset.stream])")
        assert shown == ROWS
        # the default and bounds are the API's own (SampleArgs in its OpenAPI document)
        wait_js(browser, "return Array.from(document.querySelectorAll('[data-testid=sampling-frames]'))"
                         ".every(i => i.value === '10' && i.min === '1' && i.max === '1000')", 10)

        capture(browser, "door", "", "5")
        text = wait_text(browser, "[data-testid=sampling-result]", lambda t: "sent" in t or "failed" in t)
        assert text.startswith("Sampling of 5 frames of door sent (command "), text
        assert "ok" in wait_for(browser, "[data-testid=sampling-result]").get_attribute("class")
        command_id = text.split("(command ", 1)[1].split(")", 1)[0]
        link = wait_for(browser, "[data-testid=sampling-samples]").get_attribute("href")
        assert link.endswith(f"#/samples?device={DEVICE}&pipeline=door"), link

        capture(browser, "yard", "south", "3")
        text = wait_text(browser, "[data-testid=sampling-result]", lambda t: "yard / south" in t)
        assert text.startswith("Sampling of 3 frames of yard / south sent (command "), text
        stream_command = text.split("(command ", 1)[1].split(")", 1)[0]

        # the link opens the Samples page filtered to that device and pipeline
        wait_for(browser, "[data-testid=sampling-samples]").click()
        wait_js(browser, "return location.hash === arguments[0]", 10, f"#/samples?device={DEVICE}&pipeline=yard")
        wait_js(browser, "const d = document.querySelector('[data-testid=samples-filter-device]'),"
                         " p = document.querySelector('[data-testid=samples-filter-pipeline]');"
                         "return d && p && d.value === arguments[0] && p.value === 'yard'", 10, DEVICE)
        assert not browser.errors(), browser.errors()

    operator = dashboard.names["operator"]
    assert captures(dashboard)[len(before):] == [
        {"actor": operator, "target": DEVICE, "detail": {"pipeline": "door", "frames": 5}},
        {"actor": operator, "target": DEVICE, "detail": {"pipeline": "yard", "frames": 3, "stream": "south"}}]
    # the device was told, in a command signed for it
    assert wait(lambda: {command_id, stream_command} <= {c["id"] for c in device.commands}, 15)
    sent = {c["id"]: c for c in device.commands}
    for command in (sent[command_id], sent[stream_command]):
        pinned.verify_command(command, device_id=DEVICE)
        assert command["cmd"] == Command.SAMPLE.value
    assert sent[command_id]["args"] == {"pipeline": "door", "frames": 5}
    assert sent[stream_command]["args"] == {"pipeline": "yard", "frames": 3, "stream": "south"}


@pytest.mark.parametrize(("frames", "words"), [("0", "frames: Input should be greater than or equal to 1"),
                                                ("5000", "frames: Input should be less than or equal to 1000")])
def test_a_number_out_of_bounds_is_refused_in_the_page(dash, frames, words):
    dashboard, device = dash
    before, told = captures(dashboard), len(device.commands)
    with shared_browser(DESKTOP) as browser:
        open_device(browser, dashboard, "operator")
        with browser.expecting(r"\b400\b"):  # the refused request is a console error, on purpose
            capture(browser, "door", "", frames)
            text = wait_text(browser, "[data-testid=sampling-result]", lambda t: "sent" in t or "failed" in t)
        assert text == f"Sampling of door failed: {words}", text
        assert "error" in wait_for(browser, "[data-testid=sampling-result]").get_attribute("class")
        assert not browser.driver.find_elements("css selector", "[data-testid=sampling-samples]")
        # the page goes on: the button is back, for a number that is fine
        wait_js(browser, "return !document.querySelector(arguments[0]).disabled", 5,
                f"{form('door')} [data-testid=sampling-submit]")
        assert not browser.errors(), browser.errors()
    settle(1.0)  # whatever was sent would have reached the device by now
    assert captures(dashboard) == before
    assert len(device.commands) == told


def test_a_viewer_sees_no_sampling_control(dash):
    dashboard, _device = dash
    with shared_browser(DESKTOP) as browser:
        open_device(browser, dashboard, "viewer")
        settle(0.5)
        for testid in ("sampling-card", "sampling-form", "sampling-frames", "sampling-submit"):
            assert not browser.driver.find_elements("css selector", f"[data-testid={testid}]"), testid
        assert not browser.errors(), browser.errors()

"""Lines and zones on a pose pipeline, from the dashboard's editor to the device's counts, with no stand-in: a real
agent process (its enrolled credential, the manager's own Mosquitto) runs yolo11n-pose.onnx on the looping people
clip with no line in its agent.yaml; an operator in headless Chromium opens its live view, is told in words that a
zone needs three points (the two drawn are kept) and what a name is (never a pattern), draws a line across the
people's path, names it "front door" and saves it; the device applies it and its counts move."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any

from support import scenes
from support.agent import AgentProcess, write_config
from support.assets import MODELS
from support.browser import DESKTOP, Browser, shared_browser, wait_for, wait_js, wait_text
from support.dashboard import Dashboard, go, sign_in
from support.ports import free_port
from support.processes import wait_until

from edgeinfer.fleet.client import FleetClient
from edgeinfer.fleet.manager import FleetManager, FleetSettings
from edgeinfer.forms.regions import NAME_FORM

DEVICE = "cam-pose"
YOLO_POSE = MODELS / "yolo11n-pose.onnx"
SIZE = scenes.SIZE  # the clip's 640x480: the editor's pixels are the source's


def _get(url: str, path: str, token: str) -> Any:
    request = urllib.request.Request(url + path, headers={"Authorization": f"Bearer {token}"})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return json.loads(response.read())
    except urllib.error.HTTPError:
        return None


def _crossings(url: str, token: str, line: str) -> dict[str, int]:
    """The most crossings of ``line`` in each direction any telemetry window of the device reported."""
    found = {"in": 0, "out": 0}

    def walk(value: object) -> None:
        if isinstance(value, dict):  # telemetry's analytics: lines as [{"name", "in", "out"}, ...]
            if value.get("name") == line and {"in", "out"} <= value.keys():
                for side in found:
                    found[side] = max(found[side], int(value[side]))
            for item in value.values():
                walk(item)
        elif isinstance(value, list):
            for item in value:
                walk(item)

    walk(_get(url, f"/api/devices/{DEVICE}/telemetry", token))
    return found


def _click(browser: Browser, x: float, y: float) -> None:
    """A click on the live frame at source pixel (x, y)."""
    from selenium.webdriver.common.action_chains import ActionChains

    overlay = wait_for(browser, "[data-testid=live-overlay]")
    width, height = browser.driver.execute_script(
        "const r = arguments[0].getBoundingClientRect(); return [r.width, r.height]", overlay)
    ActionChains(browser.driver).move_to_element_with_offset(
        overlay, round(width * (x / SIZE[0] - 0.5)), round(height * (y / SIZE[1] - 0.5))).click().perform()


def _rename(browser: Browser, kind: str, name: str) -> None:
    from selenium.webdriver.common.keys import Keys

    field = wait_for(browser, f"[data-testid=live-shapes] li[data-kind={kind}] [data-testid=shape-name]")
    field.send_keys(Keys.CONTROL, "a")
    field.send_keys(Keys.DELETE)
    field.send_keys(name, Keys.TAB)  # the change event


#: every shape label's box inside the frame's box, and clear of every handle
LABELS_READABLE = """
    const overlay = document.querySelector('[data-testid=live-overlay]').getBoundingClientRect();
    const labels = [...document.querySelectorAll('[data-testid=live-overlay] .shape-label')];
    const handles = [...document.querySelectorAll('[data-testid=live-overlay] .handle')]
      .map((h) => h.getBoundingClientRect());
    const apart = (a, b) => a.right <= b.left || b.right <= a.left || a.bottom <= b.top || b.bottom <= a.top;
    return labels.length === arguments[0] && labels.every((label) => {
      const r = label.getBoundingClientRect();
      return r.left >= overlay.left - 0.5 && r.right <= overlay.right + 0.5 && r.top >= overlay.top - 0.5
        && r.bottom <= overlay.bottom + 0.5 && handles.every((h) => apart(r, h));
    });"""


def test_a_line_drawn_on_a_pose_pipeline_in_the_editor_is_applied_by_the_device_and_counts_people(tmp_path):
    clip = scenes.make_people_clip(tmp_path / "people.avi")
    settings = FleetSettings(broker=None, broker_port=free_port(), http="127.0.0.1:0", data_dir=tmp_path / "fleet")
    with FleetManager(settings) as manager:
        assert manager.wait_connected(10)
        url = manager.http.url
        admin = FleetClient(url, token=manager.admin_token)
        [device] = admin.enroll_many([DEVICE], "f")
        tokens = {role: admin.create_token(f"pose-{role}", role)["token"] for role in ("operator", "viewer")}
        config = write_config(
            tmp_path / "agent.yaml", device_id=DEVICE, fleet="f", broker=manager.broker_url,
            username=device["username"], password=device["password"], data_dir=str(tmp_path / "data"),
            telemetry_interval_s=0.5, manager_url=url, update_public_key=manager.key.public_key_b64(),
            pipelines=[{"name": "people", "model": str(YOLO_POSE), "source": str(clip), "loop": True,
                        "max_fps": 10, "score_threshold": 0.4, "threads": 1}])
        dashboard = Dashboard(manager, None, [DEVICE], tokens, {})
        with AgentProcess(config, tmp_path / "agent.log") as agent, shared_browser(DESKTOP) as browser:
            def running_pose() -> bool:
                state = (_get(url, f"/api/devices/{DEVICE}", tokens["viewer"]) or {}).get("state") or {}
                return any(p.get("task") == "pose" and p.get("status") == "running" for p in state.get("pipelines", []))

            assert wait_until(running_pose, 120, 0.5), agent.output()
            sign_in(browser, dashboard, "operator")
            go(browser, dashboard, f"#/devices/{DEVICE}")
            wait_for(browser, "[data-testid=live-button][data-pipeline=people]", 20).click()
            wait_js(browser, "const v = document.querySelector('[data-testid=live-view]');"
                             "return v && Number(v.dataset.frames || 0) >= 2", 60)
            wait_js(browser, "return document.querySelector('[data-testid=live-overlay]').getAttribute('viewBox')"
                             " === arguments[0]", 10, f"0 0 {SIZE[0]} {SIZE[1]}")

            # a zone of two points is not closed: the page says why and keeps what was drawn
            wait_for(browser, "[data-testid=draw-zone]").click()
            _click(browser, 560, 8)  # in the frame's top-right corner: its label must stay inside
            _click(browser, 632, 8)
            wait_for(browser, "[data-testid=close-zone]").click()
            wait_text(browser, "[data-testid=live-result]",
                      "A zone needs at least 3 points: click 1 more, then Close zone.")
            assert browser.driver.execute_script(
                "return document.querySelector('[data-testid=live-overlay] polyline.zone')"
                ".getAttribute('points').split(' ').length") == 2
            _click(browser, 632, 120)
            wait_for(browser, "[data-testid=close-zone]").click()
            wait_js(browser, "return document.querySelectorAll('[data-testid=live-shapes] li[data-kind=zone]')"
                             ".length === 1", 5)

            # the people walk across x = 320: a line down the middle of the frame
            wait_for(browser, "[data-testid=draw-line]").click()
            _click(browser, 320, 470)
            _click(browser, 320, 10)
            wait_js(browser, LABELS_READABLE, 5, 2)

            # a name that is not one: said in words, and nothing is sent
            _rename(browser, "line", "door/1")
            words = f"line 'door/1' is not {NAME_FORM}"
            wait_text(browser, "[data-testid=live-result]", words)
            wait_for(browser, "[data-testid=save-analytics]").click()
            assert wait_text(browser, "[data-testid=live-result]", words) and "[A-Za-z" not in words
            analytics = _get(url, f"/api/devices/{DEVICE}/pipelines/people/analytics", tokens["viewer"])
            assert analytics["sent"]["revision"] == 0

            _rename(browser, "line", "front door")
            wait_for(browser, "[data-testid=save-analytics]").click()
            # the device's verdict
            wait_text(browser, "[data-testid=live-result]", lambda text: "applied (revision 1)" in text, 30)
            assert not browser.errors(), browser.errors()

            # the device applied the line to its running pose pipeline and counts the people crossing it
            def changed() -> list:
                return _get(url, f"/api/events?device={DEVICE}&event=analytics_changed", tokens["viewer"]) or []

            assert wait_until(changed, 30, 0.5), agent.output()
            data = changed()[0]["data"]
            [(name, line)] = data["lines"].items()
            assert data["revision"] == 1 and name == "front door", data
            assert all(abs(got - want) <= 3 for got, want in zip(line, (320, 470, 320, 10))), data  # source pixels
            assert wait_until(lambda: min(_crossings(url, tokens["viewer"], "front door").values()) >= 1, 120, 0.5), \
                (_crossings(url, tokens["viewer"], "front door"), agent.output()[-3000:])
            (pipeline,) = _get(url, f"/api/devices/{DEVICE}", tokens["viewer"])["state"]["pipelines"]
            assert pipeline["restarts"] == 0 and pipeline["task"] == "pose"

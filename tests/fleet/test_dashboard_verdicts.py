"""The device's verdict, shown where it was asked for, with no stand-in on either side: a real agent process (its
enrolled credential, the manager's Mosquitto) runs the COCO SSD on a still photo; a real headless Chromium on the
manager's dashboard.

- Capture: the scene is stored once, so every frame of a later capture is a near-duplicate — ``edgeinfer fleet
  dataset sample`` says "5 frames sampled: 0 stored, 5 near-duplicates of stored samples", the Sampling card the
  same of its own.
- The lines-and-zones editor: a line the device applies reads "applied (revision 1)"; a save the device refuses
  (the agent restarted pinning another fleet key) reads "refused by the device: bad_signature — …" in the device's
  words, and the editor's shapes come back to what the device applied; a save while the device is offline says it
  will get it when it reconnects. Screenshot: docs/img/dashboard-live-verdict-desktop.png.
- A deployment that device refuses shows its reason and words on the deployment page.
"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest
from support.agent import AgentProcess, write_config
from support.assets import IMAGES
from support.browser import DESKTOP, Browser, screenshot, shared_browser, wait_for, wait_js, wait_text
from support.dashboard import Dashboard, go, sign_in
from support.metadata import ssd_with_coco_names
from support.ports import free_port
from support.processes import edgeinfer_cmd, env_with_repo, wait_until

from edgeinfer.fleet.api.schemas import DeploymentSpec
from edgeinfer.fleet.client import FleetClient
from edgeinfer.fleet.manager import FleetManager, FleetSettings
from edgeinfer.updates.signing import SigningKey

DOCS_IMG = Path(__file__).parents[2] / "docs" / "img"
FLEET, DEVICE = "v", "cam-door"
PHOTO = IMAGES / "kite_and_cold.jpg"
SIZE = (1352, 900)  # the photo's: the source pixels lines are drawn in


class Field:
    """The agent under test (started again with other settings by a test) and what it needs."""

    def __init__(self, folder: Path, manager: FleetManager, device: dict) -> None:
        self.folder, self.manager, self.device = folder, manager, device
        self.model = ssd_with_coco_names(folder / "models")
        self.agent: AgentProcess | None = None

    def start(self, key: str) -> AgentProcess:
        """The agent, pinning ``key``, once the manager has its state with the pipeline running."""
        self.stop()
        boots = {((self.manager.db.get_device(DEVICE) or {}).get("state") or {}).get("boot_id")}
        config = write_config(
            self.folder / "agent.yaml", device_id=DEVICE, fleet=FLEET, broker=self.manager.broker_url,
            username=self.device["username"], password=self.device["password"], data_dir=str(self.folder / "data"),
            telemetry_interval_s=0.5, manager_url=self.manager.http.url, update_public_key=key, profile="none",
            pipelines=[{"name": "door", "model": str(self.model), "source": str(PHOTO), "loop": True, "max_fps": 4,
                        "threads": 1, "version": "1", "sample": ["request"]}])
        self.agent = AgentProcess(config, self.folder / "agent.log").start()

        def running() -> bool:
            state = (self.manager.db.get_device(DEVICE) or {}).get("state") or {}
            return state.get("boot_id") not in boots and state.get("online") and \
                [p.get("status") for p in state.get("pipelines", [])] == ["running"]

        assert wait_until(running, 90, 0.2), self.agent.output()
        return self.agent

    def stop(self) -> None:
        if self.agent is not None and self.agent.alive():
            self.agent.terminate()


@pytest.fixture(scope="module")
def field(tmp_path_factory):
    folder = tmp_path_factory.mktemp("door")
    settings = FleetSettings(broker=None, broker_port=free_port(), http="127.0.0.1:0", data_dir=folder / "fleet")
    with FleetManager(settings) as manager:
        assert manager.wait_connected(10)
        admin = FleetClient(manager.http.url, token=manager.admin_token)
        [device] = admin.enroll_many([DEVICE], FLEET)
        names = {"operator": "door-operator", "viewer": "door-viewer"}
        tokens = {role: admin.create_token(name, role)["token"] for role, name in names.items()}
        dashboard = Dashboard(manager, None, [DEVICE], {"admin": manager.admin_token, **tokens},
                              {"admin": admin.whoami()["name"], **names})
        here = Field(folder, manager, device)
        here.start(manager.key.public_key_b64())
        try:
            yield here, dashboard
        finally:
            if here.agent is not None:
                here.agent.kill()


def _capture_cli(url: str, token: str, frames: int, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run(edgeinfer_cmd("fleet", "dataset", "sample", DEVICE, "--pipeline", "door", "--frames",
                                        str(frames), "--timeout", "60", *extra),
                          capture_output=True, text=True, timeout=120,
                          env=env_with_repo(EDGEINFER_FLEET_URL=url, EDGEINFER_FLEET_TOKEN=token))


def _open_live(browser: Browser, dashboard: Dashboard) -> None:
    sign_in(browser, dashboard, "operator")
    go(browser, dashboard, f"#/devices/{DEVICE}")
    wait_for(browser, "[data-testid=live-button][data-pipeline=door]", 20).click()
    wait_js(browser, "const i = document.querySelector('[data-testid=live-frame]'); return i && i.naturalWidth > 0", 30)
    wait_js(browser, "return document.querySelector('[data-testid=live-overlay]').getAttribute('viewBox') === "
                     f"'0 0 {SIZE[0]} {SIZE[1]}'", 10)


def _draw_line(browser: Browser, start: tuple[float, float], end: tuple[float, float]) -> None:
    """Draw line, then two clicks at these fractions of the frame."""
    from selenium.webdriver.common.action_chains import ActionChains

    wait_for(browser, "[data-testid=draw-line]").click()
    overlay = wait_for(browser, "[data-testid=live-overlay]")
    width, height = browser.driver.execute_script(
        "const r = arguments[0].getBoundingClientRect(); return [r.width, r.height]", overlay)
    for fx, fy in (start, end):
        ActionChains(browser.driver).move_to_element_with_offset(
            overlay, int(width * (fx - 0.5)), int(height * (fy - 0.5))).click().perform()


def _lines_shown(browser: Browser) -> list[str]:
    return browser.driver.execute_script(
        "return Array.from(document.querySelectorAll('[data-testid=live-overlay] .shape.line'))"
        ".map(s => s.dataset.name)")


def _result(browser: Browser, state: str, timeout: float = 30) -> str:
    wait_js(browser, "return document.querySelector('[data-testid=live-result]').dataset.state === arguments[0]",
            timeout, state)
    return wait_for(browser, "[data-testid=live-result]").text


def test_a_capture_of_near_duplicates_says_so_in_the_cli_and_on_the_capture_card(field):
    here, dashboard = field
    url, operator = here.manager.http.url, dashboard.tokens["operator"]
    first = _capture_cli(url, operator, 2, "--json")  # the still scene: its first frame is stored, the next is not
    assert first.returncode == 0, first.stderr
    record = json.loads(first.stdout)
    assert (record["state"], record["samples"]) == ("applied", {"requested": 2, "stored": 1, "duplicates": 1})
    again = _capture_cli(url, operator, 5)
    assert again.returncode == 0, again.stderr
    assert again.stdout.strip() == "5 frames sampled: 0 stored, 5 near-duplicates of stored samples"
    assert len(FleetClient(url, token=operator).samples(device=DEVICE)) == 1  # the scene, once
    with shared_browser(DESKTOP) as browser:
        sign_in(browser, dashboard, "operator")
        go(browser, dashboard, f"#/devices/{DEVICE}")
        box = wait_for(browser, '[data-testid=sampling-form][data-pipeline="door"] [data-testid=sampling-frames]', 20)
        wait_js(browser, "return arguments[0].value === '10'", 10, box)  # the API's default has arrived
        box.clear()
        box.send_keys("3")
        wait_for(browser, '[data-testid=sampling-form][data-pipeline="door"] [data-testid=sampling-submit]').click()
        text = wait_text(browser, "[data-testid=sampling-verdict]", lambda t: "sampled:" in t, 60)
        assert text == "3 frames sampled: 0 stored, 3 near-duplicates of stored samples"
        assert wait_for(browser, "[data-testid=sampling-verdict]").get_attribute("data-state") == "applied"
        assert not browser.errors(), browser.errors()


def test_the_editor_shows_an_applied_save_then_a_refused_one_with_the_devices_words(field):
    here, dashboard = field
    api = FleetClient(here.manager.http.url, token=dashboard.tokens["viewer"])

    def analytics() -> dict:
        return api._request("GET", f"/api/devices/{DEVICE}/pipelines/door/analytics")

    with shared_browser(DESKTOP) as browser:
        _open_live(browser, dashboard)
        _draw_line(browser, (0.2, 0.5), (0.8, 0.5))
        wait_for(browser, "[data-testid=save-analytics]").click()
        assert _result(browser, "applied") == "applied (revision 1)"
        assert _lines_shown(browser) == ["line-1"]
        assert analytics()["applied"]["revision"] == 1 and analytics()["state"] == "applied"
        assert not browser.errors(), browser.errors()
    # the agent comes back pinning another fleet key: it refuses every signed command (a fleet re-keyed, say)
    here.start(SigningKey.generate().public_key_b64())
    with shared_browser(DESKTOP) as browser:
        _open_live(browser, dashboard)  # the manager's last frame: the device sends none (it refuses live_view)
        wait_js(browser, "return document.querySelectorAll('[data-testid=live-overlay] .shape.line').length === 1",
                10)  # what the device applied
        _draw_line(browser, (0.3, 0.2), (0.3, 0.8))
        assert _lines_shown(browser) == ["line-1", "line-2"]
        wait_for(browser, "[data-testid=save-analytics]").click()
        text = _result(browser, "refused")
        words = "the command is not signed by the pinned fleet key"
        assert text == f"Revision 2: refused by the device: bad_signature — {words}"
        assert "error" in wait_for(browser, "[data-testid=live-result]").get_attribute("class")
        assert wait_until(lambda: _lines_shown(browser) == ["line-1"], 10, 0.1)  # back to what the device applied
        shown = analytics()
        assert (shown["sent"]["revision"], shown["state"], shown["applied"]["revision"]) == (2, "refused", 1)
        assert (shown["refused"]["revision"], shown["refused"]["reason"], shown["refused"]["message"]) == (
            2, "bad_signature", words)
        DOCS_IMG.mkdir(exist_ok=True)  # the editor from its title down to the verdict, below the page's header
        browser.driver.execute_script("document.querySelector('[data-testid=live-view] h3').scrollIntoView();"
                                      "window.scrollBy(0, -70)")
        time.sleep(0.3)
        screenshot(browser, DOCS_IMG / "dashboard-live-verdict-desktop.png")
        # offline: the save waits for the device, and the page says it gets it when it reconnects
        here.stop()
        assert wait_until(lambda: not here.manager.db.get_device(DEVICE)["online"], 30, 0.2)
        time.sleep(1.5)  # the page hears of it on its live stream
        _draw_line(browser, (0.6, 0.2), (0.6, 0.8))
        wait_for(browser, "[data-testid=save-analytics]").click()
        assert _result(browser, "sent") == ("Revision 3: waiting for the device — the device is offline: it gets it "
                                            "when it reconnects")
        assert not browser.errors(), browser.errors()


def test_a_deployment_the_device_refuses_shows_its_reason_in_its_words_on_the_page(field):
    here, dashboard = field
    here.start(SigningKey.generate().public_key_b64())  # pins a key that is not the fleet's
    sha256, _size = here.manager.store.put(here.model)
    deployment = here.manager.deployments.create(DeploymentSpec(sha256=sha256, version=2, devices=[DEVICE],
                                                                canary_pct=100, canary_analysis=False))
    with shared_browser(DESKTOP) as browser:
        sign_in(browser, dashboard, "viewer")
        go(browser, dashboard, f"#/deployments/{deployment['deployment_id']}")
        item = f"li[data-device-id={DEVICE}]"
        wait_js(browser, "const li = document.querySelector(arguments[0]); return li && li.dataset.state === "
                         "'rejected'", 60, item)
        detail = wait_for(browser, f"{item} .dev-detail").text
        assert detail == "bad_signature — the command is not signed by the pinned fleet key"
        assert not browser.errors(), browser.errors()

"""The live view in a real headless Chromium against a real manager: frames posted with a device's own credential,
as the device posts them, move on the device page within seconds; an operator draws a counting line on the frame
and saves it, and the manager sends the set_analytics command with those coordinates; a viewer sees the line but
cannot edit. Screenshots at desktop and phone width: docs/img/dashboard-live-*.png."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
from support.browser import DESKTOP, PHONE, Browser, screenshot, wait_for, wait_js
from support.dashboard import go, running_dashboard, sign_in
from support.fleet import state_message
from support.jpegs import noise_jpeg
from support.live import basic, post_frame
from support.processes import wait_until as wait

from edgeinfer.link.vocabulary import Command

DOCS_IMG = Path(__file__).parents[2] / "docs" / "img"
DEVICE = "cam-live"


@pytest.fixture(scope="module")
def dash(tmp_path_factory):
    with running_dashboard(tmp_path_factory.mktemp("live"), devices=1, interval_s=1.0) as dashboard:
        manager = dashboard.manager
        state = state_message(DEVICE, "0" * 32, fleet="dash")
        state["pipelines"] = [{"name": "main", "status": "running"}]
        manager.db.record_state("dash", DEVICE, state)
        [issued] = manager.access.enroll_devices([DEVICE], "dash")
        yield dashboard, basic(issued["username"], issued["password"])


def feed(url: str, login: str, stop: threading.Event) -> None:
    """The device's side: a frame every 0.2 s (each different), as long as the page watches."""
    frames = [noise_jpeg(seed, 320, 240) for seed in range(5)]
    i = 0
    while not stop.is_set():
        post_frame(url, DEVICE, "main", frames[i % len(frames)], login, frame_id=str(i))
        i += 1
        stop.wait(0.2)


def test_the_device_page_shows_moving_frames_and_an_operator_draws_a_line(dash):
    dashboard, login = dash
    stop = threading.Event()
    feeder = threading.Thread(target=feed, args=(dashboard.manager.http.url, login, stop), daemon=True)
    feeder.start()
    try:
        with Browser(DESKTOP) as browser:
            sign_in(browser, dashboard, "operator")
            go(browser, dashboard, f"#/devices/{DEVICE}")
            wait_for(browser, "[data-testid=live-button][data-pipeline=main]").click()
            # moving: the page has drawn several different frames within seconds
            assert wait_js(browser, "const v = document.querySelector('[data-testid=live-view]');"
                                    "return v && Number(v.dataset.frames || 0) >= 5", 15)
            wait_js(browser, "return document.querySelector('[data-testid=live-frame]').naturalWidth === 320", 5)
            wait_for(browser, "[data-testid=draw-line]").click()
            overlay = wait_for(browser, "[data-testid=live-overlay]")
            box = browser.driver.execute_script("const r = arguments[0].getBoundingClientRect();"
                                                "return [r.width, r.height]", overlay)
            from selenium.webdriver.common.action_chains import ActionChains
            for fx, fy in ((0.25, 0.5), (0.75, 0.5)):  # a line across the middle of the frame
                ActionChains(browser.driver).move_to_element_with_offset(
                    overlay, int(box[0] * (fx - 0.5)), int(box[1] * (fy - 0.5))).click().perform()
            wait_for(browser, "[data-testid=save-analytics]").click()
            # no device answers here: the save waits for it (test_dashboard_verdicts.py has a real one answer)
            wait_js(browser, "return document.querySelector('[data-testid=live-result]').textContent === "
                             "'Revision 1: waiting for the device'", 10)
            DOCS_IMG.mkdir(exist_ok=True)
            screenshot(browser, DOCS_IMG / "dashboard-live-desktop.png")
            browser.set_window_size(*PHONE)
            time.sleep(0.5)
            screenshot(browser, DOCS_IMG / "dashboard-live-phone.png")
            assert not browser.errors(), browser.errors()
        action = f"device.{Command.SET_ANALYTICS.value}"
        [entry] = [e for e in dashboard.manager.db.list_audit(50) if e["action"] == action]
        [(x1, y1, x2, y2)] = entry["detail"]["lines"].values()
        assert x1 == pytest.approx(80, abs=3) and x2 == pytest.approx(240, abs=3)  # source pixels, not CSS pixels
        assert y1 == pytest.approx(120, abs=3) and y2 == pytest.approx(120, abs=3)
        assert entry["detail"]["revision"] == 1
        # the device says it applied them (its analytics_changed event, as ingest stores it): the editor shows what
        # the device applied, never what it was only sent
        applied = {"pipeline": "main", "stream": "", "revision": 1, "lines": entry["detail"]["lines"], "zones": {}}
        dashboard.manager.db.store_events([("dash", DEVICE, {"event": "analytics_changed", "ts": time.time(),
                                                             "data": applied})])
        with Browser(DESKTOP) as browser:  # a viewer sees the line, and nothing to edit it with
            sign_in(browser, dashboard, "viewer")
            go(browser, dashboard, f"#/devices/{DEVICE}")
            wait_for(browser, "[data-testid=live-button][data-pipeline=main]").click()
            wait_js(browser, "return document.querySelectorAll('[data-testid=live-overlay] .shape.line').length === 1",
                    10)
            assert not browser.driver.find_elements("css selector", "[data-testid=save-analytics]")
            assert not browser.errors(), browser.errors()
    finally:
        stop.set()
        feeder.join(5)
    assert wait(lambda: dashboard.manager.liveview.viewers == 0, 10)

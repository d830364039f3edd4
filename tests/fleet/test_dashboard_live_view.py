"""The live view in a real headless Chromium against a real manager: frames posted with a device's own credential,
as the device posts them, move on the device page within seconds; an operator draws a counting line on the frame
and saves it, and the manager sends the set_analytics command with those coordinates; a viewer sees the line but
cannot edit. Screenshots at desktop and phone width: docs/img/dashboard-live-*.png."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
from support.browser import DESKTOP, PHONE, screenshot, shared_browser, wait_for, wait_js, wait_text
from support.dashboard import go, running_dashboard, sign_in
from support.fleet import state_message
from support.jpegs import noise_jpeg
from support.live_view import basic, post_frame
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
        with shared_browser(DESKTOP) as browser:
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
        with shared_browser(DESKTOP) as browser:  # a viewer sees the line, and nothing to edit it with
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
    assert wait(lambda: dashboard.manager.live_view.viewers == 0, 10)


def frame_status(browser) -> dict:
    """What the live view says of its frame: its state, age, text, threshold and how many frames it has drawn."""
    return browser.driver.execute_script(
        "const s = document.querySelector('[data-testid=live-status]');"
        "const v = document.querySelector('[data-testid=live-view]');"
        "return s && {state: s.dataset.frameState || '', age: s.dataset.frameAge || '', text: s.textContent,"
        "  staleAfter: Number(s.dataset.staleAfter), frames: Number((v && v.dataset.frames) || 0)}")


def wait_state(browser, state: str, timeout: float) -> dict:
    assert wait(lambda: (frame_status(browser) or {}).get("state") == state, timeout), frame_status(browser)
    return frame_status(browser)


def test_a_frame_from_the_past_is_marked_stale_or_offline_with_its_age(dash):
    """Issue 35: after an agent restart the viewer showed the previous run's last frame as "live: frame 70". Now the
    live view says each frame's age, from its capture time on the device; a frame older than the page's threshold —
    the device stopped sending, or the viewer opened after it did — is marked stale, and an offline device's last
    frame says so."""
    dashboard, _ = dash
    manager, device = dashboard.manager, "cam-stale"
    [issued] = manager.access.enroll_devices([device], "dash")
    login = basic(issued["username"], issued["password"])
    state = state_message(device, "1" * 32, fleet="dash")
    manager.db.record_state("dash", device, state)
    frames = [noise_jpeg(seed, 320, 240) for seed in range(3)]
    sent = {"n": 0}
    stop = threading.Event()

    def device_sends() -> None:
        while not stop.is_set():
            post_frame(manager.http.url, device, "main", frames[sent["n"] % 3], login, frame_id=str(sent["n"]))
            sent["n"] += 1
            stop.wait(0.2)

    feeder = threading.Thread(target=device_sends, daemon=True)
    feeder.start()
    with shared_browser(DESKTOP) as browser:
        sign_in(browser, dashboard, "viewer")
        go(browser, dashboard, f"#/devices/{device}")
        wait_for(browser, "[data-testid=live-button][data-pipeline=main]").click()
        live = wait_state(browser, "live", 15)
        assert live["text"].startswith("live: frame ") and " s old" in live["text"], live
        assert 0 <= float(live["age"]) <= live["staleAfter"], live
        stale_after = live["staleAfter"]
        assert 1 <= stale_after <= 30  # "a few seconds", as the page defines it
        # the device stops (the agent is restarting): no new frame, and the one shown grows old on the page
        stop.set()
        feeder.join(5)
        last_sent = time.time()
        stale = wait_state(browser, "stale", stale_after + 10)
        assert stale["text"].startswith(f"stale — frame {sent['n'] - 1}, ") and stale["text"].endswith(" s old"), stale
        assert float(stale["age"]) >= stale_after  # the page says the age to 0.1 s: 5.04 s reads "5.0"
        # a viewer who opens the live view now sees the stored frame as what it is — the past — from its first frame
        go(browser, dashboard, "#/devices")
        go(browser, dashboard, f"#/devices/{device}")
        wait_for(browser, "[data-testid=live-button][data-pipeline=main]").click()
        assert wait(lambda: (frame_status(browser) or {}).get("frames") == 1, 15), frame_status(browser)
        reopened = frame_status(browser)
        assert reopened["state"] == "stale" and "live:" not in reopened["text"], reopened
        assert float(reopened["age"]) >= min(time.time() - last_sent, stale_after), reopened
        # the device goes offline (its Last Will): the frame is its last, with when it was taken
        manager.db.record_state("dash", device, {**state, "online": False, "ts": time.time()})
        offline = wait_state(browser, "offline", 15)
        assert offline["text"].startswith("device offline — last frame ") and " old)" in offline["text"], offline
        assert float(browser.driver.execute_script(  # dimmed on the page, not only said under it
            "return getComputedStyle(document.querySelector('[data-testid=live-frame]')).opacity")) < 1
        # back online and sending: live again, without a reload
        manager.db.record_state("dash", device, {**state, "ts": time.time()})
        stop.clear()
        feeder = threading.Thread(target=device_sends, daemon=True)
        feeder.start()
        wait_state(browser, "live", 20)
        assert not browser.errors(), browser.errors()
    stop.set()
    feeder.join(5)


def publish_birth(broker_url: str, username: str, password: str, state: dict) -> None:
    """What an agent does when it first connects: its retained state message, under its own credential."""
    import json
    import urllib.parse

    import paho.mqtt.client as paho
    from paho.mqtt.enums import CallbackAPIVersion

    from edgeinfer.link.protocol import Topics

    where = urllib.parse.urlsplit(broker_url)
    client = paho.Client(CallbackAPIVersion.VERSION2, client_id=f"birth-{state['device']}", protocol=paho.MQTTv311)
    client.username_pw_set(username, password)
    client.connect(where.hostname, where.port, keepalive=10)
    client.loop_start()
    try:
        topic = Topics(state["fleet"], state["device"]).state
        client.publish(topic, json.dumps(state), qos=1, retain=True).wait_for_publish(10)
    finally:
        client.disconnect()
        client.loop_stop()


def test_a_device_page_opened_before_its_device_registers_shows_it_once_it_does(dash):
    """Issue 35, item 8: the page stayed on "Could not load" until reloaded. It says the device is not known yet, and
    becomes the device's page when the device registers — the live stream's update, no reload."""
    dashboard, _ = dash
    manager, device = dashboard.manager, "cam-later"
    with shared_browser(DESKTOP) as browser:
        sign_in(browser, dashboard, "viewer")
        # the page asks for the device, and is told 404 until it registers (what the console logs of those)
        with browser.expecting(rf"/api/devices/{device} .*404"):
            go(browser, dashboard, f"#/devices/{device}")
            waiting = wait_for(browser, "[data-testid=device-unknown]")
            assert "not known yet" in waiting.text and device in waiting.text
            assert "Could not load" not in browser.driver.find_element("css selector", "#view").text
            browser.driver.execute_script("window.notReloaded = true")
            [issued] = manager.access.enroll_devices([device], "dash")
            publish_birth(manager.broker_url, issued["username"], issued["password"],
                          state_message(device, "2" * 32, fleet="dash"))
            shown = wait_for(browser, f"[data-testid=device][data-device-id={device}]", 20)
        assert wait_text(browser, "[data-testid=device] .page-head .badge", lambda t: t in ("online", "degraded"), 10)
        assert wait_for(browser, "[data-testid=live-button][data-pipeline=main]").is_displayed()
        assert shown.is_displayed() and not browser.driver.find_elements("css selector", "[data-testid=device-unknown]")
        assert browser.driver.execute_script("return window.notReloaded === true")
        assert not browser.errors(), browser.errors()

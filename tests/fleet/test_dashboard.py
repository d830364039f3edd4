"""The fleet dashboard in a real headless Chromium against a real fleet manager, its managed Mosquitto and 50
simulated agents speaking the real protocol: signing in, the fleet's figures as the database has them, a
deployment started from the page that reaches every device while its waves progress live (no reload), a
viewer who can neither see nor forge a deployment, and screenshots of every page at desktop and phone
width (docs/img/dashboard-*.png), with no console error in the whole module."""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest
from support.assets import MODELS
from support.browser import (
    DESKTOP,
    PHONE,
    PNG_SIGNATURE,
    png_size,
    screenshot,
    shared_browser,
    text_of,
    wait_for,
    wait_js,
    wait_text,
    wait_until,
)
from support.dashboard import fill, go, rows, running_dashboard, settle, sign_in, sign_out, submit_token, wait_live

from edgeinfer.fleet.api.schemas import DeploymentSpec

BIRDS = MODELS / "mobilenet_v2_1.0_224_inat_bird_quant.tflite"
DOCS_IMG = Path(__file__).parents[2] / "docs" / "img"
DEVICES = 50


@pytest.fixture(scope="module")
def dash(tmp_path_factory):
    """A manager with 50 enrolled devices simulated in the background (telemetry every 0.5 s), all online."""
    with running_dashboard(tmp_path_factory.mktemp("dashboard"), devices=DEVICES, interval_s=0.5) as dashboard:
        yield dashboard


@pytest.fixture(scope="module")
def browser():
    """One Chromium for the module: its console is collected from the first page to the last."""
    with shared_browser(DESKTOP) as chromium:
        yield chromium


def fps_text(telemetry: dict | None) -> str | None:
    """What the devices table shows in its fps column for a device's last telemetry: the sum over its
    pipelines, one decimal."""
    if not telemetry:
        return None
    return f"{sum(float(p.get('fps') or 0.0) for p in telemetry.get('pipelines') or []):.1f}"


def digits(text: str | None) -> str:
    """The version a cell shows: its last number ("model.tflite v2" -> "2")."""
    numbers = re.findall(r"\d+", text or "")
    return numbers[-1] if numbers else ""


def test_sign_in(dash, browser):
    sign_out(browser, dash)
    wait_for(browser, "[data-testid=signin]", 15)
    with browser.expecting(r"\b401\b", timeout=2):  # the refused token's request is a console error, on purpose
        submit_token(browser, "eit_" + "0" * 12 + "_" + "A" * 43)
        wait_for(browser, "[data-testid=signin-error]", 10)
    assert not browser.driver.find_elements("css selector", "[data-testid=whoami]") or \
        "(operator)" not in (text_of(browser, "[data-testid=whoami]") or "")
    submit_token(browser, dash.tokens["operator"])
    whoami = wait_text(browser, "[data-testid=whoami]", lambda text: "(operator)" in text, 15)
    assert dash.names["operator"] in whoami
    wait_live(browser)
    assert browser.driver.execute_script("return document.body.dataset.changes") == "connected"


def test_fifty_devices_with_the_figures_the_database_has(dash, browser):
    sign_in(browser, dash, "operator")
    go(browser, dash, "#/")
    wait_text(browser, "[data-testid=count-online]", str(DEVICES), 20)
    wait_text(browser, "[data-testid=count-total]", str(DEVICES), 5)

    go(browser, dash, "#/devices")
    wait_js(browser, "return document.querySelectorAll('tr[data-device-id]').length === arguments[0]", 15, DEVICES)
    assert sorted(r["id"] for r in rows(browser)) == dash.device_ids

    for device_id in ("sim-00000", "sim-00017", "sim-00042"):
        # the figures move every 0.5 s: poll until the page and a fresh read of the database agree
        seen: list[tuple] = []

        def agree(device_id=device_id, seen=seen) -> bool:
            row = next(r for r in rows(browser) if r["id"] == device_id)
            device = dash.manager.db.get_device(device_id)
            expected = (fps_text(device["last_telemetry"]), str(device["model_version"]))
            seen.append((row["fps"], digits(row["version"]), *expected))
            return re.fullmatch(r"\d+\.\d", row["fps"] or "") is not None and \
                (row["fps"], digits(row["version"])) == expected

        assert wait_until(agree, 15, 0.1), (device_id, seen[-5:])
        api = next(d for d in dash.clients["admin"].devices() if d["device_id"] == device_id)
        assert api["model_version"] == 1 and seen[-1][1] == "1", (api, seen[-1])  # no deployment yet

    fltr = wait_for(browser, "[data-testid=devices-filter]")
    fltr.send_keys("sim-0001")  # sim-00010 … sim-00019
    wait_text(browser, "[data-testid=devices-count]", lambda text: re.search(r"\b10\b", text) is not None, 5)
    shown = wait_until(lambda: [r["id"] for r in rows(browser) if r["shown"]] if
                       len([r for r in rows(browser) if r["shown"]]) == 10 else None, 5)
    assert shown and all(i.startswith("sim-0001") for i in shown), rows(browser)
    fill(browser, "devices-filter", "")
    wait_text(browser, "[data-testid=devices-count]", lambda text: re.search(rf"\b{DEVICES}\b", text) is not None, 5)

    before = [r["id"] for r in rows(browser)]
    wait_for(browser, "button[data-sort=fps]").click()

    def sorted_by_fps() -> list[float] | None:
        table = rows(browser)
        values = [float(r["fps"]) for r in table]
        ordered = values in (sorted(values), sorted(values, reverse=True))
        return values if ordered and [r["id"] for r in table] != before else None

    assert wait_until(sorted_by_fps, 5, 0.1), rows(browser)


def test_a_deployment_from_the_page_reaches_every_device_live(dash, browser):
    sign_in(browser, dash, "operator")
    go(browser, dash, "#/deployments")
    wait_for(browser, "[data-testid=deploy-form]", 10)
    browser.driver.execute_script("window.__noReload = true")

    # the form's bounds are the API's: the DeploymentSpec of /openapi.json, checked before the upload starts
    spec = DeploymentSpec.model_json_schema()["properties"]
    bounds = browser.driver.execute_script("""
        return Object.fromEntries(Array.from(document.querySelectorAll('[data-spec-key]'))
          .map(i => [i.dataset.specKey, [i.min, i.max]]));""")
    for key, (low, high) in bounds.items():
        field = next(b for b in spec[key].get("anyOf", [spec[key]]) if b.get("type") != "null")
        assert (float(low), float(high) if high else None) == (field.get("minimum", field.get("exclusiveMinimum")),
                                                               field.get("maximum")), (key, low, high, field)
    assert {"canary_pct", "wave_size", "max_output_drift"} <= set(bounds)
    uploads = len([e for e in dash.clients["admin"].audit(limit=1000) if e["action"] == "artifact.upload"])
    fill(browser, "deploy-file", str(BIRDS))
    fill(browser, "deploy-version", "2")
    fill(browser, "deploy-target", "all")
    fill(browser, "deploy-canary", "150")
    browser.driver.execute_script("document.querySelector('[data-testid=deploy-form]').requestSubmit()")
    wait_text(browser, "[data-testid=deploy-error]", lambda text: "between 0 and 100" in text, 5)
    assert len([e for e in dash.clients["admin"].audit(limit=1000) if e["action"] == "artifact.upload"]) == uploads
    fill(browser, "deploy-canary", "10")
    fill(browser, "deploy-wave-size", "15")
    fill(browser, "deploy-canary-window", "3")  # the simulator runs the bird model as healthy: the canary passes
    browser.driver.execute_script("""
        const form = document.querySelector('[data-testid=deploy-form]');
        const button = form.querySelector('button[type=submit], input[type=submit], button:not([type])');
        if (button) button.click(); else form.requestSubmit();""")

    route = wait_js(browser, "const m = location.hash.match(/^#\\/deployments\\/(.+)$/); return m && m[1];", 30)
    wait_for(browser, "[data-testid=deployment]", 10)
    deployment_id = route
    progress: list[str] = []
    deadline = time.monotonic() + 60
    status = ""
    while time.monotonic() < deadline:
        state = browser.driver.execute_script("""
            const status = document.querySelector('[data-testid=deployment-status]');
            return {status: status ? status.innerText.trim().toLowerCase() : '',
                    progress: Array.from(document.querySelectorAll('[data-testid=wave-progress]'))
                                   .map(e => e.innerText.trim()).join(' | ')};""")
        status = state["status"]
        if state["progress"] and (not progress or progress[-1] != state["progress"]):
            progress.append(state["progress"])
        if "succeeded" in status or "failed" in status or "aborted" in status:
            break
        time.sleep(0.05)
    assert "succeeded" in status, (status, progress, dash.clients["admin"].deployment(deployment_id))

    def every_device_active() -> dict | None:
        waves = browser.driver.execute_script("""
            return Array.from(document.querySelectorAll('[data-testid=wave]')).map(w =>
              Array.from(w.querySelectorAll('[data-device-id][data-state]'))
                   .map(d => [d.dataset.deviceId, d.dataset.state]));""")
        states = dict(pair for wave in waves for pair in wave)
        return {"waves": waves, "states": states} if len(states) == DEVICES and \
            set(states.values()) == {"active"} else None

    final = wait_until(every_device_active, 15, 0.1)
    assert final, browser.driver.execute_script(
        "return document.querySelector('[data-testid=deployment]').innerText")
    assert sorted(final["states"]) == dash.device_ids
    assert len(final["waves"]) >= 3, final["waves"]  # a canary of 5, then waves of 15
    assert len(set(progress)) >= 3, progress  # the progress changed at least twice while it ran, without a reload
    assert browser.driver.execute_script("return window.__noReload === true")

    record = dash.clients["admin"].deployment(deployment_id)
    assert record and record["status"] == "succeeded", record
    assert wait_until(lambda: all(dash.manager.db.get_device(i)["model_version"] == 2 for i in dash.device_ids), 10)


def test_a_viewer_can_neither_see_nor_forge_a_deployment(dash, browser):
    sign_in(browser, dash, "operator")  # the control: an operator has the actions a viewer must not
    go(browser, dash, "#/devices/sim-00003")
    wait_for(browser, "[data-testid=action-restart]", 10)
    wait_for(browser, "[data-testid=action-rollback]", 5)

    sign_in(browser, dash, "viewer")
    go(browser, dash, "#/deployments")
    settle(1.0)
    assert browser.driver.find_elements("css selector", "[data-testid=deploy-form]") == []
    go(browser, dash, "#/devices/sim-00003")
    wait_js(browser, "return document.body.innerText.includes('sim-00003')", 10)
    settle(0.5)
    for action in ("action-restart", "action-rollback"):
        assert browser.driver.find_elements("css selector", f"[data-testid={action}]") == [], action

    sha256 = dash.clients["operator"].upload(BIRDS)["sha256"]
    with browser.expecting(r"\b403\b"):  # the refusal is a console error, on purpose
        answer = browser.driver.execute_async_script("""
            const [token, sha256, done] = arguments;
            fetch('/api/deployments', {method: 'POST',
                  headers: {Authorization: 'Bearer ' + token, 'Content-Type': 'application/json'},
                  body: JSON.stringify({sha256: sha256, version: 99, all: true, canary_pct: 10})})
              .then(r => r.text().then(body => done([r.status, body])), e => done([0, String(e)]));""",
            dash.tokens["viewer"], sha256)
    assert answer[0] == 403, answer
    audit = dash.clients["admin"].audit(limit=1000)
    assert not [e for e in audit if e.get("actor") == dash.names["viewer"] and
                str(e.get("action", "")).startswith("deployment")], audit
    assert all(d.get("version") != 99 for d in dash.clients["admin"].deployments())


def a_deployment(dash) -> str:
    """The newest deployment's id; one is made through the API (and finished) if the module has none yet."""
    admin = dash.clients["admin"]
    listed = admin.deployments()
    if listed:
        return max(listed, key=lambda d: d.get("created_at", 0))["deployment_id"]
    sha256 = dash.clients["operator"].upload(BIRDS)["sha256"]
    created = dash.clients["operator"].create_deployment(DeploymentSpec(sha256=sha256, version=2, all=True,
                                                                        canary_pct=10, wave_size=15,
                                                                        canary_window_s=3, canary_min_windows=10))
    deployment_id = created["deployment_id"]
    assert wait_until(lambda: (admin.deployment(deployment_id) or {}).get("status") == "succeeded", 60, 0.2)
    return deployment_id


def test_screenshots_of_every_page_and_no_console_errors(dash, browser):
    from PIL import Image

    deployment_id = a_deployment(dash)
    device_id = "sim-00000"
    sign_in(browser, dash, "operator")
    pages = {
        "overview": ("#/", lambda: wait_text(browser, "[data-testid=count-total]", str(DEVICES), 15)),
        "devices": ("#/devices", lambda: wait_js(
            browser, "return document.querySelectorAll('tr[data-device-id]').length === arguments[0]", 15, DEVICES)),
        "device": (f"#/devices/{device_id}", lambda: wait_js(
            browser, "return document.body.innerText.includes(arguments[0])", 15, device_id)),
        "deployments": ("#/deployments", lambda: wait_for(browser, "[data-testid=deploy-form]", 15)),
        "deployment": (f"#/deployments/{deployment_id}", lambda: wait_text(
            browser, "[data-testid=deployment-status]", lambda text: "succeeded" in text.lower(), 15)),
    }
    written = []
    for size_name, size in (("desktop", DESKTOP), ("phone", PHONE)):
        browser.set_window_size(*size)
        for page, (route, ready) in pages.items():
            go(browser, dash, route)
            ready()
            settle(0.4)  # charts and layout after the route change
            path = screenshot(browser, DOCS_IMG / f"dashboard-{page}-{size_name}.png")
            data = path.read_bytes()
            assert data[:8] == PNG_SIGNATURE and len(data) > 5000, (path, len(data))
            assert png_size(path) == size, (path, png_size(path))
            with Image.open(path) as image:
                colours = image.convert("RGB").getcolors(maxcolors=1 << 16)
            assert colours is None or len(colours) > 16, (path, "an almost blank page")
            written.append(path)
    assert len(written) == 10
    browser.set_window_size(*DESKTOP)
    assert browser.errors() == [], browser.errors()

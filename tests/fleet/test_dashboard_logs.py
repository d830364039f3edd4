"""The device page's Logs card in a real headless Chromium, against a real manager (its own Mosquitto) and a real agent
process whose pipeline keeps failing on a camera URL with a password in it: an operator sees the lines the agent
logged (the password masked), filters them by level, follows them and sees a line the agent logs afterwards, and runs
the doctor on the device and sees its findings; a viewer gets no Logs card; a device that is offline is said
plainly, with the lines received before."""

from __future__ import annotations

import json
import subprocess

import pytest
from support.agent import AgentProcess, write_config
from support.assets import MODELS
from support.browser import DESKTOP, Browser, shared_browser, wait_for, wait_js, wait_text
from support.dashboard import Dashboard, fill, go, settle, sign_in
from support.ports import free_port
from support.processes import edgeinfer_cmd, env_with_repo, wait_until

from edgeinfer.errors import FleetRequestError
from edgeinfer.fleet.client import FleetClient
from edgeinfer.fleet.manager import FleetManager, FleetSettings

DEVICE = "cam-dash-logs"
SECRET = "Dash5ecret"
CAMERA = f"http://viewer:{SECRET}@127.0.0.1:{free_port()}/video.mjpeg"  # nothing listens: it fails, and says so
SHOWN = ("Array.from(document.querySelectorAll('[data-testid=log-lines] li'))"
         ".map(li => [li.dataset.level, li.innerText])")


@pytest.fixture(scope="module")
def page(tmp_path_factory):
    folder = tmp_path_factory.mktemp("dash-logs")
    settings = FleetSettings(broker=None, broker_port=free_port(), http="127.0.0.1:0", data_dir=folder / "fleet")
    with FleetManager(settings) as manager:
        assert manager.wait_connected(10)
        admin = FleetClient(manager.http.url, token=manager.admin_token)
        [device] = admin.enroll_many([DEVICE], "f")
        names = {"admin": admin.whoami()["name"], "operator": "logs-operator", "viewer": "logs-viewer"}
        tokens = {"admin": manager.admin_token,
                  **{role: admin.create_token(names[role], role)["token"] for role in ("operator", "viewer")}}
        config = write_config(
            folder / "agent.yaml", device_id=DEVICE, fleet="f", broker=manager.broker_url,
            username=device["username"], password=device["password"], data_dir=str(folder / "data"),
            telemetry_interval_s=0.5, manager_url=manager.http.url, update_public_key=manager.key.public_key_b64(),
            restart_max_s=2.0,
            pipelines=[{"name": "main", "model": str(MODELS / "mobilenet_v1_0.25_128_quant.tflite"), "source": CAMERA}])
        with AgentProcess(config, folder / "agent.log") as agent:
            assert wait_until(lambda: (manager.db.get_device(DEVICE) or {}).get("online"), 60, 0.2), agent.output()
            assert wait_until(lambda: SECRET in agent.output(), 60, 0.2), agent.output()  # logged, as it is
            clients = {role: FleetClient(manager.http.url, token=token) for role, token in tokens.items()}
            yield Dashboard(manager, None, [DEVICE], tokens, names, clients), agent


def open_device(browser: Browser, dashboard: Dashboard, role: str) -> None:
    sign_in(browser, dashboard, role)
    go(browser, dashboard, f"#/devices/{DEVICE}")
    wait_for(browser, "[data-testid=device]", 10)


def test_an_operator_reads_filters_and_follows_a_devices_logs_and_runs_its_doctor(page):
    dashboard, _agent = page
    with shared_browser(DESKTOP) as browser:
        open_device(browser, dashboard, "operator")
        wait_text(browser, "[data-testid=logs-status]", lambda t: "Refresh asks the device" in t, 15)
        assert (dashboard.manager.db.diagnosis.state(DEVICE) or {}).get("logs_requested_at") is None  # opening the
        wait_for(browser, "[data-testid=logs-refresh]").click()  # page asked the device nothing; Refresh asks
        status = wait_text(browser, "[data-testid=logs-status]", lambda t: t.endswith(tuple("0123456789")), 30)
        assert "line" in status and "error" not in wait_for(browser, "[data-testid=logs-status]").get_attribute(
            "class"), status
        shown = browser.driver.execute_script(f"return {SHOWN}")
        assert any(f"started on {DEVICE}" in text for _level, text in shown), shown
        assert any(level == "error" and "viewer:***@127.0.0.1" in text for level, text in shown), shown
        assert SECRET not in browser.driver.execute_script("return document.body.innerText")

        # the levels are the API's (LogLine.level); "error" keeps the errors only
        wait_js(browser, "return document.querySelector('[data-testid=logs-level] option[value=error]') !== null", 10)
        fill(browser, "logs-level", "error")
        wait_js(browser, f"const s = {SHOWN}; return s.length > 0 && s.every(([l]) => l === 'error')", 15)
        fill(browser, "logs-level", "")
        wait_js(browser, f"return {SHOWN}.some(([l]) => l === 'info')", 15)

        # follow: a line the agent logs from now on appears without a reload
        wait_for(browser, "[data-testid=logs-follow]").click()
        wait_text(browser, "[data-testid=logs-status]", lambda t: t.endswith(tuple("0123456789")), 30)
        sent = dashboard.clients["operator"].restart(DEVICE, "main")
        done = f"command {sent['command_id']} (restart_pipeline) done"
        wait_js(browser, f"return {SHOWN}.some(([, t]) => t.includes(arguments[0]))", 60, done)

        # the doctor, on the device: its findings, as `edgeinfer doctor --json` finds them on this machine
        local = json.loads(subprocess.run(edgeinfer_cmd("doctor", "--json"), capture_output=True, text=True,
                                          timeout=120, env=env_with_repo()).stdout)
        wait_for(browser, "[data-testid=doctor-run]").click()
        text = wait_text(browser, "[data-testid=doctor-status]", lambda t: "found" in t or "failed" in t
                         or "no answer" in t, 120)
        assert text.startswith("no problems found" if not local["problems"] else f"{local['problems']} problem"), text
        checks = browser.driver.execute_script(
            "return Array.from(document.querySelectorAll('[data-testid=doctor-report] tr[data-check]'))"
            ".map(tr => tr.dataset.check)")
        assert checks == [f["check"] for f in local["findings"]]
        wait_for(browser, "[data-testid=logs-follow]").click()  # stop following
        assert not browser.errors(), browser.errors()


def test_a_viewer_gets_no_logs_card(page):
    dashboard, _agent = page
    viewer = dashboard.clients["viewer"]
    for read in (viewer.logs, viewer.doctor):  # and the API refuses it the lines and the report
        with pytest.raises(FleetRequestError) as refused:
            read(DEVICE)
        assert refused.value.status == 403
    with shared_browser(DESKTOP) as browser:
        open_device(browser, dashboard, "viewer")
        settle(1.0)
        for testid in ("logs-card", "log-lines", "logs-follow", "doctor-run"):
            assert not browser.driver.find_elements("css selector", f"[data-testid={testid}]"), testid
        assert not browser.errors(), browser.errors()


def test_an_offline_device_is_said_plainly_with_the_lines_received_before(page):
    dashboard, agent = page
    agent.kill()
    manager = dashboard.manager
    assert wait_until(lambda: not manager.db.get_device(DEVICE)["online"], 30, 0.2)
    stored = len(manager.db.diagnosis.lines(DEVICE, limit=1000))
    with shared_browser(DESKTOP) as browser:
        open_device(browser, dashboard, "operator")
        text = wait_text(browser, "[data-testid=logs-status]", lambda t: "offline" in t, 15)
        assert text.startswith(f"{DEVICE} is offline since ") and text.endswith(
            f"; showing the {stored} lines received before"), text
        assert browser.driver.execute_script(f"return {SHOWN}.length") == stored
        wait_for(browser, "[data-testid=logs-refresh]").click()  # asking again changes nothing: it is offline
        settle(1.0)
        assert wait_text(browser, "[data-testid=logs-status]", lambda t: "offline" in t, 15) == text
        wait_for(browser, "[data-testid=doctor-run]").click()
        text = wait_text(browser, "[data-testid=doctor-status]", lambda t: "offline" in t, 15)
        assert text.startswith(f"{DEVICE} is offline since "), text
        assert not browser.errors(), browser.errors()

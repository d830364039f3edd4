"""The fleet dashboard under test: a FleetManager with its managed Mosquitto, a fleet of simulated agents
enrolled through the API and reporting in the background, API tokens for each role; and the steps a person
takes in the page (sign in, go to a route), written once for tests/fleet/test_dashboard.py.

The page's hooks (``data-testid``, ``data-device-id``, ``data-state``, ``data-col``, ``data-sort``) are its
contract with these tests."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .browser import Browser, wait_for, wait_js, wait_text
from .fleet import simulated_fleet

WEB = Path(__file__).resolve().parents[2] / "edgeinfer" / "fleet" / "web"


@dataclass
class Dashboard:
    manager: Any  # edgeinfer.fleet.manager.FleetManager
    simulation: Any  # edgeinfer.tools.simulate.Simulation
    device_ids: list[str]
    tokens: dict[str, str]  # role -> token
    names: dict[str, str]  # role -> the token's name (what the audit log records)
    clients: dict[str, Any] = field(default_factory=dict)  # role -> FleetClient

    @property
    def url(self) -> str:
        return f"{self.manager.http.url}/"


@contextlib.contextmanager
def running_dashboard(data_dir: Path, devices: int = 50, interval_s: float = 0.5,
                      update_delay_s: tuple[float, float] = (0.2, 0.5),
                      online_timeout: float = 30.0) -> Iterator[Dashboard]:
    """A manager (managed broker, HTTP on a free port), ``devices`` enrolled in one call and simulated in the
    background; yielded once every one of them is online in the manager's database with telemetry.
    ``update_delay_s`` spaces each device's update events (downloading … active) so that a rollout lasts long
    enough (seconds) for a page to show its waves progressing."""
    from edgeinfer.fleet.client import FleetClient

    with simulated_fleet(data_dir, devices=devices, interval_s=interval_s, fleet="dash", ramp_s=None,
                         update_delay_s=update_delay_s, online_timeout=online_timeout) as fleet:
        manager, admin = fleet.manager, fleet.admin
        names = {"admin": admin.whoami()["name"], "operator": "dash-operator", "viewer": "dash-viewer"}
        tokens = {"admin": manager.admin_token,
                  **{role: admin.create_token(names[role], role)["token"] for role in ("operator", "viewer")}}
        clients = {role: FleetClient(manager.http.url, token=token) for role, token in tokens.items()}
        yield Dashboard(manager, fleet.simulation, fleet.ids, tokens, names, clients)


# ---------------------------------------------------------------------------------- in the page
def go(browser: Browser, dashboard: Dashboard, route: str) -> None:
    """Show ``route`` (``#/devices``, …): a hash change inside the loaded page, or a load if it is elsewhere."""
    driver = browser.driver
    if driver.current_url.startswith(dashboard.url):
        driver.execute_script("location.hash = arguments[0]", route)
    else:
        driver.get(dashboard.url + route)
    wait_js(driver, "return location.hash === arguments[0]", 5, route)


def sign_out(browser: Browser, dashboard: Dashboard) -> None:
    """Forget whoever was signed in (cookies and both storages), then load the page afresh."""
    driver = browser.driver
    # the page left first, its origin's storages cleared after (DevTools): cleared under the dashboard, a request
    # one of its pages was about to make would go out without a token (a 401 in the console)
    driver.get("about:blank")
    origin = "/".join(dashboard.url.split("/")[:3])
    driver.execute_cdp_cmd("Storage.clearDataForOrigin", {"origin": origin,
                                                          "storageTypes": "local_storage,session_storage,cookies"})
    driver.get(dashboard.url)


def submit_token(browser: Browser, token: str) -> None:
    """Type ``token`` into the sign-in form and submit it."""
    field_ = wait_for(browser, "[data-testid=token-input]")
    field_.clear()
    field_.send_keys(token)
    wait_for(browser, "[data-testid=signin-submit]").click()


def sign_in(browser: Browser, dashboard: Dashboard, role: str, timeout: float = 15.0) -> None:
    """Sign in afresh with the ``role``'s token; returns once the page says who and its change feed is up."""
    sign_out(browser, dashboard)
    wait_for(browser, "[data-testid=signin]", timeout)
    submit_token(browser, dashboard.tokens[role])
    wait_text(browser, "[data-testid=whoami]", lambda text: f"({role})" in text, timeout)
    wait_live(browser, timeout)


def wait_live(browser: Browser, timeout: float = 15.0) -> None:
    """Until the page's change feed says it is connected (``document.body.dataset.changes``)."""
    wait_js(browser, "return document.body.dataset.changes === 'connected'", timeout)


def rows(browser: Browser) -> list[dict]:
    """The devices table as shown, in one read: [{id, fps, version, shown}] per ``tr[data-device-id]``."""
    return browser.driver.execute_script("""
        return Array.from(document.querySelectorAll('tr[data-device-id]')).map(tr => {
          const cell = col => {
            const td = tr.querySelector(`td[data-col=${col}]`);
            return td ? td.innerText.trim() : null;
          };
          return {id: tr.dataset.deviceId, fps: cell('fps'), version: cell('version'),
                  shown: tr.offsetParent !== null && getComputedStyle(tr).display !== 'none'};
        });""")


def fill(browser: Browser, testid: str, value: str) -> None:
    """Set a form field by its ``data-testid`` as a person would: choose an option, pick a file, or type."""
    from selenium.webdriver.common.keys import Keys
    from selenium.webdriver.support.ui import Select

    element = wait_for(browser, f"[data-testid={testid}]", visible=False)
    if element.tag_name.lower() == "select":
        select = Select(element)
        try:
            select.select_by_value(value)
        except Exception:  # the option's label may say it rather than its value
            select.select_by_visible_text(value)
    elif (element.get_attribute("type") or "").lower() == "file":
        element.send_keys(value)
    else:
        element.send_keys(Keys.CONTROL, "a")
        element.send_keys(Keys.DELETE)
        element.send_keys(value)


def settle(seconds: float = 0.5) -> None:
    """A pause for the page to render after a route change, before asserting that something is absent."""
    time.sleep(seconds)

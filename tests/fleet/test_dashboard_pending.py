"""The dashboard's Pending devices page in a real headless Chromium, against a real manager with its fleet CA
(``--tls``: the page over HTTPS), its managed Mosquitto and a real PostgreSQL: two devices ask to join with a
manual-approval claim; an admin sees each with the hardware facts it sent, approves one — whose next request gets
its certificate — and rejects the other, whose next request is refused; the page is an admin's only."""

from __future__ import annotations

import pytest
from cryptography import x509
from support.browser import DESKTOP, Browser, wait_for, wait_js, wait_text
from support.dashboard import Dashboard, go, settle, sign_in
from support.ports import free_port
from support.provisioning import HARDWARE, new_key, provision

from edgeinfer.fleet.client import FleetClient
from edgeinfer.fleet.manager import FleetManager, FleetSettings

ROWS = ("Array.from(document.querySelectorAll('[data-testid=pending-table] tr[data-device-id]'))"
        ".map(tr => [tr.dataset.deviceId, tr.innerText])")


@pytest.fixture(scope="module")
def dashboard(tmp_path_factory, postgres):
    folder = tmp_path_factory.mktemp("dash-pending")
    settings = FleetSettings(broker=None, broker_port=free_port(), http="127.0.0.1:0", data_dir=folder / "fleet",
                             db_url=postgres.create_database(), tls=True)
    with FleetManager(settings) as manager:
        ca = manager.access.ca.ca_file
        admin = FleetClient(manager.http.url, token=manager.admin_token, ca=ca)
        names = {"admin": admin.whoami()["name"], "operator": "pending-operator"}
        tokens = {"admin": manager.admin_token, "operator": admin.create_token(names["operator"], "operator")["token"]}
        clients = {role: FleetClient(manager.http.url, token=token, ca=ca) for role, token in tokens.items()}
        yield Dashboard(manager, None, [], tokens, names, clients)


def test_an_admin_approves_one_pending_device_and_rejects_another_in_the_page(dashboard):
    manager = dashboard.manager
    claim = dashboard.clients["admin"].create_claim({"groups": ["lobby"], "approve": "manual"})["token"]
    keys = {"one": new_key(), "two": new_key()}
    assert provision(manager, claim, "pi-one", keys["one"])[0] == 202
    assert provision(manager, claim, "pi-two", keys["two"], hardware={"model": "Raspberry Pi 5"})[0] == 202
    with Browser(DESKTOP, accept_insecure_certs=True) as browser:
        sign_in(browser, dashboard, "admin")
        wait_for(browser, "nav [data-nav=pending]")  # an admin's page: in the menu
        go(browser, dashboard, "#/pending")
        shown = wait_js(browser, f"const r = {ROWS}; return r.length === 2 && r", 15)
        assert [device for device, _ in shown] == ["cam-pi-one", "cam-pi-two"]
        assert all(word in shown[0][1] for word in ("pi-one", HARDWARE["model"], HARDWARE["mac"], "lobby", "127.0.0.1"))
        assert "Raspberry Pi 5" in shown[1][1]

        wait_for(browser, "tr[data-device-id=cam-pi-one] [data-testid=approve]").click()
        wait_text(browser, "#confirm-message", lambda t: "cam-pi-one" in t and "lobby" in t, 5)
        wait_for(browser, "[data-testid=confirm-ok]").click()
        wait_text(browser, "[data-testid=pending-status]", "Approved cam-pi-one.", 15)
        wait_js(browser, f"const r = {ROWS}; return r.length === 1 && r[0][0] === 'cam-pi-two'", 15)

        wait_for(browser, "tr[data-device-id=cam-pi-two] [data-testid=reject]").click()
        wait_for(browser, "[data-testid=confirm-ok]").click()
        wait_text(browser, "[data-testid=pending-status]", "Rejected cam-pi-two.", 15)
        wait_js(browser, f"return {ROWS}.length === 0", 15)
        assert not browser.errors(), browser.errors()

        # an operator has no such page: not in the menu, and the API refuses it
        sign_in(browser, dashboard, "operator")
        settle()
        assert not browser.driver.find_element("css selector", "nav [data-nav=pending]").is_displayed()

    status, body, _ = provision(manager, claim, "pi-one", keys["one"])
    assert status == 200 and body["device_id"] == "cam-pi-one"
    assert x509.load_pem_x509_certificate(body["certificate"].encode()).public_key() == keys["one"].public_key()
    status, body, _ = provision(manager, claim, "pi-two", keys["two"])
    assert status == 403 and "rejected" in body["error"]
    audit = {(e["action"], e["target"], e["actor"]) for e in dashboard.clients["admin"].audit(20)}
    assert {("provision.approve", "cam-pi-one", dashboard.names["admin"]),
            ("provision.reject", "cam-pi-two", dashboard.names["admin"])} <= audit

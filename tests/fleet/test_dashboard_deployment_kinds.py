"""The dashboard's deployments say their kind: a real Chromium on the page of a manager with simulated devices, an
agent bundle and a model deployed through the API; the list has a Kind column and the deployment's page its kind,
kept up to date by the live stream."""

from __future__ import annotations

import zipfile
from pathlib import Path

import pytest
from support.browser import DESKTOP, shared_browser, wait_for, wait_js, wait_text
from support.dashboard import go, running_dashboard, sign_in

from edgeinfer.fleet.api.schemas import DeploymentSpec
from edgeinfer.updates.bundle import pack


@pytest.fixture(scope="module")
def dash(tmp_path_factory):
    with running_dashboard(tmp_path_factory.mktemp("dashboard"), devices=3, interval_s=0.5) as dashboard:
        yield dashboard


def agent_bundle(folder: Path) -> Path:
    wheel = folder / "edgeinfer-7.1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr("edgeinfer-7.1.0.dist-info/METADATA", "Name: edgeinfer\nVersion: 7.1.0\n")
    pack(wheel, folder / "bundle.tar")
    return folder / "bundle.tar"


def test_the_deployments_list_and_page_say_each_deployment_s_kind(dash, tmp_path):
    admin = dash.clients["admin"]
    bundle = admin.upload(agent_bundle(tmp_path))
    model_file = tmp_path / "m.tflite"
    model_file.write_bytes(b"TFL3" + b"\0" * 60)
    model = admin.upload(model_file)
    with shared_browser(DESKTOP) as browser:
        sign_in(browser, dash, "viewer")
        go(browser, dash, "#/deployments")
        wait_for(browser, "[data-testid=deployments]", 15)
        agent = admin.create_deployment(DeploymentSpec(sha256=bundle["sha256"], kind="agent", version=7_001_000,
                                                       model_name="edgeinfer-7.1.0", devices=[dash.device_ids[0]]))
        made = admin.create_deployment(DeploymentSpec(sha256=model["sha256"], model_name="m.tflite", version=5,
                                                      devices=[dash.device_ids[1]]))
        cells = """return Object.fromEntries(Array.from(document.querySelectorAll('tr[data-deployment-id]'))
                     .map(tr => [tr.dataset.deploymentId, tr.querySelector('[data-col=kind]').innerText.trim()]));"""
        shown = wait_js(browser, f"const k = (() => {{ {cells} }})(); return Object.keys(k).length >= 2 && k;", 20)
        assert shown == {agent["deployment_id"]: "agent", made["deployment_id"]: "model"}  # live, no reload
        headers = browser.driver.execute_script(
            "return Array.from(document.querySelectorAll('[data-testid=deployments] thead th')).map(t => t.innerText)")
        assert "Kind" in headers
        go(browser, dash, f"#/deployments/{agent['deployment_id']}")
        text = wait_text(browser, "[data-testid=deployment] dl.facts", lambda t: "edgeinfer-7.1.0" in t, 15)
        assert "Kind" in text and "agent" in text and "Agent" in text
        assert browser.errors() == []

"""The dashboard's Configuration tab (docs/fleet.md, *The dashboard's Configuration tab*) in a real headless Chromium,
against a real manager with its Mosquitto, three simulated devices in group ``lobby`` that take configurations, and
one real agent process running a real detector on a real clip. An operator edits the group's pipeline in the form
generated from the schema, sees the diff (the camera's password masked), saves, and watches every device of the group
come in step; a value the schema refuses is shown at its key in agent --check's words, in the form and in YAML, and
Save is not offered; a save on a revision someone saved since is a 409 that offers to reload; the history shows each
revision's author, message and diff, and a roll back shows its diff first; a viewer gets no edit control; a
configuration the real device cannot run (its model is missing) is refused by the device, and the page shows the
device's own reason — on the layer's page, the device page, and the overview's count of devices out of step.
Screenshots: docs/img/dashboard-config-desktop.png (the form with its diff) and
dashboard-config-history-desktop.png (the history, a revision's diff open)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from support import scenes
from support.agent import AgentProcess, write_config
from support.browser import DESKTOP, PHONE, Browser, screenshot, shared_browser, text_of, wait_for, wait_js, wait_text
from support.dashboard import Dashboard, go, settle, sign_in
from support.fleet import simulated_fleet
from support.pipeline import ULTRAFACE
from support.processes import wait_until

from edgeinfer.fleet.client import FleetClient
from edgeinfer.fleet.config_layers import layer_problems

pytestmark = [pytest.mark.timeout(600)]

DOCS_IMG = Path(__file__).parents[2] / "docs" / "img"
GROUP = "lobby"
REAL = "cam-real"
SECRET = "Secr3tPass"
CAMERA = f"rtsp://viewer:{SECRET}@cam.local/1"
PIPELINE = {"name": "main", "model": "/models/detector.tflite", "source": CAMERA, "task": "detect", "max_fps": 10}
LINE = "door=0.5,0.0,0.5,1.0"
FAST = {"canary_pct": 34, "canary_analysis": False, "device_timeout_s": 120}
MISSING = "/nonexistent/models/missing-detector.onnx"


@pytest.fixture(scope="module")
def page(tmp_path_factory):
    """The manager, three simulated devices of group lobby in step with its first revision, and a real agent (group
    yard) running its agent.yaml's pipeline."""
    folder = tmp_path_factory.mktemp("dash-config")
    clip = scenes.make_scene_clip(folder / "scene.avi")
    with simulated_fleet(folder / "fleet", devices=3, groups=(GROUP,), fleet="dash", interval_s=0.5,
                         update_delay_s=(0.2, 0.5)) as fleet:
        manager, admin = fleet.manager, fleet.admin
        names = {"admin": admin.whoami()["name"], "operator": "cfg-operator", "viewer": "cfg-viewer"}
        tokens = {"admin": manager.admin_token,
                  **{role: admin.create_token(names[role], role)["token"] for role in ("operator", "viewer")}}
        clients = {role: FleetClient(manager.http.url, token=token) for role, token in tokens.items()}
        [device] = admin.enroll_many([REAL], "dash")
        config = write_config(
            folder / "agent.yaml", device_id=REAL, fleet="dash", groups=["yard"], broker=manager.broker_url,
            username=device["username"], password=device["password"], data_dir=str(folder / "data"),
            telemetry_interval_s=0.5, profile="none", reconnect_min_s=0.1, reconnect_max_s=1.0,
            update_public_key=manager.key.public_key_b64(),
            pipelines=[{"name": "main", "model": str(ULTRAFACE), "source": str(clip), "task": "detect", "loop": True,
                        "max_fps": 1, "threads": 1}])  # 1 fps: it only has to be running, for the whole module
        with AgentProcess(config, folder / "agent.log") as agent:
            first = admin.save_config("group", GROUP, {"pipelines": [PIPELINE]}, revision=0, message="first",
                                      rollout=FAST)
            assert first["deployment"] is not None
            assert wait_until(lambda: admin.config_devices(group=GROUP)["counts"]["in_step"] == 3, 60, 0.2)

            def running() -> bool:
                row = manager.db.get_device(REAL) or {}
                return row.get("online") and [p.get("status") for p in (row.get("state") or {}).get(
                    "pipelines") or []] == ["running"]

            assert wait_until(running, 120, 0.2), agent.output()[-3000:]
            yield Dashboard(manager, fleet.simulation, [*fleet.ids, REAL], tokens, names, clients), clip, agent


@pytest.fixture(scope="module")
def chromium():
    with shared_browser(DESKTOP) as shared:
        yield shared


@pytest.fixture
def browser(chromium):
    """The module's Chromium as a new one for each test (Browser.fresh: the pages before left, their storages cleared,
    a console of its own): one start, not eight."""
    return chromium.fresh(DESKTOP)


# ---------------------------------------------------------------------------------- in the page
def field(browser: Browser, path: str, timeout: float = 10):
    """The input of a form field by the key the manager names it by (``pipelines[0].max_fps``)."""
    return wait_for(browser, f'[data-field="{path}"] > .field-input [data-path="{path}"]', timeout)


def type_into(element, text: str) -> None:
    from selenium.webdriver.common.keys import Keys

    element.send_keys(Keys.CONTROL, "a")
    element.send_keys(Keys.DELETE)
    element.send_keys(text)


def click(browser: Browser, css: str, timeout: float = 10) -> None:
    """Click the element, scrolled to the middle of the window first (the header is sticky)."""
    element = wait_for(browser, css, timeout)
    browser.driver.execute_script("arguments[0].scrollIntoView({block: 'center'})", element)
    element.click()


def choose(element, value: str) -> None:
    from selenium.webdriver.support.ui import Select

    element.parent.execute_script("arguments[0].scrollIntoView({block: 'center'})", element)
    Select(element).select_by_value(value)


def add_key(browser: Browser, object_path: str, key: str) -> None:
    """Add ``key`` to the object at ``object_path`` ("" for the layer, pipelines[0] for a pipeline)."""
    choose(wait_for(browser, f'select[data-testid=cfg-add][data-path="{object_path}"]'), key)


def diff_rows(browser: Browser, testid: str = "cfg-diff") -> dict[str, list]:
    """The diff shown: {path: [op, before, after]}."""
    return browser.driver.execute_script(f"""
        return Object.fromEntries(Array.from(document.querySelectorAll('[data-testid={testid}] tr[data-path]'))
          .map(tr => [tr.dataset.path, [tr.dataset.op, tr.querySelector('.before').innerText,
                                        tr.querySelector('.after').innerText]]));""")


def checked(browser: Browser) -> None:
    """Until the manager's judgement of the edit shown is in (Save is offered, or refused with a reason)."""
    wait_js(browser, "const b = document.querySelector('[data-testid=cfg-save]'); "
                     "return b && b.title !== 'checking…'", 10)


def verdicts(browser: Browser) -> dict[str, str]:
    return browser.driver.execute_script("""
        return Object.fromEntries(Array.from(document.querySelectorAll('[data-testid=cfg-verdicts] tr[data-device-id]'))
          .map(tr => [tr.dataset.deviceId, tr.dataset.status]));""")


def open_layer(browser: Browser, dashboard: Dashboard, role: str, scope: str, name: str) -> None:
    sign_in(browser, dashboard, role)
    go(browser, dashboard, f"#/config/{scope}/{name}")
    wait_for(browser, "[data-testid=config-layer]", 15)
    wait_js(browser, "return document.querySelector('[data-testid=cfg-verdicts] tr[data-device-id]') !== null", 15)


def group_in_step(dashboard: Dashboard) -> bool:
    return dashboard.clients["admin"].config_devices(group=GROUP)["counts"]["in_step"] == 3


# ---------------------------------------------------------------------------------- the tests
def test_an_operator_edits_the_groups_pipeline_sees_the_diff_saves_and_the_devices_come_in_step(page, browser):
    dashboard, _clip, _agent = page
    admin = dashboard.clients["admin"]
    before = admin.config_layer("group", GROUP)
    open_layer(browser, dashboard, "operator", "group", GROUP)
    assert field(browser, "pipelines[0].max_fps").get_attribute("value") == "10"
    source = field(browser, "pipelines[0].source").get_attribute("value")
    assert source == "rtsp://viewer:***@cam.local/1", source  # the password never reaches the page
    # the form is the schema's: a choice is a select of its options, a bound is the input's, the schema's words
    task = field(browser, "pipelines[0].task")
    assert task.tag_name == "select" and [o.get_attribute("value") for o in task.find_elements(
        "css selector", "option")] == ['"classify"', '"detect"', '"pose"', '"segment"', '"obb"']
    wait_text(browser, "[data-testid=cfg-changes]", "no change")
    assert wait_for(browser, "[data-testid=cfg-save]").get_attribute("disabled") is not None

    type_into(field(browser, "pipelines[0].max_fps"), "5")
    add_key(browser, "pipelines[0]", "lines")
    type_into(field(browser, "pipelines[0].lines"), LINE)
    expected = {"pipelines[main].max_fps": ["change", "10", "5"], "pipelines[main].lines": ["add", "—", f'["{LINE}"]']}
    assert wait_until(lambda: diff_rows(browser) == expected, 10), diff_rows(browser)
    type_into(wait_for(browser, "[data-testid=cfg-message]"), "slower, and count the door")
    click(browser, "[data-testid=cfg-rollout] summary")
    choose(field(browser, "canary_analysis"), "false")
    type_into(field(browser, "canary_pct"), "34")
    checked(browser)
    assert SECRET not in browser.driver.execute_script("return document.body.innerText")
    # the form and the diff beside it, under the sticky header
    browser.driver.execute_script("const top = document.querySelector('.config-columns').getBoundingClientRect().top;"
                                  " window.scrollTo(0, window.scrollY + top - 64)")
    screenshot(browser, DOCS_IMG / "dashboard-config-desktop.png")

    assert wait_for(browser, "[data-testid=cfg-save]").get_attribute("disabled") is None
    click(browser, "[data-testid=cfg-save]")
    wait_text(browser, "[data-testid=cfg-result]", lambda t: t.startswith(f"Saved: revision {before['revision'] + 1}"),
              15)
    link = wait_for(browser, "[data-testid=cfg-deployment-link]")
    deployment_id = link.get_attribute("href").rpartition("/")[2]
    # the rollout's waves and each device's state, live; then each device's verdict: in step, applied = desired
    wait_js(browser, "return document.querySelectorAll('[data-testid=cfg-rollout-progress] li[data-device-id]')"
                     ".length === 3", 15)
    wait_text(browser, "[data-testid=cfg-rollout-status]", "succeeded", 60)
    wait_js(browser, "return Array.from(document.querySelectorAll('[data-testid=cfg-rollout-progress] "
                     "li[data-device-id]')).every(li => li.dataset.state === 'active')", 10)
    wait_js(browser, "const rows = Array.from(document.querySelectorAll("
                     "'[data-testid=cfg-verdicts] tr[data-device-id]')); return rows.length === 3 && "
                     "rows.every(tr => tr.dataset.status === 'in_step' && "
                     "tr.querySelector('[data-col=applied]').innerText.includes('= desired'))", 30)
    saved = admin.config_layer("group", GROUP)
    assert saved["revision"] == before["revision"] + 1 and saved["author"] == dashboard.names["operator"]
    assert saved["message"] == "slower, and count the door"
    assert saved["document"]["pipelines"] == [{**PIPELINE, "source": "rtsp://viewer:***@cam.local/1", "max_fps": 5,
                                               "lines": [LINE]}]
    deployment = admin.deployment(deployment_id)
    assert deployment["kind"] == "config" and deployment["options"]["canary_analysis"]["enabled"] is False
    assert group_in_step(dashboard)
    # the new revision is what the page edits now: nothing to save
    wait_text(browser, "[data-testid=cfg-revision]", f"r{saved['revision']}")
    wait_text(browser, "[data-testid=cfg-changes]", "no change")
    assert not browser.errors(), browser.errors()


def test_a_value_the_schema_refuses_is_shown_at_its_key_in_agent_checks_words_and_save_is_not_offered(page, browser):
    dashboard, _clip, _agent = page
    open_layer(browser, dashboard, "operator", "group", GROUP)
    add_key(browser, "pipelines[0]", "score_threshold")
    type_into(field(browser, "pipelines[0].score_threshold"), "2")
    [words] = layer_problems({"pipelines": [{"score_threshold": 2}]})  # what a save would answer (409)
    assert words.startswith("pipelines[0].score_threshold: ")
    shown = wait_text(browser, '[data-field="pipelines[0].score_threshold"] .field-problem', words, 10)
    assert shown == words
    save = wait_for(browser, "[data-testid=cfg-save]")
    assert save.get_attribute("disabled") is not None and save.get_attribute("title") == "fix the problems first"
    hint = text_of(browser, '[data-field="pipelines[0].score_threshold"] .field-hint')
    assert "≥ 0" in hint and "≤ 1" in hint and "default 0.5" in hint, hint  # the schema's bounds and default

    # a value the schema words itself (errorMessage): its words, at its key
    add_key(browser, "pipelines[0]", "size")
    type_into(field(browser, "pipelines[0].size"), "big")
    [size_words] = [p for p in layer_problems({"pipelines": [{"size": "big"}]})]
    wait_text(browser, '[data-field="pipelines[0].size"] .field-problem', size_words, 10)
    assert "WIDTHxHEIGHT" in size_words

    # the same in YAML: the text is read by the manager, its problems named by key
    click(browser, "[data-testid=cfg-mode-yaml]")
    text = wait_for(browser, "[data-testid=cfg-text]")
    wait_js(browser, "return document.querySelector('[data-testid=cfg-text]').value.includes('score_threshold: 2')", 10)
    type_into(text, "pipelines:\n- name: main\n  max_fps: -1\n  mdel: /m/x.tflite\n")
    expected = layer_problems({"pipelines": [{"name": "main", "max_fps": -1, "mdel": "/m/x.tflite"}]})
    problems = "return Array.from(document.querySelectorAll('[data-testid=cfg-problems] li')).map(li => li.innerText)"
    assert wait_until(lambda: browser.driver.execute_script(problems) == expected, 10), \
        browser.driver.execute_script(problems)
    assert any("mdel: unknown key" in p for p in expected) and any("max_fps" in p for p in expected)
    assert wait_for(browser, "[data-testid=cfg-save]").get_attribute("disabled") is not None
    type_into(text, "pipelines:\n- name: main\n  max_fps: [\n")  # not YAML at all: where it breaks
    wait_text(browser, "[data-testid=cfg-problems]", lambda t: t.startswith("(text): not valid YAML: line "), 10)
    # fixed: offered again
    type_into(text, "pipelines:\n- name: main\n  max_fps: 4\n")
    wait_js(browser, "return document.querySelector('[data-testid=cfg-save]').disabled === false", 10)
    assert diff_rows(browser)["pipelines[main].max_fps"] == ["change", "5", "4"]
    assert not browser.errors(), browser.errors()


def test_a_save_on_a_revision_someone_saved_since_is_refused_and_the_page_offers_to_reload(page, browser):
    dashboard, _clip, _agent = page
    admin = dashboard.clients["admin"]
    open_layer(browser, dashboard, "operator", "group", GROUP)
    read = admin.config_layer("group", GROUP)
    type_into(field(browser, "pipelines[0].max_fps"), "7")
    wait_js(browser, "return document.querySelector('[data-testid=cfg-save]').disabled === false", 10)
    # another operator saves first
    other = admin.save_config("group", GROUP, {**read["document"], "telemetry_interval_s": 2.0},
                              revision=read["revision"], message="someone else", apply=False)
    with browser.expecting(r"\b409\b"):
        click(browser, "[data-testid=cfg-save]")
        conflict = wait_text(browser, "[data-testid=cfg-conflict]", lambda t: "Not saved" in t, 10)
    revision = other["layer"]["revision"]
    assert f"{dashboard.names['admin']} saved revision {revision}" in conflict and "someone else" in conflict
    assert f"after you read revision {read['revision']}" in conflict
    assert admin.config_layer("group", GROUP)["revision"] == revision  # nothing else stored
    click(browser, "[data-testid=cfg-reload]")
    wait_text(browser, "[data-testid=cfg-revision]", f"r{revision}", 10)
    assert field(browser, "telemetry_interval_s").get_attribute("value") == "2"
    assert field(browser, "pipelines[0].max_fps").get_attribute("value") == "5"  # the edit is dropped
    # the draft it left: rolled out from the page
    wait_for(browser, "[data-testid=cfg-draft-banner]")
    click(browser, "[data-testid=cfg-rollout] summary")
    choose(field(browser, "canary_analysis"), "false")
    click(browser, "[data-testid=cfg-apply]")
    wait_text(browser, "[data-testid=cfg-result]", lambda t: t.startswith(f"Rolled out: revision {revision}"), 15)
    wait_text(browser, "[data-testid=cfg-rollout-status]", "succeeded", 60)
    assert wait_until(lambda: group_in_step(dashboard), 30, 0.3)
    assert not browser.errors(), browser.errors()


def test_the_history_shows_each_revision_and_a_roll_back_shows_its_diff_first(page, browser):
    dashboard, _clip, _agent = page
    admin = dashboard.clients["admin"]
    history = admin.config_history("group", GROUP)
    newest = history[0]["revision"]
    open_layer(browser, dashboard, "operator", "group", GROUP)
    wait_js(browser, "return document.querySelectorAll('[data-testid=cfg-history-list] > li').length === arguments[0]",
            10, len(history))
    shown = browser.driver.execute_script("""
        return Array.from(document.querySelectorAll('[data-testid=cfg-history-list] > li')).map(li => ({
          revision: Number(li.dataset.revision), text: li.innerText,
          paths: Array.from(li.querySelectorAll('tr[data-path]')).map(tr => tr.dataset.path)}));""")
    for row, revision in zip(shown, history, strict=True):
        assert row["revision"] == revision["revision"]
        assert revision["author"] in row["text"] and (revision["message"] or "(no message)") in row["text"]
        assert row["paths"] == [d["path"] for d in revision["diff"]]
    # every revision but the newest can be rolled back to; the first one's diff is shown before anything is sent
    rollbacks = browser.driver.execute_script(
        "return Array.from(document.querySelectorAll('[data-testid=cfg-rollback]'))"
        ".map(b => Number(b.dataset.revision))")
    assert rollbacks == [r["revision"] for r in history[1:]]
    click(browser, '[data-testid=cfg-history-list] > li[data-revision="2"] details summary')
    screenshot(browser, DOCS_IMG / "dashboard-config-history-desktop.png")
    click(browser, '[data-testid=cfg-rollback][data-revision="1"]')
    wait_for(browser, "[data-testid=cfg-rollback-preview]")
    preview = diff_rows(browser, "cfg-rollback-diff")
    assert preview["pipelines[main].max_fps"] == ["change", "5", "10"]
    assert preview["pipelines[main].lines"][0] == "remove" and preview["telemetry_interval_s"][0] == "remove"
    assert admin.config_layer("group", GROUP)["revision"] == newest  # nothing sent yet
    click(browser, "[data-testid=cfg-rollout] summary")
    choose(field(browser, "canary_analysis"), "false")
    click(browser, "[data-testid=cfg-rollback-confirm]")
    wait_text(browser, "[data-testid=cfg-result]", lambda t: t.startswith(f"Rolled back to r1: revision {newest + 1}"),
              15)
    back = admin.config_layer("group", GROUP)
    assert back["revision"] == newest + 1 and back["restored_from"] == 1
    assert back["message"] == "roll back to revision 1"
    assert back["document"]["pipelines"][0]["max_fps"] == 10
    wait_text(browser, "[data-testid=cfg-rollout-status]", "succeeded", 60)
    assert wait_until(lambda: group_in_step(dashboard), 30, 0.3)
    wait_js(browser, "return document.querySelector('[data-testid=cfg-history-list] > li').dataset.revision === "
                     "String(arguments[0])", 10, newest + 1)
    assert "roll back to r1" in text_of(browser, "[data-testid=cfg-history-list] > li")
    assert not browser.errors(), browser.errors()


def test_a_viewer_reads_the_configuration_and_gets_no_edit_control(page, browser):
    dashboard, _clip, _agent = page
    open_layer(browser, dashboard, "viewer", "group", GROUP)
    field(browser, "pipelines[0].max_fps")
    settle(1.0)
    for testid in ("cfg-save", "cfg-save-draft", "cfg-message", "cfg-add", "cfg-unset", "cfg-add-item",
                   "cfg-remove-item", "cfg-rollback", "cfg-apply", "cfg-rollout"):
        assert not browser.driver.find_elements("css selector", f"[data-testid={testid}]"), testid
    assert browser.driver.execute_script(
        "return Array.from(document.querySelectorAll('[data-testid=cfg-form] [data-path]'))"
        ".every(e => e.disabled || e.tagName === 'SPAN')")
    assert len(verdicts(browser)) == 3 and set(verdicts(browser).values()) == {"in_step"}
    # the text is there to read, not to change
    click(browser, "[data-testid=cfg-mode-yaml]")
    wait_js(browser, "const t = document.querySelector('[data-testid=cfg-text]'); return !t.hidden && t.readOnly && "
                     "t.value.includes('max_fps: 10')", 10)
    assert not browser.errors(), browser.errors()


def test_a_configuration_the_device_cannot_run_is_refused_and_the_page_shows_the_devices_reason(page, browser):
    dashboard, clip, agent = page
    admin = dashboard.clients["admin"]
    open_layer(browser, dashboard, "operator", "device", REAL)
    # where each key of its effective document comes from: nothing but its agent.yaml so far
    origins = browser.driver.execute_script(
        "return Array.from(document.querySelectorAll('[data-testid=cfg-origins] tr[data-path]'))"
        ".map(tr => [tr.dataset.path, tr.dataset.origin])")
    assert origins == [["pipelines", "agent.yaml"], ["telemetry_interval_s", "agent.yaml"]]
    # its whole pipeline in YAML, with a model that is not on the device
    click(browser, "[data-testid=cfg-mode-yaml]")
    text = wait_for(browser, "[data-testid=cfg-text]")
    type_into(text, f"pipelines:\n- name: main\n  model: {MISSING}\n  source: {clip}\n  task: detect\n  loop: true\n")
    wait_js(browser, "return document.querySelectorAll('[data-testid=cfg-diff] tr[data-path]').length === 5", 10)
    wait_js(browser, "return document.querySelector('[data-testid=cfg-save]').disabled === false", 10)
    click(browser, "[data-testid=cfg-rollout] summary")
    choose(field(browser, "canary_analysis"), "false")
    click(browser, "[data-testid=cfg-save]")
    wait_text(browser, "[data-testid=cfg-result]", lambda t: t.startswith("Saved: revision 1"), 15)
    reason = wait_text(browser, f'[data-testid=cfg-verdicts] tr[data-device-id="{REAL}"][data-status=refused] '
                                "[data-testid=cfg-refused-reason]", lambda t: MISSING in t, 120)
    found = admin.device_config(REAL)
    assert found["status"] == "refused" and found["refused"]["reason"] and MISSING in found["refused"]["reason"]
    assert reason.startswith(f"{found['refused']['state']}: {found['refused']['reason']}"), reason
    wait_text(browser, "[data-testid=cfg-device-refused]", lambda t: found["refused"]["reason"] in t, 15)
    # nothing changed on the device: its agent.yaml's pipeline still runs
    state = dashboard.manager.db.get_device(REAL)["state"]
    assert [p.get("status") for p in state["pipelines"]] == ["running"] and agent.alive()
    # the keys now come from its layer
    wait_js(browser, "return Array.from(document.querySelectorAll('[data-testid=cfg-origins] tr[data-path]'))"
                     ".some(tr => tr.dataset.path === 'pipelines[main].model' && tr.dataset.origin === "
                     f"'device:{REAL}')", 15)

    # the device page says it, and the overview counts it among the devices out of step, linking to them
    go(browser, dashboard, f"#/devices/{REAL}")
    wait_text(browser, "[data-testid=device-config-status]", lambda t: t.startswith("refused") and MISSING in t, 15)
    go(browser, dashboard, "#/")
    out = admin.config_devices()["out_of_step"]
    wait_text(browser, "[data-testid=count-config-out-of-step]", str(out), 15)
    click(browser, "[data-testid=config-out-of-step-link]")
    wait_for(browser, "[data-testid=config-index]", 10)
    wait_js(browser, "return document.querySelectorAll('[data-testid=cfg-verdicts] tr[data-device-id]').length === "
                     "arguments[0]", 10, out)
    assert verdicts(browser)[REAL] == "refused"
    # the devices list has a column for it
    go(browser, dashboard, "#/devices")
    wait_text(browser, f'tr[data-device-id="{REAL}"] td[data-col=config]', "refused", 15)
    assert not browser.errors(), browser.errors()


def test_the_tab_at_phone_width(page, browser, tmp_path):
    dashboard, _clip, _agent = page
    phone = browser.fresh(PHONE)  # the module's Chromium at a phone's width
    open_layer(phone, dashboard, "operator", "group", GROUP)
    type_into(field(phone, "pipelines[0].max_fps"), "8")
    wait_js(phone, "return document.querySelectorAll('[data-testid=cfg-diff] tr[data-path]').length === 1", 10)
    assert phone.driver.execute_script("return document.documentElement.scrollWidth <= window.innerWidth + 1")
    time.sleep(0.3)
    screenshot(phone, tmp_path / "dashboard-config-phone.png")  # a look, not one of the docs' images
    assert not phone.errors(), phone.errors()

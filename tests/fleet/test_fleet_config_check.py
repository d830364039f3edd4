"""What the dashboard's Configuration tab asks of the manager as one types (docs/fleet.md, *The dashboard's
Configuration tab*): ``POST /api/config/layers/{scope}/{name}/check`` judges an edit as a save would — the device's
own check (``layer_problems``: agent --check's words at each key), a masked secret put back — and answers its
problems, its diff from the newest revision and the document as YAML or JSON text, storing nothing; a text is read
by the manager (``fleet/config_text.py``: PyYAML's safe loader, anchors refused, a date or a non-finite number named
at its key). And a device's refusal keeps the device's own words in its deployment target (what the tab shows)."""

from __future__ import annotations

import contextlib
import http.client
import json
import urllib.error
import urllib.parse
import urllib.request

import pytest
import yaml
from support.fleet import api_call as call
from support.fleet import simulated_fleet

from edgeinfer.fleet.config_layers import layer_problems
from edgeinfer.fleet.config_text import TEXT_KEY, dump_text, parse_text
from edgeinfer.fleet.deployments import progress_of
from edgeinfer.fleet.verdicts import MAX_MESSAGE
from edgeinfer.link.config_document import MAX_DOCUMENT_BYTES, MAX_DOCUMENT_NESTING

SECRET = "s3cr3t-Pa55"
PIPELINE = {"name": "main", "model": "/models/detector.tflite", "source": f"rtsp://admin:{SECRET}@cam.local/1",
            "max_fps": 10}
MASKED = "rtsp://admin:***@cam.local/1"


# ---------------------------------------------------------------------------------- the text, read and written
def test_yaml_and_json_are_read_into_the_same_document_and_written_back():
    document = {"pipelines": [{"name": "main", "max_fps": 5, "lines": ["door=0.5,0,0.5,1"]}], "telemetry_interval_s": 2}
    for fmt in ("yaml", "json"):
        text = dump_text(document, fmt)
        assert parse_text(text, fmt) == (document, [])
    assert dump_text(document, "yaml").startswith("pipelines:\n- name: main\n")  # keys in their order
    assert parse_text("", "yaml") == ({}, []) and dump_text({}, "yaml") == ""  # the empty layer


@pytest.mark.parametrize(("text", "fmt", "key", "words"), [
    ("pipelines:\n- name: main\n  max_fps: [\n", "yaml", TEXT_KEY, "not valid YAML: line 4, column 1"),
    ("base: &a {x: 1}\nother: *a\n", "yaml", TEXT_KEY, "anchors and aliases are not taken"),
    ("pipelines:\n- name: main\n  since: 2024-01-02\n", "yaml", "pipelines[0].since", "reads as a date"),
    ("pipelines:\n- {name: main, max_fps: .inf}\n", "yaml", "pipelines[0].max_fps", "must be a finite number"),
    ("{1: x}\n", "yaml", "(top level)", "the key 1 must be text"),
    ('{"max_fps": NaN}', "json", TEXT_KEY, "NaN is not a JSON number"),
    ('{"a": 1,}', "json", TEXT_KEY, "not valid JSON: line 1, column 9"),
    ("[" * (MAX_DOCUMENT_NESTING + 2) + "]" * (MAX_DOCUMENT_NESTING + 2), "json", TEXT_KEY, "nests deeper than"),
])
def test_what_a_text_may_not_hold_is_a_problem_naming_where(text, fmt, key, words):
    value, problems = parse_text(text, fmt)
    assert value is None and len(problems) == 1, problems
    [(where, said)] = problems
    assert where == key and words in said, problems


# ---------------------------------------------------------------------------------- the route, on a real manager
@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    with simulated_fleet(tmp_path_factory.mktemp("config-check"), devices=1, groups=("lobby",), fleet="yard") as sim:
        yield sim



def oversized_status(fleet, path: str, body: bytes) -> int:
    """The status a body too large gets: the manager may answer 413 and close before the whole body is sent (a
    broken pipe on this side), so the answer is read whatever happened to the sending."""
    where = urllib.parse.urlsplit(fleet.manager.http.url)
    connection = http.client.HTTPConnection(where.hostname, where.port, timeout=30)
    try:
        connection.putrequest("POST", path)
        for name, value in (("Authorization", f"Bearer {fleet.manager.admin_token}"),
                            ("Content-Type", "application/json"), ("Content-Length", str(len(body)))):
            connection.putheader(name, value)
        connection.endheaders()
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            connection.send(body)
        return connection.getresponse().status
    finally:
        connection.close()


def check(fleet, name: str, body: dict, **kw):
    return call(fleet, "POST", f"/api/config/layers/group/{name}/check", body, **kw)


def test_an_edit_is_judged_as_a_save_would_judge_it_and_nothing_is_stored(fleet):
    viewer = fleet.admin.create_token("check-viewer", "viewer")["token"]
    bad = {"pipelines": [{"name": "main", "max_fps": -1, "mdel": "/m/x.tflite", "score_threshold": 2}]}
    status, answer = check(fleet, "judged", {"document": bad}, token=viewer)  # a viewer may ask: nothing is stored
    assert status == 200, answer
    assert [f"{p['key']}: {p['words']}" for p in answer["problems"]] == layer_problems(bad)
    assert {p["key"] for p in answer["problems"]} >= {"pipelines[0].max_fps", "pipelines[0].mdel"}
    status, refused = call(fleet, "PUT", "/api/config/layers/group/judged", {"document": bad, "revision": 0})
    assert status == 409 and refused["error"].startswith(layer_problems(bad)[0])  # the save's words: the same
    # a good edit: no problem, its diff from revision 0, and it as text in the format asked for
    status, answer = check(fleet, "judged", {"document": {"pipelines": [PIPELINE]}, "format": "json"}, token=viewer)
    assert status == 200 and answer["problems"] == [] and answer["revision"] == 0, answer
    assert {d["path"]: d["op"] for d in answer["diff"]} == {f"pipelines[main].{key}": "add" for key in PIPELINE}
    assert [d["after"] for d in answer["diff"] if d["path"] == "pipelines[main].source"] == [MASKED]  # diffs mask
    assert json.loads(answer["text"]) == answer["document"] == {"pipelines": [PIPELINE]}
    assert call(fleet, "GET", "/api/config/layers/group/judged")[1]["revision"] == 0
    status, answer = call(fleet, "PUT", "/api/config/layers/group/judged", {"document": {"pipelines": [PIPELINE]},
                                                                            "revision": 0, "apply": False})
    assert status == 200, answer


def test_a_text_is_read_by_the_manager_and_a_masked_secret_stands_for_the_stored_one(fleet):
    status, saved = call(fleet, "PUT", "/api/config/layers/group/texts",
                         {"document": {"pipelines": [PIPELINE]}, "revision": 0, "apply": False})
    assert status == 200, saved
    shown = call(fleet, "GET", "/api/config/layers/group/texts")[1]["document"]
    assert shown["pipelines"][0]["source"] == MASKED
    # the layer as shown, sent back as YAML text: nothing changed (the mask stands for the stored password)
    status, answer = check(fleet, "texts", {"text": yaml.safe_dump(shown)})
    assert status == 200 and answer["problems"] == [] and answer["diff"] == [], answer
    assert answer["revision"] == 1 and SECRET not in json.dumps(answer)
    # a changed value: its diff; the text written back as YAML
    edited = {"pipelines": [{**shown["pipelines"][0], "max_fps": 4}]}
    status, answer = check(fleet, "texts", {"text": yaml.safe_dump(edited)})
    assert [(d["path"], d["op"], d["before"], d["after"]) for d in answer["diff"]] == [
        ("pipelines[main].max_fps", "change", 10, 4)], answer
    assert yaml.safe_load(answer["text"]) == edited
    # a masked text that masks nothing stored (the host changed too): the save's 400 words, as a problem
    moved = {"pipelines": [{**shown["pipelines"][0], "source": "rtsp://admin:***@other.local/1"}]}
    status, answer = check(fleet, "texts", {"text": yaml.safe_dump(moved)})
    assert status == 200 and answer["problems"] and answer["problems"][0]["key"].startswith("pipelines[0]"), answer
    status, refused = call(fleet, "PUT", "/api/config/layers/group/texts", {"document": moved, "revision": 1})
    assert status == 409 and refused["error"] == f"{answer['problems'][0]['key']}: {answer['problems'][0]['words']}"
    # a text that is not YAML: where it breaks, and no document
    status, answer = check(fleet, "texts", {"text": "pipelines: [\n"})
    assert status == 200 and answer["document"] is None and answer["text"] is None and answer["diff"] == []
    assert [p["key"] for p in answer["problems"]] == [TEXT_KEY] and "line 2" in answer["problems"][0]["words"]
    assert call(fleet, "GET", "/api/config/layers/group/texts")[1]["revision"] == 1  # nothing stored


def test_a_roll_back_is_previewed_as_its_diff_from_the_newest(fleet):
    for revision, fps in ((0, 10), (1, 3)):
        status, saved = call(fleet, "PUT", "/api/config/layers/group/history",
                             {"document": {"pipelines": [{**PIPELINE, "max_fps": fps}]}, "revision": revision,
                              "apply": False})
        assert status == 200, saved
    status, answer = check(fleet, "history", {"to_revision": 1})
    assert status == 200 and answer["revision"] == 2 and answer["problems"] == [], answer
    assert [(d["path"], d["before"], d["after"]) for d in answer["diff"]] == [("pipelines[main].max_fps", 3, 10)]
    assert answer["document"]["pipelines"][0]["source"] == MASKED and SECRET not in json.dumps(answer)
    status, answer = check(fleet, "history", {"to_revision": 9})
    assert status == 404 and "no revision 9" in answer["error"], answer


def test_a_check_takes_one_edit_and_a_bounded_text(fleet):
    for body in ({}, {"document": {}, "text": ""}, {"text": "", "to_revision": 1}):
        status, answer = check(fleet, "bounds", body)
        assert status == 400 and answer["error"] == "give one of document, text and to_revision", (body, answer)
    status, answer = check(fleet, "bounds", {"text": "#" * (MAX_DOCUMENT_BYTES + 10)})
    assert status == 413 and str(MAX_DOCUMENT_BYTES) in answer["error"], answer
    status, answer = check(fleet, "bounds", {"text": "", "format": "toml"})
    assert status == 400 and "format" in answer["error"], answer
    assert oversized_status(fleet, "/api/config/layers/group/bounds/check", b"{" + b" " * (1 << 20) + b"}") == 413
    status, _ = check(fleet, "bounds", {"text": ""}, token="not-a-token")
    assert status == 401


# ---------------------------------------------------------------------------------- the device's own words
def test_a_devices_refusal_keeps_its_own_words_in_the_target():
    event = {"event": "update", "data": {"deployment_id": "d-1", "state": "failed", "reason": "model_failed",
                                         "detail": "pipelines[0].model: /m/x.onnx not found"}}
    assert progress_of(event) == ("d-1", "failed", "model_failed — pipelines[0].model: /m/x.onnx not found")
    rejected = {"event": "cmd_rejected", "cmd_id": "deploy-d-2", "data": {"reason": "bad_signature"}}
    assert progress_of(rejected)[1:] == ("rejected", "bad_signature")  # no words of its own: the code alone
    long = {"event": "update", "data": {"deployment_id": "d-3", "state": "failed", "reason": "x", "detail": "y" * 5000}}
    assert len(progress_of(long)[2]) <= len("x — ") + MAX_MESSAGE  # a device's words are bounded (verdicts.py)

"""The OpenAPI document is the contract. A schema-driven fuzzer — schemathesis, run the way a user runs it
(its CLI, every check, a fixed seed, a bounded number of examples per operation) — against the fleet
manager's HTTP API (its real services on a real SQLite database, uvicorn on a free port, the live updates'
thread, a device reporting all along; no broker: commands are spooled, enrolments reload no Mosquitto) with a
real token of each role: it finds no status code or content type the document does not declare, no answer
(a live update's event included) that breaks its schema, no request the document allows and the manager
refuses, no request it forbids and the manager takes, no server error, and no route that answers without its
token. Every operation of the document is exercised, each answering the token its security names, the endless
ones too. And no route answers a token whose role is below the one the document names for it.

There is no list of exceptions: what the fuzzer expects comes from the document. What it is told besides:

- what the document cannot say (``support/contract_hooks.py``): the bytes of a JPEG, an MJPEG or MP4 clip, a
  zip of YOLO labels and a ``jpeg-base64`` string; that a COCO document's annotations name its own images and
  categories; how to read an answer that never ends (the MJPEG live view, a clip played: up to its first part);
- the things that are stored (a device, an event's evidence, an artifact, a deployment, a sample, a live frame of
  a pipeline someone watches, a claim a device provisions with): a path parameter, a device's claim, a
  deployment's artifact and devices take them half of the time
  (schemathesis's dictionaries), so the reading routes answer 200 too and their answers are checked;
- its own token to revoke, and not to take values from answers: it would otherwise take the admin token's id from
  ``GET /api/tokens`` and revoke the token it runs with (``DELETE /api/tokens/{token_id}``), after which every
  operation it tests answers 401 — the cause of the "23 operations answered only 401/403" of issue 35, with a
  second one: a viewer's token beside an empty ``?grant=`` was refused (``test_any_credential_opens_an_artifact``);
- per operation, what its document says besides refusals: a status declared without the ``{"error"}`` body every
  refusal has (a live frame nobody watches: 410, the device's signal to stop) is an answer to a valid request;
- how long to read a stream (``text/event-stream``: a few events, each checked against its declared schema; the
  live updates send some each second while the device reports); no coverage phase for an operation that takes a
  list of thousands of ids (its longest lists are seconds of the manager's work each, sent over and over); and
  not its stateful phase (``PHASES``).

The tests after the fuzzer's hold the manager to each claim the fuzzer found untrue in issue 35, one request
and the document's word on it at a time.
"""

from __future__ import annotations

import base64
import http.client
import io
import json
import os
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
import zipfile
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import pytest
from support.assets import REPO
from support.fleet import admin_of, api_server, state_message, telemetry_message
from support.jpegs import JPEGS, MP4_HEAD

from edgeinfer.fleet.api.rate_limit import PROVISION_PATH
from edgeinfer.fleet.api.sample_schemas import JPEG_BASE64
from edgeinfer.fleet.api.schemas import DeploymentSpec
from edgeinfer.fleet.config_layers import LayerKey, Scope
from edgeinfer.fleet.configs import Author
from edgeinfer.fleet.db import FleetDB
from edgeinfer.fleet.samples import decode_jpeg
from edgeinfer.forms.evidence import new_event_id

pytestmark = pytest.mark.skipif(sys.version_info < (3, 11), reason="schemathesis 4 needs Python 3.11")
jsonschema_rs = pytest.importorskip("jsonschema_rs", reason="schemathesis's: the document's schemas, judged")

SEED = 1
#: what schemathesis runs: the document's examples (it has none), every value's edges, then generated requests; not its
#: stateful phase, whose links are its own guesses rather than the document's (it took an event's row id for the
#: ``{event_id}`` of its evidence: a request the document forbids, sent as a valid one)
PHASES = ("examples", "coverage", "fuzzing")
#: examples per operation in the fuzzing phase: the fuzzer's whole run stays within two minutes on two cores
EXAMPLES = 10
ROLES = ("viewer", "operator", "admin")
DEVICE = "contract-cam"
EVENT_ID = new_event_id(1)
SAMPLE_ID = "s1"
PIPELINE = "main"
#: a configuration layer's name, saved once (revision 1) in each scope, so the routes that read a layer's revisions
#: answer 200 too (the scope is no dictionary's: the fuzzer takes each of the enum's values itself)
LAYER = "lobby"
#: what fills a path parameter when a role is checked (the credential is judged before the parameters)
PATH_VALUES = {"device_id": DEVICE, "deployment_id": "d" * 32, "token_id": "0" * 12, "sha256": "0" * 64,
               "event_id": EVENT_ID, "pipeline": PIPELINE, "sample_id": SAMPLE_ID, "command_id": "c" * 32,
               "scope": "group", "name": LAYER, "revision": "1", "claim_id": "0" * 12}
STREAM = "/api/changes"
#: the change feed's old name, a deprecated alias that answers the same
OLD_STREAM = "/api/stream"  # its old name
LIVE_VIEW = "/api/devices/{device_id}/live/{pipeline}"
#: the media types of answers that go on until the client goes
ENDLESS = ("text/event-stream", "multipart/x-mixed-replace")
#: how long the fuzzer reads an endless answer at most, and how many of a stream's events it reads
STREAM_READ_S = 10
STREAM_EVENTS = 3
#: the refusals' body ({"error": ...}): a status declared without it is no refusal
ERROR_BODY = "#/components/schemas/ErrorBody"
#: schemathesis's own answers to a valid request that are no refusal of it (the credential, the thing named)
ACCEPTED = ["2xx", "3xx", "401", "403", "404", "409", "429", "5xx"]
#: an array in a request body this long makes its operation's coverage phase seconds of work per case
LONG_LIST = 1000
#: how often the fixture's device reports (the live updates send what changed once a second)
REPORT_S = 0.5


@dataclass
class Contract:
    url: str
    tokens: dict[str, str]  # role -> token
    document: dict
    known: dict[str, list[str]]  # "path.NAME" or "body.NAME" -> values that name something stored

    def call(self, method: str, path: str, token: str | None, body: bytes | None = None,
             content_type: str = "application/json") -> tuple[int, bytes]:
        data = body if body is not None else b"{}" if method in ("POST", "PUT") else None
        request = urllib.request.Request(f"{self.url}{path}", method=method, data=data, headers={
            "Content-Type": content_type, **({"Authorization": f"Bearer {token}"} if token else {})})
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                return response.status, response.read()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read()

    def token_id(self, role: str) -> str:
        return self.tokens[role].split("_")[1]


def put(url: str, path: str, token: str, body: bytes, content_type: str = "application/octet-stream") -> None:
    request = urllib.request.Request(f"{url}{path}", method="PUT", data=body,
                                     headers={"Authorization": f"Bearer {token}", "Content-Type": content_type})
    with urllib.request.urlopen(request, timeout=10) as response:
        assert response.status == 201


def report(db: FleetDB, boot: str, stop: threading.Event) -> None:
    """A device reporting: telemetry every REPORT_S, an event every fourth time (the live updates' news)."""
    seq = 3
    while not stop.wait(REPORT_S):
        seq += 1
        db.record_telemetry("contract", DEVICE, telemetry_message(DEVICE, boot, seq, fleet="contract"))
        if seq % 4 == 0:
            db.record_event("contract", DEVICE, {
                "v": 1, "type": "event", "fleet": "contract", "device": DEVICE, "ts": time.time(), "boot_id": boot,
                "seq": seq, "event": "rule_triggered", "level": "info", "message": "door", "pipeline": PIPELINE,
                "data": {"event_id": new_event_id(seq), "frames": 2, "duration_s": 1.0}})


def store(url: str, tokens: dict[str, str], db: FleetDB) -> None:
    """An event's evidence, a sample, and a live frame of a pipeline someone watches, as a device sends them."""
    for name, body in (("snapshot.jpg", JPEGS[0]), ("clip.mjpeg", JPEGS[0] + JPEGS[1]), ("frame.jpg", JPEGS[1]),
                       ("clip.mp4", MP4_HEAD)):
        put(url, f"/api/devices/{DEVICE}/events/{EVENT_ID}/{name}", tokens["operator"], body)
    sample = {"jpeg": base64.b64encode(JPEGS[2]).decode(), "phash": "0123456789abcdef", "width": 32, "height": 20,
              "captured_at": time.time(), "pipeline": PIPELINE, "detections": [{"label": "cat", "box": [1, 1, 9, 9]}]}
    put(url, f"/api/devices/{DEVICE}/samples/{SAMPLE_ID}", tokens["operator"], json.dumps(sample).encode(),
        "application/json")
    key = (DEVICE, PIPELINE, "")
    db.watch_live(key, time.time() + 3600)  # stored only while watched: someone watches all along
    assert db.put_live_frame(key, {"jpeg": JPEGS[3], "width": 40, "height": 24, "frame_time": time.time(),
                                   "frame_id": "1"}) is not None


@pytest.fixture(scope="module")
def contract(tmp_path_factory) -> Contract:
    folder = tmp_path_factory.mktemp("contract")
    db = FleetDB(f"sqlite:///{folder / 'fleet.sqlite3'}")
    boot = "c" * 32
    db.record_state("contract", DEVICE, state_message(DEVICE, boot, fleet="contract"))
    for seq in (1, 2, 3):
        db.record_telemetry("contract", DEVICE, telemetry_message(DEVICE, boot, seq, fleet="contract"))
    db.record_event("contract", DEVICE, {
        "v": 1, "type": "event", "fleet": "contract", "device": DEVICE, "ts": time.time(), "boot_id": boot, "seq": 1,
        "event": "rule_triggered", "level": "info", "message": "door", "pipeline": PIPELINE,
        "data": {"event_id": EVENT_ID, "frames": 2, "duration_s": 1.0}})
    stop = threading.Event()
    reporter = threading.Thread(target=report, args=(db, boot, stop), name="contract-device", daemon=True)
    try:
        with api_server(db, folder / "api", ca=True) as (server, services):
            services.changes.start()
            reporter.start()
            admin = admin_of(folder / "api")
            tokens = {role: services.access.tokens.create(name=f"contract-{role}", role=role)["token"]
                      for role in ROLES[:2]} | {"admin": admin}
            spare = services.access.tokens.create(name="contract-spare", role="viewer")["token_id"]
            store(server.url, tokens, db)
            model = folder / "model.bin"
            model.write_bytes(os.urandom(4096))
            sha256, _ = services.artifacts.put(model)
            deployment = services.deployments.create(DeploymentSpec(sha256=sha256, version=2, devices=[DEVICE]))
            for scope in Scope:
                services.configs.save(LayerKey(scope, LAYER), {"telemetry_interval_s": 2}, base=0, message="contract",
                                      author=Author("contract-operator", "operator"), apply=False)
            request = urllib.request.Request(f"{server.url}/openapi.json",
                                             headers={"Authorization": f"Bearer {tokens['viewer']}"})
            with urllib.request.urlopen(request, timeout=10) as response:
                document = json.loads(response.read())
            # a claim devices provision with (its id is no dictionary's: the fuzzer would revoke it)
            claim = services.claims.create(groups=["contract"])["token"]
            known = {"body.claim": [claim], "path.device_id": [DEVICE], "path.event_id": [EVENT_ID],
                     "path.sha256": [sha256],
                     "path.deployment_id": [deployment["deployment_id"]], "path.token_id": [spare],
                     "path.pipeline": [PIPELINE], "path.sample_id": [SAMPLE_ID], "body.sha256": [sha256],
                     "path.name": [LAYER], "path.revision": [1]}
            try:
                yield Contract(server.url, tokens, document, known)
            finally:
                stop.set()
                reporter.join(5)
                services.changes.close()
    finally:
        db.close()


def operations(document: dict) -> list[tuple[str, str, dict]]:
    return [(method.upper(), path, operation) for path, item in document["paths"].items()
            for method, operation in item.items()]


def role_of(operation: dict) -> str | None:
    """The role of the bearer token an operation's security names (None: no token opens it)."""
    names = [name for requirement in operation.get("security", []) for name in requirement]
    return next((name.removesuffix("_token") for name in names if name.endswith("_token")), None)


def answers(operation: dict) -> list[str]:
    """The statuses an operation declares that are no refusal of the request: no {"error"} body among their media
    types (a refusal always has it), 4xx (2xx are answers anyway)."""
    return [status for status, response in operation["responses"].items() if status.startswith("4")
            and not any(media.get("schema", {}).get("$ref") == ERROR_BODY
                        for media in response.get("content", {}).values())]


def longest_list(schema: object) -> int:
    """The most items an array anywhere in ``schema`` may hold."""
    if isinstance(schema, dict):
        own = schema.get("maxItems", 0) if schema.get("type") == "array" else 0
        return max([own, *(longest_list(value) for value in schema.values())])
    if isinstance(schema, list):
        return max([0, *(longest_list(value) for value in schema)])
    return 0


#: opened by a device's client certificate only (over https): the fuzzer, on plain http, meets their 401 (accepted)
CERTIFICATE_ONLY = {"/api/v1/provision/renew"}


def operation_settings(document: dict, method: str, path: str, operation: dict) -> list[str]:
    """What the fuzzer is told about one operation, from the document: each line a setting."""
    settings = []
    if extra := answers(operation):
        settings += ["[operations.checks.positive_data_acceptance]",
                     f"expected-statuses = {json.dumps(ACCEPTED + extra)}"]
    media = {m for response in operation["responses"].values() for m in response.get("content", {})}
    if media & set(ENDLESS):
        settings = [f"request-timeout = {STREAM_READ_S}", f"max-stream-events = {STREAM_EVENTS}", *settings]
    if longest_list(resolved(document, operation.get("requestBody", {}))) >= LONG_LIST:
        settings += ["[operations.phases.coverage]", "enabled = false"]
    return ["[[operations]]", f'include-name = "{method} {path}"', *settings, ""] if settings else []


def resolved(document: dict, schema: object, depth: int = 0) -> object:
    """``schema`` with the document's references in it replaced by what they name (to a depth of 8)."""
    if isinstance(schema, dict):
        ref = schema.get("$ref")
        if isinstance(ref, str) and ref.startswith("#/components/schemas/") and depth < 8:
            return resolved(document, document["components"]["schemas"][ref.rsplit("/", 1)[1]], depth + 1)
        return {key: resolved(document, value, depth) for key, value in schema.items()}
    if isinstance(schema, list):
        return [resolved(document, value, depth) for value in schema]
    return schema


def fuzzer_config(contract: Contract) -> str:
    """schemathesis.toml: a token per role (the document names each as its own security scheme), the things
    stored, the token the fuzzer may revoke, and each operation's settings from the document."""
    lines = [*(f"[phases.{phase}.extra-data-sources]\nresponses = false\n" for phase in ("coverage", "fuzzing"))]
    lines += [f'[auth.openapi.{role}_token]\nbearer = "{token}"\n' for role, token in contract.tokens.items()]
    # a parameter (or a body's field) by its name, in every operation: half of the time, a value that names something
    # (not an array's items: the same value twice breaks an array's uniqueItems, and the fuzzer would not know)
    def dictionary(name: str) -> str:
        return name.replace(".", "-")

    lines += [f"[dictionaries.{dictionary(name)}]\nvalues = {json.dumps(values)}\n"
              for name, values in contract.known.items()]
    bindings = [f'"{name}" = {{ dictionary = "{dictionary(name)}", probability = 0.5 }}' for name in contract.known]
    lines.insert(0, "parameters = { " + ", ".join(bindings) + " }\n")  # TOML: before the first table
    for method, path, operation in operations(contract.document):
        lines += operation_settings(contract.document, method, path, operation)
    return "\n".join(lines)


def run_fuzzer(contract: Contract, folder: Path) -> tuple[dict, list[dict]]:
    """schemathesis run, every check, on the document as the manager serves it: its JSON report, and every answer
    it got (the hooks write them down)."""
    schema = folder / "openapi.json"
    schema.write_text(json.dumps(contract.document))
    config = folder / "schemathesis.toml"
    config.write_text(fuzzer_config(contract))
    report, answered = folder / "report.json", folder / "answers.ndjson"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join((str(REPO), str(REPO / "tests"))),
           "SCHEMATHESIS_HOOKS": "support.contract_hooks", "CONTRACT_ANSWERS": str(answered)}
    done = subprocess.run(
        [sys.executable, "-m", "schemathesis.cli", "--no-color", "--config-file", str(config), "run", str(schema),
         "--url", contract.url, "--phases", ",".join(PHASES), "--checks", "all", "--seed", str(SEED),
         "--max-examples", str(EXAMPLES),
         "--workers", "1", "--request-timeout", "20", "--generation-database", "none",
         "--report", "json", "--report-json-path", str(report)],
        capture_output=True, text=True, env=env, timeout=600, cwd=folder)
    (folder / "fuzzer.log").write_text(done.stdout + done.stderr)  # every failure in full, to replay it
    assert report.is_file(), done.stdout[-3000:] + done.stderr[-3000:]
    found = json.loads(report.read_text())
    found["output"] = done.stdout[-20_000:]
    return found, [json.loads(line) for line in answered.read_text().splitlines()]


@pytest.mark.timeout(600)  # the fuzzer's own bound (run_fuzzer): a wait, on a machine as busy as it is
def test_the_fuzzer_finds_no_mismatch_and_exercises_every_operation_with_its_token(contract, tmp_path):
    report, answered = run_fuzzer(contract, tmp_path)
    every = operations(contract.document)
    assert report["failures"] == [] and report["errors"] == [], report["output"]
    # its tokens opened every route all along (but those only a device's certificate opens, over https)
    assert not [op for op in report["warnings"]["missing_auth"] if op.split(" ", 1)[1] not in CERTIFICATE_ONLY], \
        report["warnings"]
    assert report["complete"] and report["stop_reason"] == "completed", report["output"]
    assert report["operations"]["tested"] == len(every) == report["operations"]["selected"], report["operations"]
    assert report["test_cases"]["generated"] >= 4 * len(every), report["test_cases"]
    assert {phase: report["phases"][phase]["status"] for phase in ("coverage", "fuzzing")} == \
        {"coverage": "success", "fuzzing": "success"}, report["phases"]
    # each operation answered the token its security names (none: /healthz) with something else than 401 / 403
    roles = {contract.token_id(role): role for role in ROLES}
    opened = {(a["operation"], roles.get(a["token_id"])) for a in answered if a["status"] not in (401, 403)}
    missing = [f"{method} {path}" for method, path, operation in every if path not in CERTIFICATE_ONLY and not any(
        (f"{method} {path}", role) in opened for role in ([role_of(operation)] if role_of(operation) else
                                                          [None, *ROLES]))]
    assert not missing, (missing, Counter((a["operation"], a["status"]) for a in answered))


def test_no_route_answers_a_token_below_its_role(contract):
    """Every route the document guards: 401 without a token, 403 with each role below its own."""
    checked = 0
    for method, path, operation in operations(contract.document):
        role = role_of(operation)
        if role is None:  # liveness; a device's provisioning request, whose credential is its claim (in the body)
            assert path in ("/healthz", PROVISION_PATH) or path in CERTIFICATE_ONLY, f"{method} {path} names no token"
            if path in CERTIFICATE_ONLY:  # opened by a device's client certificate only (over https)
                assert contract.call(method, path, None)[0] == 401, (method, path)
            continue
        filled = path.format(**PATH_VALUES)
        assert contract.call(method, filled, None)[0] == 401, (method, path)
        for lower in ROLES[:ROLES.index(role)]:
            assert contract.call(method, filled, contract.tokens[lower])[0] == 403, (method, path, lower)
            checked += 1
    assert checked >= 10  # the operator's and the admin's routes, each refused to every role below


def test_what_is_not_there_is_a_declared_refusal(contract):
    """The fuzzer reads what exists (the things it is pointed at, above); what does not: each route with a path
    parameter, asked by its role about something well-formed that is not stored, answers a status it declares."""
    unknown = {**PATH_VALUES, "device_id": "contract-gone", "event_id": new_event_id(2), "sample_id": "gone"}
    asked = set()
    for method, path, operation in operations(contract.document):
        role = role_of(operation)
        if "{" not in path or role is None:
            continue
        status = contract.call(method, path.format(**unknown), contract.tokens[role])[0]
        assert str(status) in operation["responses"], (method, path, status, sorted(operation["responses"]))
        asked.add(status)
    assert 404 in asked


@pytest.mark.parametrize("path", [STREAM, OLD_STREAM])
def test_the_change_feed_keeps_its_contract(contract, path):
    """Its declared content type and credential, and a keep-alive comment first (which is no event) — under its
    name and under its old name (an alias)."""
    declared = contract.document["paths"][path]["get"]["responses"]
    assert list(declared["200"]["content"]) == ["text/event-stream"] and "401" in declared
    assert contract.call("GET", path, None)[0] == 401
    host, port = contract.url.removeprefix("http://").split(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=10)
    try:
        connection.request("GET", path, headers={"Authorization": f"Bearer {contract.tokens['viewer']}"})
        response = connection.getresponse()
        assert response.status == 200 and response.headers["Content-Type"].startswith("text/event-stream")
        assert response.readline() == b": connected\n"
    finally:
        connection.close()


def test_old_route_names_are_deprecated_aliases(contract):
    """GET /api/stream (the change feed's old name, an alias) and POST .../capture (sample's) are declared
    deprecated and answer as their new names do."""
    paths = contract.document["paths"]
    assert paths[OLD_STREAM]["get"].get("deprecated") is True and not paths[STREAM]["get"].get("deprecated")
    assert paths[OLD_STREAM]["get"]["responses"] == paths[STREAM]["get"]["responses"]
    old = paths["/api/devices/{device_id}/capture"]["post"]  # sample's old name
    new = paths["/api/devices/{device_id}/sample"]["post"]
    assert old.get("deprecated") is True and not new.get("deprecated")  # sample's old name, an alias
    assert (old["requestBody"], old["responses"]) == (new["requestBody"], new["responses"])


def test_the_live_view_keeps_its_contract(contract):
    """Its declared content type and credential, and a first frame."""
    declared = contract.document["paths"][LIVE_VIEW]["get"]["responses"]
    assert list(declared["200"]["content"]) == ["multipart/x-mixed-replace"] and "401" in declared
    path = LIVE_VIEW.format(device_id=DEVICE, pipeline="other")
    assert contract.call("GET", path, None)[0] == 401
    host, port = contract.url.removeprefix("http://").split(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=10)
    try:
        connection.request("GET", path, headers={"Authorization": f"Bearer {contract.tokens['viewer']}"})
        response = connection.getresponse()
        assert response.status == 200 and response.headers["Content-Type"].startswith("multipart/x-mixed-replace")
        status, _ = contract.call("POST", f"{path}/frames", contract.tokens["operator"], JPEGS[2], "image/jpeg")
        assert status == 204  # a viewer watches
        assert response.readline().startswith(b"--")
    finally:
        connection.close()


# ------------------------------------------------------------------ each mismatch the fuzzer found (issue 35)
def admits(contract: Contract, schema: dict, value: object) -> bool:
    """Whether the document's ``schema`` admits ``value`` (a ``jpeg-base64`` string judged by the manager's own
    check of a sample's JPEG)."""
    def jpeg_base64(text: str) -> bool:
        try:
            return bool(decode_jpeg(text, 1 << 30))
        except ValueError:
            return False

    root = {**schema, "components": contract.document["components"]}
    return jsonschema_rs.validator_for(root, validate_formats=True, formats={JPEG_BASE64: jpeg_base64}).is_valid(value)


def request_body(contract: Contract, method: str, path: str, media_type: str) -> dict:
    return contract.document["paths"][path][method.lower()]["requestBody"]["content"][media_type]["schema"]


def read_events(contract: Contract, count: int) -> list[dict]:
    """The first ``count`` Server-Sent Events of GET /api/changes, as a client parses them: {event, data}."""
    host, port = contract.url.removeprefix("http://").split(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=10)
    events, current = [], {}
    try:
        connection.request("GET", STREAM, headers={"Authorization": f"Bearer {contract.tokens['viewer']}"})
        response = connection.getresponse()
        while len(events) < count:
            line = response.readline().decode().rstrip("\n")
            if not line and current:
                events.append(current)
                current = {}
            elif line and not line.startswith(":"):
                field, _, value = line.partition(": ")
                current[field] = value
    finally:
        connection.close()
    return events


def test_the_live_stream_sends_the_events_the_document_declares(contract):
    """GET /api/changes's events were declared strings; each is an {event, data} whose data is JSON of its kind."""
    declared = contract.document["paths"][STREAM]["get"]["responses"]["200"]["content"]["text/event-stream"]["schema"]
    kinds = {branch["properties"]["event"]["const"]: branch["properties"]["data"]
             for branch in declared.get("oneOf", [])}
    seen = set()
    for event in read_events(contract, 6):  # the device reports twice a second: devices, overview, events
        assert admits(contract, declared, event), (event["event"], event["data"][:200])
        data = kinds[event["event"]]
        assert data["contentMediaType"] == "application/json"
        assert admits(contract, data["contentSchema"], json.loads(event["data"])), event
        seen.add(event["event"])
    assert {"devices", "overview"} <= seen


def test_a_sample_s_jpeg_is_declared_as_the_jpeg_the_manager_takes(contract):
    """A sample whose jpeg is base64 of something else than a JPEG: the document admitted it, the manager refuses it.
    Now the document says what the manager takes (format jpeg-base64), and the two agree both ways."""
    path = "/api/devices/{device_id}/samples/{sample_id}"
    schema = request_body(contract, "PUT", path, "application/json")
    sample = {"phash": "fedcba9876543210", "width": 32, "height": 20, "captured_at": time.time()}
    for sample_id, jpeg, status in (("not-a-jpeg", base64.b64encode(b"\x00" * 64).decode(), 400),
                                    ("a-jpeg", base64.b64encode(JPEGS[4]).decode(), 201)):
        body = {**sample, "jpeg": jpeg}
        assert admits(contract, schema, body) is (status == 201), body
        answer = contract.call("PUT", path.format(device_id=DEVICE, sample_id=sample_id), contract.tokens["operator"],
                               json.dumps(body).encode())
        assert answer[0] == status, answer


def test_an_import_is_declared_as_the_documents_the_manager_takes(contract):
    """POST /api/samples/import: its JSON body was declared a string (a JSON string admitted, and refused); it is a COCO
    document, and the body's Content-Type says which format it is. A document naming no stored sample is a 404, a
    box outside its sample's frame a 409 (the request is well-formed), both declared."""
    path, operator = "/api/samples/import", contract.tokens["operator"]
    coco = request_body(contract, "POST", path, "application/json")
    assert not admits(contract, coco, "a COCO document")
    assert contract.call("POST", path, operator, b'"a COCO document"')[0] == 400

    def document(sample_id: str, bbox: list) -> dict:
        return {"images": [{"id": 1, "file_name": f"images/{DEVICE}/{sample_id}.jpg"}],
                "categories": [{"id": 7, "name": "dog"}], "annotations": [{"image_id": 1, "category_id": 7,
                                                                           "bbox": bbox}]}
    sample_id = "to-label"
    put(contract.url, f"/api/devices/{DEVICE}/samples/{sample_id}", operator, json.dumps(
        {"jpeg": base64.b64encode(JPEGS[5]).decode(), "phash": "0f0f0f0f0f0f0f0f", "width": 56, "height": 32,
         "captured_at": time.time(), "pipeline": "labels"}).encode(), "application/json")
    declared = contract.document["paths"][path]["post"]["responses"]
    for named, bbox, status in (("nowhere", [1, 1, 4, 4], 404), (sample_id, [1, 1, 400, 4], 409),
                                (sample_id, [1, 1, 4, 4], 200)):
        body = document(named, bbox)
        assert admits(contract, coco, body) and str(status) in declared, body
        answer = contract.call("POST", path, operator, json.dumps(body).encode())
        assert answer[0] == status, answer
    archive = io.BytesIO()
    with zipfile.ZipFile(archive, "w") as zipped:
        zipped.writestr("data.yaml", "names:\n  0: dog\n")
        zipped.writestr(f"labels/{DEVICE}/{sample_id}.txt", "0 0.5 0.5 0.25 0.25\n")
    answer = contract.call("POST", path, operator, archive.getvalue(), "application/zip")  # no ?format=
    assert answer == (200, b'{"samples":1}'), answer


def test_an_empty_upload_is_a_declared_400_not_a_411(contract):
    """PUT /api/artifacts with nothing in it (Content-Length: 0) answered 411 Length Required, to a request that
    says its length; 411 stays for a body without one."""
    empty = contract.call("PUT", "/api/artifacts", contract.tokens["operator"], b"", "application/octet-stream")
    assert empty[0] == 400, empty
    host, port = contract.url.removeprefix("http://").split(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=10)
    try:  # chunked: no Content-Length
        connection.request("PUT", "/api/artifacts", body=iter([b"model"]), encode_chunked=True, headers={
            "Authorization": f"Bearer {contract.tokens['operator']}", "Transfer-Encoding": "chunked"})
        assert connection.getresponse().status == 411
    finally:
        connection.close()
    assert {"400", "411"} <= set(contract.document["paths"]["/api/artifacts"]["put"]["responses"])


def test_a_live_frame_is_a_jpeg_whatever_size_it_says(contract):
    """A live frame nobody watches is answered 410, which the document declares as no refusal (no error body): the
    device's signal to stop. What is no JPEG is a 400 — also when the device names its source's size (X-Source-Size),
    which let anything through as a frame."""
    declared = contract.document["paths"][LIVE_VIEW + "/frames"]["post"]["responses"]
    assert "410" in answers(contract.document["paths"][LIVE_VIEW + "/frames"]["post"]) and "400" in declared
    nobody = LIVE_VIEW.format(device_id=DEVICE, pipeline="unwatched") + "/frames"
    assert contract.call("POST", nobody, contract.tokens["operator"], JPEGS[1], "image/jpeg")[0] == 410
    watched = LIVE_VIEW.format(device_id=DEVICE, pipeline=PIPELINE) + "/frames"
    request = urllib.request.Request(f"{contract.url}{watched}", method="POST", data=b"no JPEG", headers={
        "Authorization": f"Bearer {contract.tokens['operator']}", "Content-Type": "image/jpeg",
        "X-Source-Size": "640x480", "X-Frame-Time": f"{time.time():.6f}"})
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=10)
    assert refused.value.code == 400


def test_any_credential_opens_an_artifact(contract):
    """The document says a viewer token, a device credential or a download grant opens an artifact. A viewer token
    beside an empty or a stale ``?grant=`` (what a fuzzer fills in) was refused 401; a grant alone that does not
    hold still is."""
    sha256 = contract.known["path.sha256"][0]
    for query in ("?grant=", "?grant=1.cam.forged", ""):
        for method in ("GET", "HEAD"):
            assert contract.call(method, f"/artifacts/{sha256}{query}", contract.tokens["viewer"])[0] == 200, query
    assert contract.call("GET", f"/artifacts/{sha256}?grant=1.cam.forged", None)[0] == 401
    assert contract.call("GET", f"/artifacts/{sha256}?grant=", None)[0] == 401

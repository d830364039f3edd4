"""The OpenAPI document is the contract. A schema-driven fuzzer — schemathesis, run the way a user runs it
(its CLI, every check, a fixed seed, a bounded number of examples per operation) — against the fleet
manager's HTTP API (its real services on a real SQLite database, uvicorn on a free port; no broker: commands
are spooled, enrolments reload no Mosquitto) with a real token of each role: it finds no status code or
content type the document does not declare, no answer that breaks its schema, no request the document
allows and the manager refuses, no server error, and no route that answers without its token. And no
route answers a token whose role is below the one the document names for it.

What the fuzzer is told besides the document: what the bytes of a JPEG snapshot and of an MJPEG clip are
(``support/contract_hooks.py``); a device, an artifact, a deployment and an event's evidence that exist, so
the routes that read them answer 200 too, and their answers are checked against their schemas; a token of its
own to revoke, and not to take ids from answers (it would revoke its own tokens); and that 411 (an upload
without a length) is a refusal. It leaves out two operations that never end, the live updates and a device's live
view; the last tests hold those to their contract.
"""

from __future__ import annotations

import http.client
import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pytest
from support.assets import REPO
from support.fleet import admin_of, api_server, state_message, telemetry_message
from support.jpegs import JPEGS, MP4_HEAD

from edgeinfer._evidence import new_event_id
from edgeinfer.fleet.db import FleetDB
from edgeinfer.fleet.schemas import DeploymentSpec

pytestmark = pytest.mark.skipif(sys.version_info < (3, 11), reason="schemathesis 4 needs Python 3.11")

SEED = 1
#: examples per operation in the fuzzing phase: the fuzzer's whole run stays within a minute on two cores
EXAMPLES = 10
ROLES = ("viewer", "operator", "admin")
DEVICE = "contract-cam"
EVENT_ID = new_event_id(1)
#: what fills a path parameter when a role is checked (the credential is judged before the parameters)
PATH_VALUES = {"device_id": DEVICE, "deployment_id": "d" * 32, "token_id": "0" * 12, "sha256": "0" * 64,
               "event_id": EVENT_ID, "pipeline": "main", "sample_id": "s1", "scope": "group", "name": "lobby",
               "revision": "1"}
STREAM = "/api/stream"
LIVE_VIEW = "/api/devices/{device_id}/live/{pipeline}"
ENDLESS = (STREAM, LIVE_VIEW)
EXCLUDED = [arg for path in ENDLESS for arg in ("--exclude-path", path)]
#: a live frame nobody watches is a valid request answered 410 Gone (the device stops sending): not a refusal
LIVE_FRAMES = "/api/devices/{device_id}/live/{pipeline}/frames"
SAMPLES_IMPORT = "/api/samples/import"
SAMPLE = "/api/devices/{device_id}/samples/{sample_id}"
#: a configuration layer's edits: a document the device's own check judges (400 naming the key), on a revision that
#: must be the layer's newest (409)
CONFIG_EDITS = ("PUT /api/config/layers/{scope}/{name}", "POST /api/config/layers/{scope}/{name}/rollback")
#: the operations that take a list of up to 10,000 device ids: the coverage phase sends the longest lists (each a
#: second of work for the manager) over and over; the fuzzing phase sends them lists of any length
LISTS_OF_DEVICES = (("/api/enrollments", "POST"), ("/api/deployments", "POST"))
#: schemathesis's refusals, and 411: an upload that says no length (its negative cases send no body)
REFUSALS = ["400", "401", "403", "404", "405", "406", "409", "411", "415", "422", "428", "429", "5xx"]


@dataclass
class Contract:
    url: str
    tokens: dict[str, str]  # role -> token
    document: dict
    known: dict[str, str]  # path parameter -> a value that names something stored
    spare_token: str  # the id of a token the fuzzer may revoke

    def call(self, method: str, path: str, token: str | None) -> int:
        request = urllib.request.Request(f"{self.url}{path}", method=method, data=b"{}" if method in (
            "POST", "PUT") else None, headers={"Content-Type": "application/json",
                                               **({"Authorization": f"Bearer {token}"} if token else {})})
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                return response.status
        except urllib.error.HTTPError as exc:
            return exc.code


def put(url: str, path: str, token: str, body: bytes) -> None:
    request = urllib.request.Request(f"{url}{path}", method="PUT", data=body,
                                     headers={"Authorization": f"Bearer {token}"})
    with urllib.request.urlopen(request, timeout=10) as response:
        assert response.status == 201


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
        "event": "rule_triggered", "level": "info", "message": "door", "pipeline": "main",
        "data": {"event_id": EVENT_ID, "frames": 2, "duration_s": 1.0}})
    try:
        with api_server(db, folder / "api") as (server, services):
            admin = admin_of(folder / "api")
            tokens = {role: services.access.tokens.create(name=f"contract-{role}", role=role)["token"]
                      for role in ROLES[:2]} | {"admin": admin}
            spare = services.access.tokens.create(name="contract-spare", role="viewer")["token_id"]
            put(server.url, f"/api/devices/{DEVICE}/events/{EVENT_ID}/snapshot.jpg", tokens["operator"], JPEGS[0])
            put(server.url, f"/api/devices/{DEVICE}/events/{EVENT_ID}/clip.mjpeg", tokens["operator"],
                JPEGS[0] + JPEGS[1])
            put(server.url, f"/api/devices/{DEVICE}/events/{EVENT_ID}/frame.jpg", tokens["operator"], JPEGS[1])
            put(server.url, f"/api/devices/{DEVICE}/events/{EVENT_ID}/clip.mp4", tokens["operator"], MP4_HEAD)
            model = folder / "model.bin"
            model.write_bytes(os.urandom(4096))
            sha256, _ = services.artifacts.put(model)
            deployment = services.deployments.create(DeploymentSpec(sha256=sha256, version=2, devices=[DEVICE]))
            request = urllib.request.Request(f"{server.url}/openapi.json",
                                             headers={"Authorization": f"Bearer {tokens['viewer']}"})
            with urllib.request.urlopen(request, timeout=10) as response:
                document = json.loads(response.read())
            known = {"device_id": DEVICE, "event_id": EVENT_ID, "sha256": sha256,
                     "deployment_id": deployment["deployment_id"]}
            yield Contract(server.url, tokens, document, known, spare)
    finally:
        db.close()


def operations(document: dict) -> list[tuple[str, str, dict]]:
    return [(method.upper(), path, operation) for path, item in document["paths"].items()
            for method, operation in item.items()]


def role_of(operation: dict) -> str | None:
    """The role of the bearer token an operation's security names (None: no token opens it)."""
    names = [name for requirement in operation.get("security", []) for name in requirement]
    return next((name.removesuffix("_token") for name in names if name.endswith("_token")), None)


def fuzzer_config(contract: Contract) -> str:
    """schemathesis.toml: a token per role (the document names each as its own security scheme), the refusals,
    the stored things the reading routes are asked about, the token the fuzzer may revoke."""
    lines = [f"[checks.negative_data_rejection]\nexpected-statuses = {json.dumps(REFUSALS)}", "",
             # values taken from answers would be used as valid ones: an event's evidence.event_id, null when it has
             # none, as a path's event id; a token's id, to revoke the fuzzer's own token
             *(f"[phases.{phase}.extra-data-sources]\nresponses = false\n" for phase in ("coverage", "fuzzing"))]
    lines += [f'[auth.openapi.{role}_token]\nbearer = "{token}"\n' for role, token in contract.tokens.items()]
    pinned = [("/api/devices/{device_id}", "GET"), ("/api/devices/{device_id}/telemetry", "GET"),
              ("/api/devices/{device_id}/rollback", "POST"), ("/api/devices/{device_id}/restart", "POST"),
              ("/api/deployments/{deployment_id}", "GET"), ("/api/deployments/{deployment_id}/abort", "POST"),
              ("/artifacts/{sha256}", "GET"), ("/artifacts/{sha256}", "HEAD"),
              ("/api/devices/{device_id}/events/{event_id}/snapshot.jpg", "GET"),
              ("/api/devices/{device_id}/events/{event_id}/clip.mjpeg", "GET"),
              ("/api/devices/{device_id}/events/{event_id}/frame.jpg", "GET"),
              ("/api/devices/{device_id}/events/{event_id}/clip.mp4", "GET"),
              ("/api/tokens/{token_id}", "DELETE")]
    known = {**contract.known, "token_id": contract.spare_token}
    for path, method in pinned:
        values = {name: value for name, value in known.items() if f"{{{name}}}" in path}
        lines += ["[[operations]]", f'include-path = "{path}"', f'include-method = "{method}"',
                  "parameters = { " + ", ".join(f'"path.{k}" = "{v}"' for k, v in values.items()) + " }", ""]
    # by name ("METHOD path"): filters of one block are OR-ed, so include-path with include-method would take in
    # every operation of that method
    lines += ["[[operations]]", f'include-name = "POST {LIVE_FRAMES}"',
              "[operations.checks.positive_data_acceptance]",
              'expected-statuses = ["2xx", "401", "403", "404", "409", "410"]', ""]
    # bodies whose validity no schema states: an import is a COCO document or a zip of YOLO files; a sample's jpeg
    # is base64 of a JPEG (the hooks send a real one where they can)
    for name in (f"POST {SAMPLES_IMPORT}", f"PUT {SAMPLE}", *CONFIG_EDITS):
        lines += ["[[operations]]", f'include-name = "{name}"', "[operations.checks.positive_data_acceptance]",
                  'expected-statuses = ["2xx", "400", "401", "403", "404", "409"]', ""]
    for path, method in LISTS_OF_DEVICES:  # their coverage cases cost more than every other operation's together
        lines += ["[[operations]]", f'include-path = "{path}"', f'include-method = "{method}"',
                  "[operations.phases.coverage]", "enabled = false", ""]
    return "\n".join(lines)


def run_fuzzer(contract: Contract, folder: Path) -> dict:
    """schemathesis run, every check, on the document as the manager serves it; its JSON report."""
    schema = folder / "openapi.json"
    schema.write_text(json.dumps(contract.document))
    config = folder / "schemathesis.toml"
    config.write_text(fuzzer_config(contract))
    report = folder / "report.json"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join((str(REPO), str(REPO / "tests"))),
           "SCHEMATHESIS_HOOKS": "support.contract_hooks"}
    done = subprocess.run(
        [sys.executable, "-m", "schemathesis.cli", "--no-color", "--config-file", str(config), "run", str(schema),
         "--url", contract.url, "--checks", "all", "--seed", str(SEED), "--max-examples", str(EXAMPLES),
         *EXCLUDED, "--workers", "1", "--request-timeout", "20", "--generation-database", "none",
         "--report", "json", "--report-json-path", str(report)],
        capture_output=True, text=True, env=env, timeout=600, cwd=folder)
    (folder / "fuzzer.log").write_text(done.stdout + done.stderr)  # every failure in full, to replay it
    assert report.is_file(), done.stdout[-3000:] + done.stderr[-3000:]
    found = json.loads(report.read_text())
    found["output"] = done.stdout[-20_000:]
    return found


def test_the_fuzzer_finds_no_mismatch_no_server_error_and_no_open_route(contract, tmp_path):
    report = run_fuzzer(contract, tmp_path)
    fuzzed = [op for op in operations(contract.document) if op[1] not in ENDLESS]
    assert report["failures"] == [] and report["errors"] == [], report["output"]
    assert not report["warnings"]["missing_auth"], report["warnings"]  # its tokens opened every route all along
    assert report["complete"] and report["stop_reason"] == "completed", report["output"]
    assert report["operations"]["tested"] == len(fuzzed) == report["operations"]["selected"], report["operations"]
    # it ran in earnest: every operation with several examples, most of them requests the manager accepted
    assert report["test_cases"]["generated"] >= 4 * len(fuzzed), report["test_cases"]
    assert {phase: report["phases"][phase]["status"] for phase in ("coverage", "fuzzing")} == \
        {"coverage": "success", "fuzzing": "success"}, report["phases"]


def test_no_route_answers_a_token_below_its_role(contract):
    """Every route the document guards: 401 without a token, 403 with each role below its own."""
    checked = 0
    for method, path, operation in operations(contract.document):
        role = role_of(operation)
        if role is None:
            assert path == "/healthz", f"{method} {path} names no token"
            continue
        filled = path.format(**PATH_VALUES)
        assert contract.call(method, filled, None) == 401, (method, path)
        for lower in ROLES[:ROLES.index(role)]:
            assert contract.call(method, filled, contract.tokens[lower]) == 403, (method, path, lower)
            checked += 1
    assert checked >= 10  # the operator's and the admin's routes, each refused to every role below


def test_what_is_not_there_is_a_declared_refusal(contract):
    """The fuzzer reads what exists (the things it is pointed at, above); what does not: each route with a path
    parameter, asked by its role about something well-formed that is not stored, answers a status it declares."""
    unknown = {**PATH_VALUES, "device_id": "contract-gone", "event_id": new_event_id(2), "pipeline": "main"}
    asked = set()
    for method, path, operation in operations(contract.document):
        role = role_of(operation)
        if "{" not in path or role is None:
            continue
        status = contract.call(method, path.format(**unknown), contract.tokens[role])
        assert str(status) in operation["responses"], (method, path, status, sorted(operation["responses"]))
        asked.add(status)
    assert 404 in asked


def test_the_live_stream_keeps_its_contract(contract):
    """The operation the fuzzer leaves out: its declared content type, its credential."""
    declared = contract.document["paths"][STREAM]["get"]["responses"]
    assert list(declared["200"]["content"]) == ["text/event-stream"] and "401" in declared
    assert contract.call("GET", STREAM, None) == 401
    host, port = contract.url.removeprefix("http://").split(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=10)
    try:
        connection.request("GET", STREAM, headers={"Authorization": f"Bearer {contract.tokens['viewer']}"})
        response = connection.getresponse()
        assert response.status == 200 and response.headers["Content-Type"].startswith("text/event-stream")
        assert response.readline() == b": connected\n"
    finally:
        connection.close()


def test_the_live_view_keeps_its_contract(contract):
    """The other operation the fuzzer leaves out: its declared content type and credential, and a first frame."""
    declared = contract.document["paths"][LIVE_VIEW]["get"]["responses"]
    assert list(declared["200"]["content"]) == ["multipart/x-mixed-replace"] and "401" in declared
    path = LIVE_VIEW.format(device_id=DEVICE, pipeline="main")
    assert contract.call("GET", path, None) == 401
    host, port = contract.url.removeprefix("http://").split(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=10)
    try:
        connection.request("GET", path, headers={"Authorization": f"Bearer {contract.tokens['viewer']}"})
        response = connection.getresponse()
        assert response.status == 200 and response.headers["Content-Type"].startswith("multipart/x-mixed-replace")
        frame = urllib.request.Request(f"{contract.url}{path}/frames", data=JPEGS[2], method="POST", headers={
            "Authorization": f"Bearer {contract.tokens['operator']}", "Content-Type": "image/jpeg"})
        with urllib.request.urlopen(frame, timeout=10) as answer:
            assert answer.status == 204  # a viewer watches
        assert response.readline().startswith(b"--")
    finally:
        connection.close()

"""A device's logs and its doctor from the fleet, with no stand-in on either side: a real agent process (its enrolled
credential, the manager's own Mosquitto) whose pipeline keeps failing on an HTTP MJPEG camera it cannot reach — the
camera's URL carries a password, and PyAV's error names the URL whole, so the agent's own log line holds the
password — and a real manager. ``edgeinfer fleet logs`` shows what the agent logged with the password masked (on the
device: the upload holds none either), ``--follow`` shows a line the agent logs after it started, ``fleet doctor``
shows the device's doctor's report, a flood of requests costs the device at most one upload a second, and a device
that does not answer (stopped) or is offline (killed) is said plainly within the bound, with exit status 3."""

from __future__ import annotations

import itertools
import json
import os
import signal
import subprocess
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass

import pytest
from support.agent import AgentProcess, write_config
from support.assets import MODELS
from support.frame_sink import FrameSink
from support.ports import free_port
from support.processes import edgeinfer_cmd, env_with_repo, wait_until

from edgeinfer._version import __version__
from edgeinfer.agent.diagnosis import BUDGET_BYTES, BUDGET_WINDOW_S, MIN_POST_INTERVAL_S
from edgeinfer.fleet.client import FleetClient
from edgeinfer.fleet.diagnosis import DOCTOR_RESEND_S, MIN_RESEND_S
from edgeinfer.fleet.manager import FleetManager, FleetSettings
from edgeinfer.link.vocabulary import Command

DEVICE = "cam-logs"
FLEET = "f"
SECRET = "S3cretCamPass"
CAMERA = f"http://viewer:{SECRET}@127.0.0.1:{free_port()}/video.mjpeg"  # nothing listens: it fails, and says so


@dataclass
class Field:
    manager: FleetManager
    agent: AgentProcess
    env: dict[str, str]  # the CLI's: the manager's URL and an operator's token
    operator: str
    viewer: str

    @property
    def url(self) -> str:
        return self.manager.http.url


@pytest.fixture(scope="module")
def field(tmp_path_factory):
    folder = tmp_path_factory.mktemp("logs")
    settings = FleetSettings(broker=None, broker_port=free_port(), http="127.0.0.1:0", data_dir=folder / "fleet")
    with FleetManager(settings) as manager:
        assert manager.wait_connected(10)
        admin = FleetClient(manager.http.url, token=manager.admin_token)
        [device] = admin.enroll_many([DEVICE], FLEET)
        operator, viewer = (admin.create_token(f"logs-{role}", role)["token"] for role in ("operator", "viewer"))
        config = write_config(
            folder / "agent.yaml", device_id=DEVICE, fleet=FLEET, broker=manager.broker_url,
            username=device["username"], password=device["password"], data_dir=str(folder / "data"),
            telemetry_interval_s=0.5, manager_url=manager.http.url, update_public_key=manager.key.public_key_b64(),
            restart_max_s=2.0,
            pipelines=[{"name": "main", "model": str(MODELS / "mobilenet_v1_0.25_128_quant.tflite"),
                        "source": CAMERA}])
        agent = AgentProcess(config, folder / "agent.log").start()
        try:
            assert wait_until(lambda: (manager.db.get_device(DEVICE) or {}).get("online"), 60, 0.2), agent.output()
            # the line that holds the password was logged, as it is, on the device's stderr
            assert wait_until(lambda: SECRET in agent.output(), 60, 0.2), agent.output()
            env = env_with_repo(EDGEINFER_FLEET_URL=manager.http.url, EDGEINFER_FLEET_TOKEN=operator)
            yield Field(manager, agent, env, operator, viewer)
        finally:
            if agent.alive():
                os.kill(agent.pid, signal.SIGCONT)
                agent.kill()


def cli(field: Field, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(edgeinfer_cmd("fleet", *args), capture_output=True, text=True, timeout=timeout,
                          env=field.env)


def get(field: Field, path: str, token: str) -> tuple[int, object]:
    request = urllib.request.Request(field.url + path, headers={"Authorization": f"Bearer {token}"})
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read() or b"null")


def test_fleet_logs_shows_what_the_agent_logged_with_its_secrets_masked(field):
    run = cli(field, "logs", DEVICE, "--json")
    assert run.returncode == 0, (run.stdout, run.stderr)
    answer = json.loads(run.stdout)
    assert answer["answered"] is True and answer["note"] is None and answer["online"] is True
    messages = [line["message"] for line in answer["lines"]]
    assert any(f"agent {__version__} started on {DEVICE}" in m for m in messages), messages
    failed = [m for m in messages if "pipeline main failed" in m]
    assert failed and all("viewer:***@127.0.0.1" in m for m in failed), failed
    assert SECRET not in run.stdout  # the agent's own line held it (see the fixture): masked on the device
    stored = field.manager.db.diagnosis.lines(DEVICE, limit=5000)
    assert stored and not any(SECRET in row["message"] for row in stored)

    # the text form, one line each; --level error keeps the errors only
    run = cli(field, "logs", DEVICE, "--level", "error", "--since", "10m")
    assert run.returncode == 0, run.stderr
    shown = run.stdout.splitlines()
    assert shown and all(" ERROR " in line for line in shown if line[:4].isdigit()), shown
    assert any("edgeinfer.agent.daemon: event pipeline_failed: pipeline main failed" in line for line in shown)
    assert SECRET not in run.stdout

    # a viewer may not read them; nor ask for them
    assert get(field, f"/api/devices/{DEVICE}/logs", field.viewer)[0] == 403
    status, body = get(field, f"/api/devices/{DEVICE}/logs", field.operator)
    assert status == 200 and SECRET not in json.dumps(body)
    # the same failure as an event (what a viewer does see) names the camera without its password either
    status, events = get(field, f"/api/events?device={DEVICE}&event=pipeline_failed", field.viewer)
    assert status == 200 and events and SECRET not in json.dumps(events)


def _interruptible() -> None:
    """Ctrl-C as a terminal gives it. Under four workers, in a suite started in the background, the follower was seen
    asleep in _follow a minute after its SIGINT (its stack, by faulthandler): a SIGINT ignored or blocked where the
    suite was started is inherited by every child, and a Python started so raises no KeyboardInterrupt."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


def test_follow_shows_a_line_the_agent_logs_after_it_started(field):
    # PYTHONFAULTHANDLER: a follower that Ctrl-C does not stop is asked for its threads' stacks (SIGABRT)
    follower = subprocess.Popen(edgeinfer_cmd("fleet", "logs", DEVICE, "--follow", "--level", "info"),
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                env={**field.env, "PYTHONFAULTHANDLER": "1"}, preexec_fn=_interruptible)
    printed: list[str] = []
    said: list[str] = []  # its stderr, read as it comes: a full pipe would stop it
    reader = threading.Thread(target=lambda: printed.extend(iter(follower.stdout.readline, "")), daemon=True)
    reader.start()
    threading.Thread(target=lambda: said.extend(iter(follower.stderr.readline, "")), daemon=True).start()
    try:
        assert wait_until(lambda: any("started on" in line for line in printed), 60, 0.2), printed
        # now the agent does something it logs: the operator restarts its pipeline
        sent = FleetClient(field.url, token=field.operator).restart(DEVICE, "main")
        done = f"command {sent['command_id']} (restart_pipeline) done"
        assert wait_until(lambda: any(done in line for line in printed), 60, 0.2), printed[-20:]
        assert not any(SECRET in line for line in printed)
    finally:
        follower.send_signal(signal.SIGINT)  # Ctrl-C: how a person stops following
        try:
            code = follower.wait(60)
        except subprocess.TimeoutExpired:
            follower.send_signal(signal.SIGABRT)
            follower.wait(15)
            time.sleep(0.5)
            pytest.fail("Ctrl-C did not stop `fleet logs --follow` within 60 s; its threads then:\n"
                        + "".join(said)[-8000:])
        assert code == 0, "".join(said)
    reader.join(5)


def test_fleet_doctor_shows_the_devices_doctors_report(field):
    local = subprocess.run(edgeinfer_cmd("doctor", "--json"), capture_output=True, text=True, timeout=120,
                           env=env_with_repo())
    expected = json.loads(local.stdout)
    run = cli(field, "doctor", DEVICE, "--json")
    assert run.returncode == (1 if expected["problems"] else 0), (run.stdout, run.stderr)
    answer = json.loads(run.stdout)
    assert answer["answered"] is True and answer["error"] is None and answer["exit_code"] == local.returncode
    assert answer["answered_command_id"] == answer["command_id"]
    report = answer["report"]  # the device's (this machine's) doctor, as `edgeinfer doctor --json` says it here
    assert report["root"] == "/" and [f["check"] for f in report["findings"]] == [
        f["check"] for f in expected["findings"]]
    run = cli(field, "doctor", DEVICE)  # within the reuse window: the same report, no second run on the device
    assert run.returncode == answer["exit_code"] == (1 if expected["problems"] else 0), run.stderr
    assert run.stdout.startswith(f"doctor on {DEVICE} (")
    assert f"{expected['findings'][0]['check']}: {expected['findings'][0]['detail']}" in run.stdout
    assert run.stdout.rstrip().endswith("found")


def test_a_flood_of_log_requests_costs_the_device_one_upload_a_second(field):
    """200 signed logs commands at once, each asking for the whole ring again, to a sink standing in for the
    manager: the device answers every one, and sends at most one upload per interval within its byte budget."""
    with FrameSink() as sink:
        url = sink.url.rsplit("/", 1)[0] + "/logs"
        started = time.monotonic()  # the device may post as soon as the first command is out
        ids = [field.manager.commands.send(DEVICE, Command.LOGS, {"url": url}) for _ in range(200)]

        def answered() -> set[str]:
            events = field.manager.db.list_events(device_id=DEVICE, kind="cmd_result", limit=1000)
            return {e["cmd_id"] for e in events if e.get("cmd_id") in ids}

        assert wait_until(lambda: answered() == set(ids), 60, 0.5), len(answered())
        time.sleep(3.0)  # what the flood still makes the device send
        elapsed = time.monotonic() - started
        posts = list(sink.posts)
    assert posts, "the device sent nothing"
    gaps = [b.at - a.at for a, b in itertools.pairwise(posts)]
    assert len(posts) <= elapsed / MIN_POST_INTERVAL_S + 2, (len(posts), elapsed, gaps)
    # arrival times jitter under load (a post held up arrives just before the next one): no three posts within
    # one interval; the count above bounds the rate
    assert all(c.at - a.at >= MIN_POST_INTERVAL_S * 0.8 for a, _, c in zip(posts, posts[1:], posts[2:])), gaps
    sent = sum(len(p.body) for p in posts)
    assert sent <= BUDGET_BYTES + elapsed * BUDGET_BYTES / BUDGET_WINDOW_S + 64 * 1024, sent
    bodies = [json.loads(p.body) for p in posts]
    assert all(b["lines"] and "Basic " in p.headers.get("Authorization", "") for b, p in zip(bodies, posts))
    assert not any(SECRET.encode() in p.body for p in posts)  # the upload itself holds no password
    # the agent goes on with everything else meanwhile
    assert field.agent.alive()


def test_a_device_that_does_not_answer_or_is_offline_is_said_plainly_within_the_bound(field):
    assert cli(field, "logs", DEVICE).returncode == 0  # answered: the manager has its lines
    stored = len(field.manager.db.diagnosis.lines(DEVICE, limit=5000))
    os.kill(field.agent.pid, signal.SIGSTOP)  # alive to the broker a while yet, answering nothing
    try:
        # The manager sends a device at most one logs request every MIN_RESEND_S (doctor: DOCTOR_RESEND_S); a
        # request within that of the last one is answered by its answer (docs/fleet.md) — the one the device gave
        # just now, before it stopped. Past both, the requests below go out to the stopped device.
        state = field.manager.db.diagnosis.state(DEVICE)
        asked = max(state["logs_requested_at"] + MIN_RESEND_S, (state["doctor_requested_at"] or 0) + DOCTOR_RESEND_S)
        assert wait_until(lambda: time.time() > asked, DOCTOR_RESEND_S + 1, 0.05)
        started = time.monotonic()
        run = cli(field, "logs", DEVICE, "--wait", "2s")
        took = time.monotonic() - started
        assert run.returncode == 3, (run.stdout, run.stderr)
        assert run.stderr.strip() == f"no answer from {DEVICE} within 2 s; showing the {stored} lines received before"
        assert len([line for line in run.stdout.splitlines() if line[:4].isdigit()]) >= stored > 0
        assert took < 30, took  # the bound, and the CLI's own start
        run = cli(field, "doctor", DEVICE, "--wait", "2s")
        assert run.returncode == 3 and run.stderr.startswith(f"no answer from {DEVICE} within 2 s"), run.stderr
    finally:
        os.kill(field.agent.pid, signal.SIGCONT)

    def caught_up() -> bool:  # the device, going again, answers what it was asked while stopped
        state = field.manager.db.diagnosis.state(DEVICE)
        return state["logs_received_at"] >= state["logs_requested_at"]

    assert wait_until(caught_up, 30, 0.2)
    field.agent.kill()  # its connection drops: the broker publishes its Last Will
    assert wait_until(lambda: not field.manager.db.get_device(DEVICE)["online"], 30, 0.2)
    stored = len(field.manager.db.diagnosis.lines(DEVICE, limit=5000))
    since = time.strftime("%H:%M:%S", time.localtime(field.manager.db.get_device(DEVICE)["last_seen"]))
    started = time.monotonic()
    run = cli(field, "logs", DEVICE, "--wait", "30s")
    assert run.returncode == 3, (run.stdout, run.stderr)
    assert time.monotonic() - started < 20  # offline: no waiting for an answer that cannot come
    assert run.stderr.strip() == f"{DEVICE} is offline since {since}; showing the {stored} lines received before"
    run = cli(field, "logs", DEVICE, "--json")
    answer = json.loads(run.stdout)
    assert run.returncode == 3 and answer["answered"] is False and answer["online"] is False
    assert answer["note"].startswith(f"{DEVICE} is offline since {since}") and len(answer["lines"]) == stored
    run = cli(field, "doctor", DEVICE)
    assert run.returncode == 3 and run.stderr.startswith(f"{DEVICE} is offline since {since}"), run.stderr
    run = cli(field, "logs", "cam-never-seen")
    assert run.returncode == 1 and "no device cam-never-seen" in run.stderr, run.stderr

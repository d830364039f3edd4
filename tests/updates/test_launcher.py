"""The agent's launcher (edgeinfer/updates/launcher.py) as a real process, copied out of the package and run with
``python -I -S`` (no site-packages: the standard library only), supervising stand-in agents: each slot's
``bin/python`` is a small script that behaves as an agent would (healthy, crashing, refusing its configuration,
hanging), and one slot is a Python whose edgeinfer cannot even be imported. A notify socket stands in for systemd's.
"""

from __future__ import annotations

import ast
import itertools
import os
import signal
import sys
import time
from pathlib import Path

import pytest
from support.agent_update import LAUNCHER, LauncherProcess, NotifySink, copy_launcher
from support.processes import wait_until as wait

from edgeinfer.updates import launcher as slots_state

#: a stand-in agent: READY=1 and WATCHDOG=1 on the notify socket it was given, its start in starts.log, a trial
#: committed once "healthy", SIGUSR1 -> exit 75 (a switch), SIGTERM -> exit 0
FAKE_AGENT = '''#!{python} -I
import os, signal, socket, sys, time
sys.path.insert(0, {updates!r})
import launcher
BEHAVIOUR = {behaviour!r}
root, slot, trial = os.environ[launcher.ROOT_ENV], os.environ[launcher.SLOT_ENV], os.environ.get(launcher.TRIAL_ENV)
with open(os.path.join(root, "starts.log"), "a") as log:
    log.write(f"{{slot}} {{trial or '-'}} {{os.getpid()}} {{' '.join(sys.argv[1:])}}\\n")

def notify(message):
    address = os.environ.get("NOTIFY_SOCKET")
    if address:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
            sock.connect(address)
            sock.sendall(message.encode())

if BEHAVIOUR == "crash":
    print("Traceback (most recent call last):", file=sys.stderr)
    print("RuntimeError: this agent is broken on purpose", file=sys.stderr)
    sys.exit(1)
if BEHAVIOUR == "config":
    print("edgeinfer: error: agent.yaml: pipelines: a key this version refuses", file=sys.stderr)
    sys.exit(78)
if BEHAVIOUR == "hang":
    time.sleep(3600)
signal.signal(signal.SIGUSR1, lambda *_: sys.exit(75))
signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
time.sleep({start_s})  # loading its models
notify("READY=1")
if trial:
    launcher.commit_trial(root, trial)
while True:
    notify("WATCHDOG=1")
    time.sleep(0.1)
'''


def fake_slot(folder: Path, behaviour: str = "healthy", start_s: float = 0.2) -> Path:
    (folder / "bin").mkdir(parents=True, exist_ok=True)
    python = folder / "bin" / "python"
    python.write_text(FAKE_AGENT.format(python=sys.executable, updates=str(LAUNCHER.parent), behaviour=behaviour,
                                        start_s=start_s))
    python.chmod(0o755)
    return folder


def unimportable_slot(folder: Path) -> Path:
    """A slot whose interpreter finds an edgeinfer that raises at import: the new version cannot even import."""
    package = folder / "site" / "edgeinfer"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text('raise ImportError("this edgeinfer cannot be imported")\n')
    (package / "__main__.py").write_text("")
    (folder / "bin").mkdir()
    python = folder / "bin" / "python"
    python.write_text(f'#!/bin/sh\nPYTHONPATH="{folder / "site"}" exec "{sys.executable}" -S "$@"\n')
    python.chmod(0o755)
    return folder


def starts(root: Path) -> list[tuple[str, str]]:
    """(slot, trial id or -) of every agent the launcher started, in order."""
    path = root / "starts.log"
    return [tuple(line.split()[:2]) for line in path.read_text().splitlines()] if path.exists() else []


def running_pid(root: Path) -> int:
    return int((root / "starts.log").read_text().splitlines()[-1].split()[2])


@pytest.fixture
def world(tmp_path):
    root = tmp_path / "agent"
    launcher = copy_launcher(tmp_path / "opt")
    sink = NotifySink(tmp_path / "systemd")
    yield root, launcher, sink
    sink.close()


def launch(world, tmp_path, slot_a: Path, **options) -> LauncherProcess:
    root, launcher, sink = world
    env = {"NOTIFY_SOCKET": sink.path, "WATCHDOG_USEC": "600000"}
    return LauncherProcess(launcher, root, slot_a, ["agent", "--config", "/etc/edgeinfer/agent.yaml"],
                           tmp_path / "launcher.log", env=env, **options).start()


def switch_to(root: Path, slot_b: Path, **about) -> str:
    """What the agent of slot a does after installing slot b: a trial, then exit 75 (here: SIGUSR1 makes it)."""
    trial = slots_state.begin_trial(root, "b", {"path": str(slot_b), "version": "9.9.9", "sha256": None},
                                    deployment_id="dep-1", cmd_id="deploy-dep-1", version=9009009,
                                    version_text="9.9.9", **about)
    os.kill(running_pid(root), signal.SIGUSR1)
    return trial


def test_the_launcher_is_the_standard_library_only():
    tree = ast.parse(LAUNCHER.read_text())
    imported = {alias.name.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.Import)
                for alias in node.names}
    imported |= {node.module.split(".")[0] for node in ast.walk(tree)
                 if isinstance(node, ast.ImportFrom) and node.module and not node.level}
    assert not [node for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.level]
    assert imported <= set(sys.stdlib_module_names) | {"__future__"}, imported - set(sys.stdlib_module_names)


def test_first_start_runs_the_provisioned_slot_and_a_switch_commits_the_new_one(world, tmp_path):
    root, _, sink = world
    slot_a, slot_b = fake_slot(tmp_path / "venv"), fake_slot(tmp_path / "b", start_s=1.5)
    with launch(world, tmp_path, slot_a) as process:
        assert wait(lambda: starts(root) == [("a", "-")], 20), process.output()
        state = slots_state.read_state(root)
        assert state["active"] == "a" and state["slots"]["a"]["path"] == str(slot_a) and state["trial"] is None
        assert (root / "starts.log").read_text().split(maxsplit=3)[3].strip() == \
            "-m edgeinfer agent --config /etc/edgeinfer/agent.yaml"
        assert wait(lambda: sink.lines("READY=1"), 10)
        trial = switch_to(root, slot_b)
        assert wait(lambda: slots_state.read_state(root)["active"] == "b", 30), process.output()
        state = slots_state.read_state(root)
        assert starts(root) == [("a", "-"), ("b", trial)]
        assert state["trial"] is None and state["outcome"]["result"] == "committed"
        assert state["outcome"]["deployment_id"] == "dep-1" and not state["outcome"]["reported"]
        time.sleep(1.0)
        assert process.alive()
    # systemd saw one start-up (READY=1 once), and its watchdog was fed through the switch: slot b took 1.5 s to
    # say READY=1, more than WatchdogSec (0.6 s here)
    assert len(sink.lines("READY=1")) == 1
    pings = sink.lines("WATCHDOG=1")
    gaps = [later - earlier for earlier, later in itertools.pairwise(pings)]
    assert pings and max(gaps) < 0.6, gaps
    assert not [line for _, line in sink.messages if line.startswith(("STOPPING", "MAINPID"))]


def test_a_trial_that_crashes_is_started_again_then_rolled_back(world, tmp_path):
    root, _, _ = world
    slot_a, slot_b = fake_slot(tmp_path / "venv"), fake_slot(tmp_path / "b", "crash")
    with launch(world, tmp_path, slot_a) as process:
        assert wait(lambda: starts(root), 20)
        trial = switch_to(root, slot_b)
        assert wait(lambda: len(starts(root)) == 4, 30), process.output()
        assert starts(root) == [("a", "-"), ("b", trial), ("b", trial), ("a", "-")]
        state = slots_state.read_state(root)
        assert state["active"] == "a" and state["trial"] is None
        outcome = state["outcome"]
        assert outcome["result"] == "failed" and outcome["deployment_id"] == "dep-1" and outcome["slot"] == "b"
        assert "exited with status 1" in outcome["reason"] and "broken on purpose" in outcome["reason"]
        assert "(2 start(s))" in outcome["reason"]
        assert process.alive()


def test_a_trial_that_cannot_even_import_is_rolled_back(world, tmp_path):
    root, _, _ = world
    slot_a, slot_b = fake_slot(tmp_path / "venv"), unimportable_slot(tmp_path / "b")
    with launch(world, tmp_path, slot_a, trial_starts=1) as process:
        assert wait(lambda: starts(root), 20)
        switch_to(root, slot_b)
        assert wait(lambda: (slots_state.read_state(root).get("outcome") or {}).get("result") == "failed", 30), \
            process.output()
        assert wait(lambda: len(starts(root)) == 2, 20)  # a again (b never got as far as writing its start)
        reason = slots_state.read_state(root)["outcome"]["reason"]
        assert "ImportError: this edgeinfer cannot be imported" in reason, reason
        assert slots_state.read_state(root)["active"] == "a" and process.alive()


def test_a_trial_that_refuses_its_configuration_is_rolled_back_at_once(world, tmp_path):
    root, _, _ = world
    slot_a, slot_b = fake_slot(tmp_path / "venv"), fake_slot(tmp_path / "b", "config")
    with launch(world, tmp_path, slot_a, trial_starts=3) as process:
        assert wait(lambda: starts(root), 20)
        trial = switch_to(root, slot_b)
        assert wait(lambda: len(starts(root)) == 3, 30), process.output()
        assert starts(root) == [("a", "-"), ("b", trial), ("a", "-")]  # no second start: 78 is final
        reason = slots_state.read_state(root)["outcome"]["reason"]
        assert "status 78" in reason and "refuses the configuration" in reason


def test_a_trial_that_never_reports_healthy_is_stopped_at_its_deadline(world, tmp_path):
    root, _, _ = world
    slot_a, slot_b = fake_slot(tmp_path / "venv"), fake_slot(tmp_path / "b", "hang")
    with launch(world, tmp_path, slot_a, trial_s=2.0) as process:
        assert wait(lambda: starts(root), 20)
        switch_to(root, slot_b)
        assert wait(lambda: len(starts(root)) == 3, 30), process.output()
        assert [slot for slot, _ in starts(root)] == ["a", "b", "a"]
        assert "no healthy report within 2 s" in slots_state.read_state(root)["outcome"]["reason"]


def test_a_power_cut_during_a_trial_uses_up_one_start(world, tmp_path):
    root, _launcher, _ = world
    slot_a, slot_b = fake_slot(tmp_path / "venv"), fake_slot(tmp_path / "b", "hang")
    with launch(world, tmp_path, slot_a) as process:
        assert wait(lambda: starts(root), 20)
        trial = switch_to(root, slot_b)
        assert wait(lambda: len(starts(root)) == 2, 20)
        process.proc.send_signal(signal.SIGKILL)  # the launcher and its agent die with the power
        process.wait(10)
        os.kill(running_pid(root), signal.SIGKILL)
    assert slots_state.read_state(root)["trial"]["starts"] == 1
    with launch(world, tmp_path, slot_a) as process:  # the next boot: the trial's second and last start
        assert wait(lambda: len(starts(root)) == 3, 20)
        assert starts(root)[-1] == ("b", trial)
        os.kill(running_pid(root), signal.SIGKILL)  # and it dies too
        assert wait(lambda: len(starts(root)) == 4, 20), process.output()
        assert starts(root)[-1] == ("a", "-")
        assert slots_state.read_state(root)["outcome"]["result"] == "failed"


def test_signals_are_passed_on_and_an_active_agent_s_exit_status_is_the_launcher_s(world, tmp_path):
    root, _, _ = world
    with launch(world, tmp_path, fake_slot(tmp_path / "venv")) as process:
        assert wait(lambda: starts(root), 20)
        assert process.terminate() == 0  # SIGTERM: the agent stops, so does the launcher
    (tmp_path / "venv" / "bin" / "python").unlink()
    fake_slot(tmp_path / "venv", "config")  # the active agent refuses its configuration: no restart loop
    process = launch(world, tmp_path, tmp_path / "venv")
    assert process.wait(30) == 78
    assert starts(root)[-1] == ("a", "-") and len(starts(root)) == 2


def test_a_damaged_state_is_said_and_not_guessed(world, tmp_path):
    root, _, _ = world
    root.mkdir()
    (root / "state.json").write_text("{not json")
    process = launch(world, tmp_path, fake_slot(tmp_path / "venv"))
    assert process.wait(30) == 1
    assert "error:" in process.output() and "not json" not in process.output() and not starts(root)
    assert (root / "state.json").read_text() == "{not json"  # left for a person to look at

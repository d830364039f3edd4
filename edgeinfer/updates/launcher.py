#!/usr/bin/env python3
"""The agent's launcher: runs the agent from one of two environment slots, and falls back to the other.

An agent update installs a new edgeinfer into the agent's *other* environment (slot ``a`` or ``b``), and the
new version must be able to fail in every way — not come up, not connect, not even import — without taking
the device with it. So what the service runs is this file: the Python standard library only, no import of
edgeinfer, copied out of the package by ``install-agent.sh`` and run by the systemd unit as a plain script::

    python3 launcher.py --root /var/lib/edgeinfer/agent --initial-slot /opt/edgeinfer/venv -- agent --config FILE

It starts ``<slot>/bin/python -m edgeinfer ARGS`` of the slot its state file names, as its child, and
supervises it:

- the child exits with :data:`SWITCH_EXIT_STATUS` after writing a *trial* into the state (an update installed
  into the other slot, or a rollback to it): the launcher starts the trial's slot;
- a trial's agent commits the trial itself once it is healthy (connected, every pipeline producing results):
  the state then names its slot active, and the launcher supervises it as any agent;
- a trial that exits before it commits is started again, up to ``--trial-starts`` starts in all (a count kept in
  the state, so a power cut during a trial uses one up); one that exits with :data:`CONFIG_EXIT_STATUS` (78: the
  new version refuses the configuration the old one ran) or does not commit within ``--trial-s`` seconds is
  ended: the state gets the outcome (``failed``, with the reason: its exit status and last line of stderr), and
  the launcher starts the active slot again, whose agent reports the outcome to the fleet;
- an active agent that exits with any other status ends the launcher with that status, so systemd's
  ``Restart=on-failure`` and ``RestartPreventExitStatus=78`` decide as they would for the agent itself;
- SIGTERM, SIGINT and SIGHUP are passed on to the child;
- systemd's notify socket is the launcher's (``NotifyAccess=main``): the child gets one of the launcher's own,
  whose ``READY=1`` (the first only), ``WATCHDOG=1`` and ``STATUS=`` are passed on; while a newly started child
  has not said ``READY=1`` yet (a switch), the launcher feeds the watchdog itself, for at most ``--trial-s``.

The state (``<root>/state.json``) and the functions that change it, under a lock (``<root>/state.lock``), are
defined here once: the launcher and the agent (edgeinfer/updates/agent_slots.py) both use them.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

STATE_FILE = "state.json"
LOCK_FILE = "state.lock"
STATE_FORMAT = 1
SLOT_NAMES = ("a", "b")
#: the agent's exit status that asks its launcher to start the slot the state names now: sysexits' EX_TEMPFAIL
SWITCH_EXIT_STATUS = 75
#: the agent's exit status for a configuration error (sysexits' EX_CONFIG): restarting cannot fix it
CONFIG_EXIT_STATUS = 78
#: what the launcher tells its child: the state's folder, the slot it runs from, the trial it is (if any)
ROOT_ENV = "EDGEINFER_AGENT_SLOTS"
SLOT_ENV = "EDGEINFER_AGENT_SLOT"
TRIAL_ENV = "EDGEINFER_AGENT_TRIAL"
DEFAULT_TRIAL_S = 300.0
DEFAULT_TRIAL_STARTS = 2
#: an outcome's result words (the agent reports them as the deployment's target states)
COMMITTED, FAILED = "committed", "failed"
#: the lines of a child's stderr kept for a failed trial's reason
STDERR_TAIL = 20
PREFIX = "edgeinfer-launcher: "


# ------------------------------------------------------------------------------------------ the state

def empty_state() -> dict[str, Any]:
    return {"format": STATE_FORMAT, "active": None, "slots": {}, "trial": None, "outcome": None}


def read_state(root: str | os.PathLike) -> dict[str, Any]:
    """The state as written last (empty when there is none). It is only ever replaced whole, so a reader never
    sees half of one; a file that does not parse is disk damage: ValueError."""
    try:
        text = (Path(root) / STATE_FILE).read_text()
    except FileNotFoundError:
        return empty_state()
    state = json.loads(text)
    if not isinstance(state, dict) or state.get("format") != STATE_FORMAT:
        raise ValueError(f"{Path(root) / STATE_FILE} is not a slot state of format {STATE_FORMAT}")
    return state


def write_state(root: str | os.PathLike, state: dict[str, Any]) -> None:
    """Replace the state atomically: a temporary file beside it, fsynced, renamed over it, the folder fsynced.
    The same steps as edgeinfer/_fs.py's atomic write, repeated here because this file must not import edgeinfer."""
    folder = Path(root)
    final = folder / STATE_FILE
    temporary = folder / f".{STATE_FILE}.{os.getpid()}.{uuid.uuid4().hex[:8]}"
    try:
        with open(temporary, "w") as handle:
            handle.write(json.dumps(state, indent=1, sort_keys=True) + "\n")
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, final)
    finally:
        with contextlib.suppress(FileNotFoundError):
            temporary.unlink()
    directory = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)


@contextlib.contextmanager
def locked(root: str | os.PathLike) -> Iterator[dict[str, Any]]:
    """The state, read under the slots' lock and written back when the block changed it (not when it raised)."""
    folder = Path(root)
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / LOCK_FILE, "a+") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        state = read_state(folder)
        before = json.dumps(state, sort_keys=True)
        yield state
        if json.dumps(state, sort_keys=True) != before:
            write_state(folder, state)


def other_slot(slot: str) -> str:
    return SLOT_NAMES[1 - SLOT_NAMES.index(slot)]


def slot_python(record: dict[str, Any]) -> Path:
    """The interpreter of a slot (a venv): ``<path>/bin/python``."""
    return Path(record["path"]) / "bin" / "python"


def begin_trial(root: str | os.PathLike, slot: str, record: dict[str, Any] | None, **about: Any) -> str:
    """Record ``slot`` (its ``record`` when given: a new install) as the slot to try next; its trial id.

    ``about``: what the agent reports of the outcome (deployment_id, cmd_id, version, version_text, sha256);
    ValueError when ``slot`` is the active one or has nothing installed."""
    with locked(root) as state:
        if slot == state.get("active"):
            raise ValueError(f"slot {slot} is the active one")
        if record is not None:
            state["slots"][slot] = record
        if not state["slots"].get(slot):
            raise ValueError(f"slot {slot} has nothing installed")
        trial_id = uuid.uuid4().hex
        state["trial"] = {"id": trial_id, "slot": slot, "from": state.get("active"), "starts": 0, "last_exit": None,
                          "requested_at": round(time.time(), 3), **about}
        return trial_id


def forget_slot(root: str | os.PathLike, slot: str) -> None:
    """Mark ``slot`` empty before an install overwrites it (never the active one, nor one on trial)."""
    with locked(root) as state:
        trial = state.get("trial") or {}
        if slot == state.get("active") or slot == trial.get("slot"):
            raise ValueError(f"slot {slot} is in use")
        state["slots"][slot] = None


def commit_trial(root: str | os.PathLike, trial_id: str) -> dict[str, Any] | None:
    """The trial's slot becomes the active one: its outcome (``committed``, not yet reported), or None when the
    trial is no longer open (the launcher ended it: it is about to stop this agent)."""
    with locked(root) as state:
        trial = state.get("trial")
        if not trial or trial.get("id") != trial_id:
            return None
        state["active"] = trial["slot"]
        state["trial"] = None
        state["outcome"] = _outcome(trial, COMMITTED, None)
        return state["outcome"]


def fail_trial(state: dict[str, Any], reason: str) -> dict[str, Any]:
    """End the open trial of ``state`` (under the lock): the active slot stays, the outcome says why."""
    trial = state["trial"]
    state["trial"] = None
    state["outcome"] = _outcome(trial, FAILED, reason)
    return state["outcome"]


def _outcome(trial: dict[str, Any], result: str, reason: str | None) -> dict[str, Any]:
    kept = {k: v for k, v in trial.items() if k not in ("id", "starts", "last_exit")}
    return {**kept, "trial": trial["id"], "result": result, "reason": reason, "at": round(time.time(), 3),
            "reported": False}


def mark_reported(root: str | os.PathLike, trial_id: str) -> None:
    """The outcome of trial ``trial_id`` has been reported (spooled for the fleet)."""
    with locked(root) as state:
        outcome = state.get("outcome")
        if outcome and outcome.get("trial") == trial_id:
            outcome["reported"] = True


def note_version(root: str | os.PathLike, slot: str, version: str) -> None:
    """The version of edgeinfer ``slot`` runs, as the agent in it says (the launcher cannot know it)."""
    with locked(root) as state:
        record = state["slots"].get(slot)
        if record is not None and record.get("version") != version:
            record["version"] = version


# ------------------------------------------------------------------------------------------ the launcher

def log(message: str) -> None:
    print(PREFIX + message, file=sys.stderr, flush=True)


class NotifyRelay:
    """systemd's notify socket, between systemd and the agent: the child gets a socket of the launcher's own.

    ``READY=1`` goes up once (the service is ready once; a switch is not a new start-up), ``WATCHDOG=1`` and
    ``STATUS=`` go up as they come, ``STOPPING=1`` and ``MAINPID=`` stay here (the launcher is the main process
    and decides when the service stops). :meth:`keep_alive` feeds the watchdog while a new child starts.
    """

    def __init__(self, upstream: str | None, watchdog_s: float | None) -> None:
        self.upstream = upstream
        self.watchdog_s = watchdog_s
        self.ready_sent = False
        self.child_ready = False
        self._next_ping = 0.0
        self._socket: Any = None
        self._folder: str | None = None
        self.path: str | None = None
        self._failing = False  # said once, not at every watchdog ping

    @classmethod
    def from_environment(cls) -> NotifyRelay:
        upstream = os.environ.get("NOTIFY_SOCKET") or None
        usec, pid = os.environ.get("WATCHDOG_USEC"), os.environ.get("WATCHDOG_PID")
        watchdog = None
        if usec and usec.isdigit() and int(usec) > 0 and (not pid or pid == str(os.getpid())):
            watchdog = max(0.05, int(usec) / 1e6 / 2)
        return cls(upstream, watchdog)

    def start(self) -> NotifyRelay:
        if self.upstream is None:
            return self
        import socket
        import tempfile
        import threading

        self._folder = tempfile.mkdtemp(prefix="edgeinfer-launcher-")  # 0700: only this user may send
        self.path = os.path.join(self._folder, "notify")
        self._socket = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self._socket.bind(self.path)
        threading.Thread(target=self._relay, name="notify-relay", daemon=True).start()
        return self

    def child_environment(self, environ: dict[str, str]) -> dict[str, str]:
        env = {k: v for k, v in environ.items() if k not in ("NOTIFY_SOCKET", "WATCHDOG_PID")}
        if self.path is not None:
            env["NOTIFY_SOCKET"] = self.path
        return env

    def child_started(self) -> None:
        self.child_ready = False

    def send(self, message: str) -> None:
        if self.upstream is None:
            return
        import socket

        address = "\0" + self.upstream[1:] if self.upstream.startswith("@") else self.upstream
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
                sock.connect(address)
                sock.sendall(message.encode())
            self._failing = False
        except OSError as exc:
            if not self._failing:
                log(f"cannot notify systemd ({message}): {exc}")
            self._failing = True

    def keep_alive(self, now: float, *, always: bool = False) -> None:
        """Feed the watchdog for a child that has not said READY=1 yet, or ``always`` (the launcher stopping a
        child); the caller bounds how long."""
        if self.watchdog_s is not None and (always or not self.child_ready) and now >= self._next_ping:
            self._next_ping = now + self.watchdog_s
            self.send("WATCHDOG=1")

    def _relay(self) -> None:
        while True:
            try:
                data = self._socket.recv(4096)
            except OSError:
                return
            for line in data.decode("utf-8", "replace").splitlines():
                if line == "READY=1":
                    self.child_ready = True
                    if not self.ready_sent:
                        self.ready_sent = True
                        self.send(line)
                elif line.startswith(("WATCHDOG=", "STATUS=")):
                    self.send(line)

    def close(self) -> None:
        if self._socket is not None:
            self._socket.close()
        if self._folder is not None:
            import shutil

            shutil.rmtree(self._folder, ignore_errors=True)


class Launcher:
    """Runs the agent from the state's slot; starts a trial, ends a failed one, passes signals on."""

    def __init__(self, root: str | os.PathLike, *, initial_slot: str, child_args: list[str],
                 trial_s: float = DEFAULT_TRIAL_S, trial_starts: int = DEFAULT_TRIAL_STARTS) -> None:
        self.root = Path(root)
        self.initial_slot = initial_slot
        self.child_args = child_args
        self.trial_s = trial_s
        self.trial_starts = trial_starts
        self.relay = NotifyRelay.from_environment()
        self._child: Any = None
        self._stopping = False
        self._tail: list[str] = []

    # -- the loop ----------------------------------------------------------------------------------------
    def run(self) -> int:
        import signal

        for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(signum, self._on_signal)
        self.relay.start()
        try:
            while not self._stopping:
                slot, record, trial = self._choose()
                if record is None:
                    return 1
                status = self._supervise(slot, record, trial)
                if status is None or (status == SWITCH_EXIT_STATUS and not self._stopping):
                    continue  # a trial ended, or the agent asked for the slot the state names now
                return status
            return 0
        finally:
            self.relay.close()

    def _choose(self) -> tuple[str, dict[str, Any] | None, dict[str, Any] | None]:
        """The slot to run now, its record and its trial (None: the active slot). Counts a trial's start."""
        with locked(self.root) as state:
            if state.get("active") is None:  # the first start: the provisioned environment is slot a
                state["slots"] = {"a": {"path": self.initial_slot, "version": None, "sha256": None}, "b": None}
                state["active"] = "a"
                log(f"first start: slot a is {self.initial_slot}")
            trial = state.get("trial")
            if trial is not None:
                record = state["slots"].get(trial["slot"])
                if record is None or not slot_python(record).exists():
                    fail_trial(state, f"slot {trial['slot']} has no interpreter")
                elif trial["starts"] >= self.trial_starts:
                    reason = trial.get("last_exit") or "it did not report healthy"
                    log(f"trial of slot {trial['slot']} failed after {trial['starts']} start(s): {reason}")
                    fail_trial(state, f"{reason} ({trial['starts']} start(s))")
                else:
                    trial["starts"] += 1
                    return trial["slot"], record, dict(trial)
            slot = state["active"]
            record = state["slots"].get(slot)
            if record is None or not slot_python(record).exists():
                log(f"the active slot {slot} has no interpreter ({record and record.get('path')}): cannot start")
                return slot, None, None
            return slot, record, None

    def _supervise(self, slot: str, record: dict[str, Any], trial: dict[str, Any] | None) -> int | None:
        """Run one child until it exits: its exit status, or None when a trial of it ended (started again or
        given up: the state says which slot is next)."""
        import subprocess

        child = self._start(slot, record, trial)
        started = time.monotonic()
        while True:
            try:
                status = child.wait(timeout=0.2)
            except subprocess.TimeoutExpired:
                status = None
            now = time.monotonic()
            if now - started < self.trial_s:  # a switch: feed systemd's watchdog until the child says it is ready
                self.relay.keep_alive(now)
            if status is not None:
                self._child = None
                if status < 0:
                    status = 128 - status  # killed by a signal: as a shell reports it
                if trial is not None and self._trial_open(trial):
                    self._trial_exited(trial, status)
                    return None
                return status
            if trial is not None and not self._trial_open(trial):
                log(f"slot {slot} reported healthy: it is the active slot")
                trial = None
            elif trial is not None and now - started > self.trial_s and self._give_up(
                    trial, f"no healthy report within {self.trial_s:.0f} s"):
                self._stop(child)
                return None

    def _start(self, slot: str, record: dict[str, Any], trial: dict[str, Any] | None) -> Any:
        import subprocess
        import threading

        env = self.relay.child_environment(dict(os.environ))
        env.update({ROOT_ENV: str(self.root), SLOT_ENV: slot})
        env.pop(TRIAL_ENV, None)
        if trial is not None:
            env[TRIAL_ENV] = trial["id"]
        command = [str(slot_python(record)), "-m", "edgeinfer", *self.child_args]
        what = f"trial {trial['starts']}/{self.trial_starts} of slot {slot}" if trial else f"slot {slot}"
        log(f"starting {what} ({record.get('version') or 'version not known yet'}): {' '.join(command)}")
        self._tail = []
        self.relay.child_started()
        child = subprocess.Popen(command, env=env, stderr=subprocess.PIPE)
        self._child = child
        threading.Thread(target=self._pass_stderr, args=(child,), name="child-stderr", daemon=True).start()
        return child

    def _pass_stderr(self, child: Any) -> None:
        """The child's stderr to ours (the journal), its last lines kept for a failed trial's reason."""
        for raw in iter(child.stderr.readline, b""):
            with contextlib.suppress(OSError, ValueError):
                sys.stderr.buffer.write(raw)
                sys.stderr.buffer.flush()
            line = raw.decode("utf-8", "replace").strip()
            if line:
                self._tail = [*self._tail[-(STDERR_TAIL - 1):], line]

    # -- trials ------------------------------------------------------------------------------------------
    def _trial_open(self, trial: dict[str, Any]) -> bool:
        try:
            current = read_state(self.root).get("trial")
        except (OSError, ValueError):
            return True
        return bool(current) and current.get("id") == trial["id"]

    def _trial_exited(self, trial: dict[str, Any], status: int) -> None:
        """A trial's child exited before it reported healthy: give up at once on a configuration error, else
        record why (the next start, or the end of the trial, says it)."""
        time.sleep(0.05)  # the stderr thread's last lines
        last = self._tail[-1] if self._tail else ""
        reason = f"the new agent exited with status {status} before it reported healthy" + (f": {last}" if last else "")
        log(f"trial of slot {trial['slot']}: {reason}")
        if status == CONFIG_EXIT_STATUS:
            self._give_up(trial, reason + " (it refuses the configuration)")
            return
        with locked(self.root) as state:
            current = state.get("trial")
            if current and current.get("id") == trial["id"]:
                current["last_exit"] = reason

    def _give_up(self, trial: dict[str, Any], reason: str) -> bool:
        """End the trial (unless its agent committed it meanwhile): True when it was ended."""
        with locked(self.root) as state:
            current = state.get("trial")
            if not current or current.get("id") != trial["id"]:
                return False
            fail_trial(state, reason)
        log(f"trial of slot {trial['slot']} ended: {reason}; back to slot {trial.get('from')}")
        return True

    # -- signals -----------------------------------------------------------------------------------------
    def _on_signal(self, signum: int, _frame: Any) -> None:
        self._stopping = True
        child = self._child
        if child is not None and child.poll() is None:
            with contextlib.suppress(OSError):
                child.send_signal(signum)

    def _stop(self, child: Any, grace_s: float = 20.0) -> None:
        """SIGTERM, then SIGKILL after ``grace_s``; the watchdog fed meanwhile (the launcher is working)."""
        import signal
        import subprocess

        with contextlib.suppress(OSError):
            child.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        while True:
            try:
                child.wait(timeout=0.2)
                break
            except subprocess.TimeoutExpired:
                self.relay.keep_alive(time.monotonic(), always=True)
                if time.monotonic() > deadline:
                    child.kill()
                    child.wait()
                    break
        self._child = None


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="launcher.py", description=__doc__.splitlines()[0])
    parser.add_argument("--root", required=True, help="the slots' folder: state.json, slots/a, slots/b")
    parser.add_argument("--initial-slot", required=True, help="the provisioned venv: slot a at the first start")
    parser.add_argument("--trial-s", type=float, default=DEFAULT_TRIAL_S,
                        help="seconds a new version has to report healthy (default %(default)s)")
    parser.add_argument("--trial-starts", type=int, default=DEFAULT_TRIAL_STARTS,
                        help="starts a new version gets before the launcher goes back (default %(default)s)")
    parser.add_argument("args", nargs=argparse.REMAINDER, help="-- then the arguments of `python -m edgeinfer`")
    options = parser.parse_args(argv)
    args = options.args[1:] if options.args[:1] == ["--"] else options.args
    if not args:
        parser.error("give the agent's arguments after --, e.g. -- agent --config /etc/edgeinfer/agent.yaml")
    if options.trial_s <= 0 or options.trial_starts < 1:
        parser.error("--trial-s must be above 0 and --trial-starts at least 1")
    launcher = Launcher(options.root, initial_slot=options.initial_slot, child_args=args, trial_s=options.trial_s,
                        trial_starts=options.trial_starts)
    try:
        return launcher.run()
    except ValueError as exc:  # a state that does not parse: disk damage, a person has to look
        log(f"error: {exc}")
        return 1


if __name__ == "__main__":
    sys.exit(main())

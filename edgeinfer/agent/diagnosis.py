"""Diagnosis from afar: the ``logs`` and ``doctor`` commands.

``logs`` (signed): POST the ring's lines (agent/log_ring.py) after ``args.after`` (the newest line the manager
has of this boot, ``args.boot_id``) to ``args.url`` with the device's credential (:class:`~.uploads.DeviceHTTP`),
in batches of at most ``MAX_UPLOAD_LINES`` lines and ``MAX_UPLOAD_BYTES`` bytes; with ``args.until`` (at most
``MAX_AHEAD_S`` ahead) it goes on sending new lines as they come until then — the manager repeats the command
while someone follows. One thread (``edgeinfer-logs``, started at the first request) does the sending, so a
request never holds up the command thread, and it is **rate-bounded whatever is asked**: requests coalesce into
the one target (a repeat only moves its cursor and ``until``), one POST per :data:`MIN_POST_INTERVAL_S` at most,
and a byte budget (:data:`BUDGET_BYTES` a :data:`BUDGET_WINDOW_S`, a token bucket) that a flood of requests
cannot raise: past it the lines wait in the ring.

``doctor`` (signed): run ``python -m edgeinfer doctor --json`` in a subprocess — a crash or hang in it costs the
agent nothing; it is killed after :data:`DOCTOR_TIMEOUT_S` — and POST its report (redacted, at most
``MAX_REPORT_BYTES``) to ``args.url``. One run at a time: a request while one runs gets that run's report; a
request within :data:`DOCTOR_REUSE_S` of the last report gets that report again without a new run.

Nothing here logs above ``debug``: a line about sending lines would be a line to send.
"""

from __future__ import annotations

import json
import logging
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .._redact import redact, redact_values
from ..errors import CommandRejected
from ..link.logs import MAX_REPORT_BYTES, MAX_UPLOAD_BYTES, MAX_UPLOAD_LINES
from ..link.vocabulary import Command
from .log_ring import LogRing
from .uploads import DeviceHTTP

if TYPE_CHECKING:
    from .commands import CommandContext, CommandRouter
    from .services import AgentServices

log = logging.getLogger(__name__)

#: at most one POST of lines this often, and this many bytes a window (a token bucket: the ring twice over
#: at once, then the window's rate)
MIN_POST_INTERVAL_S = 1.0
BUDGET_BYTES = 512 * 1024
BUDGET_WINDOW_S = 60.0
#: the text of one batch, at most (its JSON is cut again to MAX_UPLOAD_BYTES)
BATCH_BYTES = 64 * 1024
#: ``until`` at most this far ahead (the manager moves it ~30 s on every ~10 s while someone follows)
MAX_AHEAD_S = 300.0
POST_TIMEOUT_S = 10.0
#: failed POSTs (network, 5xx) before a request is given up; the wait doubles after each
MAX_FAILURES = 5
DOCTOR_TIMEOUT_S = 60.0
DOCTOR_REUSE_S = 10.0
DOCTOR_COMMAND = (sys.executable, "-m", "edgeinfer", "doctor", "--json")

URL_SCHEMA = {"type": "string", "pattern": "^https?://[^\\s]+$", "maxLength": 2048}
LOGS_ARGS_SCHEMA = {
    "type": "object", "required": ["url"], "additionalProperties": False,
    "properties": {
        "url": URL_SCHEMA,
        "boot_id": {"type": "string", "pattern": "^[0-9a-f]{32}$"},
        "after": {"type": "integer", "minimum": 0},
        "until": {"type": "number", "minimum": 0},
    },
}
DOCTOR_ARGS_SCHEMA = {"type": "object", "required": ["url"], "additionalProperties": False,
                      "properties": {"url": URL_SCHEMA}}


@dataclass
class _Target:
    """Where the lines go, the newest line sent there, and what is still owed: the lines up to the newest
    (``snapshot``), and new lines until ``until`` (a wall-clock time; None: not following)."""

    url: str
    command_id: str
    cursor: int
    snapshot: bool
    until: float | None = None
    failures: int = 0

    def owes(self, newest: int, now: float) -> bool:
        return self.snapshot or (self.until is not None and now < self.until and newest > self.cursor)


class TokenBucket:
    """``capacity`` bytes, refilled at ``capacity / window_s`` a second."""

    def __init__(self, capacity: float, window_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.capacity, self.rate, self._clock = capacity, capacity / window_s, clock
        self._tokens, self._at = capacity, clock()

    def available(self) -> float:
        now = self._clock()
        self._tokens, self._at = min(self.capacity, self._tokens + (now - self._at) * self.rate), now
        return self._tokens

    def wait_for(self, amount: float) -> float:
        """Seconds until ``amount`` bytes are available."""
        return max(0.0, (min(amount, self.capacity) - self.available()) / self.rate)

    def spend(self, amount: float) -> None:
        self.available()
        self._tokens -= amount


class LogSender:
    """The ``logs`` command: the ring's lines to the fleet manager, on request only, rate-bounded."""

    def __init__(self, agent: AgentServices, http: DeviceHTTP, ring: LogRing, *,
                 min_interval_s: float = MIN_POST_INTERVAL_S, budget_bytes: int = BUDGET_BYTES,
                 budget_window_s: float = BUDGET_WINDOW_S) -> None:
        self._agent, self._http, self.ring = agent, http, ring
        self.min_interval_s = min_interval_s
        self.budget = TokenBucket(budget_bytes, budget_window_s)
        self._target: _Target | None = None
        self._wake = threading.Condition()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._last_post = -float("inf")
        #: POSTs answered, bytes sent, requests that joined one already under way
        self.posts = self.sent_bytes = self.coalesced = 0

    def register(self, router: CommandRouter) -> None:
        router.register(Command.LOGS, self.handle, args_schema=LOGS_ARGS_SCHEMA,
                        description="send the agent's recent log lines to the fleet manager (and follow them)")

    def handle(self, args: Mapping[str, Any], ctx: CommandContext) -> dict[str, Any]:
        until = args.get("until")
        now = time.time()
        if until is not None and until <= now:
            raise CommandRejected("until_passed", f"until {until} has passed")
        if until is not None and until > now + MAX_AHEAD_S:
            raise CommandRejected("until_too_far", f"until is more than {MAX_AHEAD_S:.0f} s ahead")
        boot_id = ctx.agent.boot.boot_id
        after = int(args.get("after", 0)) if args.get("boot_id") == boot_id else 0
        with self._wake:
            target = self._target
            joined = False
            if target is not None and target.url == args["url"]:  # a repeat: the same target, never a second one
                joined = target.owes(self.ring.newest_seq, now)
                self.coalesced += joined
                target.command_id = ctx.command_id
                # a follower's renewal keeps the cursor it has reached; anything else sends from what the manager has
                if until is None or target.until is None or target.until <= now:
                    target.snapshot, target.cursor = True, min(target.cursor, after)
                if until is not None:
                    target.until = max(target.until or 0.0, float(until))
            else:
                self._target = _Target(args["url"], ctx.command_id, after, snapshot=True,
                                       until=None if until is None else float(until))
            self._wake.notify_all()
        self._start()
        return {"boot_id": boot_id, "newest_seq": self.ring.newest_seq, "lines": len(self.ring),
                "follow_until": until, "coalesced": joined}

    # -- the thread ---------------------------------------------------------------------------------
    def _start(self) -> None:
        with self._wake:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="edgeinfer-logs", daemon=True)
                self._thread.start()

    def close(self, timeout: float = 2.0) -> None:
        """Stop sending (a POST under way ends by its own timeout; the agent does not wait for it)."""
        self._stop.set()
        with self._wake:
            self._wake.notify_all()
            thread = self._thread
        if thread is not None:
            thread.join(timeout)

    def _owed(self) -> _Target | None:
        """The target owed lines now; waits a little for one (None: nothing yet, look again)."""
        with self._wake:
            target, now = self._target, time.time()
            if target is not None and target.owes(self.ring.newest_seq, now):
                return target
            if target is not None and (target.until is None or now >= target.until):
                self._target = target = None  # done: nothing owed, nobody follows
            if target is None:
                self._wake.wait(1.0)
                return None
            cursor = target.cursor
        self.ring.wait_newer(cursor, 1.0)  # following: wake up for the next line
        return None

    def _run(self) -> None:
        while not self._stop.is_set():
            target = self._owed()
            if target is None:
                continue
            # the bounds: one POST an interval, and a budget no request can raise
            pause = max(self._last_post + self.min_interval_s - time.monotonic(), self.budget.wait_for(4096))
            if pause > 0:
                self._stop.wait(pause)
                continue
            with self._wake:
                cursor, command_id = target.cursor, target.command_id
            lines, more = self.ring.after(cursor, max_lines=MAX_UPLOAD_LINES,
                                          max_bytes=int(min(BATCH_BYTES, self.budget.available())))
            body = self._body(lines, more, command_id)
            self._last_post = time.monotonic()
            outcome = self._post(target.url, body)
            self.budget.spend(len(body))
            with self._wake:
                self._settle(target, outcome, lines, more)

    def _body(self, lines: list[dict[str, Any]], more: bool, command_id: str) -> bytes:
        """The upload's JSON, cut (from its newest lines) to MAX_UPLOAD_BYTES."""
        while True:
            body = json.dumps({"boot_id": self._agent.boot.boot_id, "command_id": command_id, "lines": lines,
                               "dropped": self.ring.evicted, "complete": not more},
                              ensure_ascii=False, separators=(",", ":")).encode("utf-8")
            if len(body) <= MAX_UPLOAD_BYTES or len(lines) <= 1:
                return body
            lines, more = lines[: len(lines) // 2], True

    def _post(self, url: str, body: bytes) -> str:
        """ok, retry (the network, a busy manager) or refused."""
        import http.client
        import urllib.error

        try:
            self._http.send("POST", url, body, {"Content-Type": "application/json"}, timeout=POST_TIMEOUT_S)
        except urllib.error.HTTPError as exc:
            log.debug("log lines to %s: HTTP %s", url, exc.code)
            return "retry" if exc.code >= 500 or exc.code in (408, 429) else "refused"
        except (OSError, http.client.HTTPException) as exc:
            log.debug("log lines to %s not sent: %s", url, exc)
            return "retry"
        self.posts += 1
        self.sent_bytes += len(body)
        return "ok"

    def _settle(self, target: _Target, outcome: str, lines: Sequence[dict[str, Any]], more: bool) -> None:
        if target is not self._target:
            return  # replaced meanwhile: the new one starts from its own cursor
        if outcome == "ok":
            target.failures = 0
            if lines:
                target.cursor = max(target.cursor, int(lines[-1]["seq"]))
            if not more:
                target.snapshot = False
            return
        target.failures += 1
        if outcome == "refused" or target.failures >= MAX_FAILURES:
            self._target = None  # the manager does not want them (or cannot be reached): the next request asks anew
            return
        self._last_post += self.min_interval_s * (2 ** target.failures - 1)  # back off


class DoctorRunner:
    """The ``doctor`` command: ``edgeinfer doctor --json`` in a subprocess, its report POSTed to the manager."""

    def __init__(self, http: DeviceHTTP, *, command: Sequence[str] = DOCTOR_COMMAND,
                 timeout_s: float = DOCTOR_TIMEOUT_S, reuse_s: float = DOCTOR_REUSE_S) -> None:
        self._http = http
        self.command, self.timeout_s, self.reuse_s = tuple(command), timeout_s, reuse_s
        self._lock = threading.Lock()
        self._running = False
        self._url = self._command_id = ""
        self._last: tuple[float, dict[str, Any]] | None = None
        self._thread: threading.Thread | None = None
        #: the doctor's runs, and the reports sent
        self.runs = self.sent = 0

    def register(self, router: CommandRouter) -> None:
        router.register(Command.DOCTOR, self.handle, args_schema=DOCTOR_ARGS_SCHEMA,
                        description="run `edgeinfer doctor` and send its report to the fleet manager")

    def handle(self, args: Mapping[str, Any], ctx: CommandContext) -> dict[str, Any]:
        with self._lock:
            self._url, self._command_id = str(args["url"]), ctx.command_id
            if self._running:
                return {"running": True, "coalesced": True}
            self._running = True
            reuse = self._last is not None and time.monotonic() - self._last[0] < self.reuse_s
            self._thread = threading.Thread(target=self._run, args=(reuse,), name="edgeinfer-doctor", daemon=True)
            self._thread.start()
        return {"running": True, "coalesced": False, "cached": reuse, "timeout_s": self.timeout_s}

    def _run(self, reuse: bool) -> None:
        try:
            if reuse and self._last is not None:
                result = self._last[1]
            else:
                result = self.diagnose()
                self._last = (time.monotonic(), result)
        finally:
            with self._lock:
                self._running = False
                url, command_id = self._url, self._command_id
        self._send(url, {**result, "command_id": command_id})

    def diagnose(self) -> dict[str, Any]:
        """Run the doctor once: its exit code, its report (redacted) or why there is none, and how long it took."""
        import subprocess  # here: an agent never asked for its doctor loads neither
        import tempfile

        self.runs += 1
        started, code, error, report = time.monotonic(), None, None, None
        with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
            try:
                code = subprocess.run(self.command, stdin=subprocess.DEVNULL, stdout=out, stderr=err,
                                      timeout=self.timeout_s, check=False).returncode
            except subprocess.TimeoutExpired:
                error = f"the doctor did not finish within {self.timeout_s:.0f} s (killed)"
            except OSError as exc:
                error = f"cannot run the doctor: {exc}"
            out.seek(0)
            text = out.read(MAX_REPORT_BYTES // 2 + 1)
            err.seek(max(0, err.seek(0, 2) - 2000))
            stderr = err.read().decode("utf-8", "replace").strip()
        if error is None:
            try:
                report = json.loads(text) if len(text) <= MAX_REPORT_BYTES // 2 else None
            except ValueError:
                report = None
            if not isinstance(report, dict):
                report = None
                error = f"the doctor exited {code} without a JSON report" + (f": {stderr}" if stderr else "")
        return {"exit_code": code, "duration_s": round(time.monotonic() - started, 3), "ran_at": round(time.time(), 3),
                "report": redact_values(report), "error": redact(error)[:4000] if error else None}

    def _send(self, url: str, body: dict[str, Any]) -> None:
        import http.client
        import urllib.error

        data = json.dumps(body).encode("utf-8")
        for attempt in range(3):
            try:
                self._http.send("POST", url, data, {"Content-Type": "application/json"}, timeout=POST_TIMEOUT_S)
            except urllib.error.HTTPError as exc:
                log.debug("doctor report to %s: HTTP %s", url, exc.code)
                if exc.code < 500 and exc.code not in (408, 429):
                    return
            except (OSError, http.client.HTTPException) as exc:
                log.debug("doctor report to %s not sent: %s", url, exc)
            else:
                self.sent += 1
                return
            time.sleep(2.0 * (attempt + 1))

    def close(self, timeout: float = 1.0) -> None:
        """The doctor's subprocess ends by its own timeout; the agent does not wait for it."""
        thread = self._thread
        if thread is not None:
            thread.join(timeout)


class Diagnosis:
    """The agent's ``logs`` and ``doctor`` commands, closed with the agent."""

    def __init__(self, logs: LogSender, doctor: DoctorRunner) -> None:
        self.logs, self.doctor = logs, doctor

    def close(self) -> None:
        self.logs.close()
        self.doctor.close()


def add_diagnosis_commands(agent: AgentServices, router: CommandRouter, config: Any,
                           ring: LogRing | None = None) -> Diagnosis:
    """Register ``logs`` (the lines of ``ring``; none given: an empty ring) and ``doctor``."""
    http = DeviceHTTP.of(config)
    diagnosis = Diagnosis(LogSender(agent, http, ring if ring is not None else LogRing()), DoctorRunner(http))
    diagnosis.logs.register(router)
    diagnosis.doctor.register(router)
    return diagnosis

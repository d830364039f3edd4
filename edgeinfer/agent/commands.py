"""Inbound commands: validated, de-duplicated by id, dispatched to registered handlers, answered.

Inbound ``cmd`` messages go to :class:`CommandRouter` in its own thread (``edgeinfer-commands``):
each is validated, de-duplicated by id (the :class:`CommandLog` survives restarts), dispatched to a
handler, and answered with a ``cmd_result`` or ``cmd_rejected`` event. Handlers register with
:meth:`CommandRouter.register`; the agent ships ``ping`` and ``restart_pipeline``
(:func:`register_builtin_commands`), and model updates plug in the same way. A handler gets the
agent's :class:`~.services.AgentServices` as ``ctx.agent``.
"""

from __future__ import annotations

import json
import logging
import queue
import sqlite3
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import EdgeInferError, ProtocolError
from ..link.protocol import decode, schema_errors
from .services import AgentServices

log = logging.getLogger(__name__)

#: how many command ids the command log remembers (for de-duplication across restarts)
COMMAND_LOG_SIZE = 1000


@dataclass(frozen=True)
class CommandContext:
    """What a command handler gets besides its arguments."""

    agent: AgentServices
    command_id: str
    message: Mapping[str, Any]


Handler = Callable[[Mapping[str, Any], CommandContext], Any]


@dataclass(frozen=True)
class _Registered:
    handler: Handler
    args_schema: Mapping[str, Any]
    description: str


class CommandLog:
    """Command ids already handled, with their outcome, in SQLite (survives restarts, bounded)."""

    def __init__(self, path: Path, size: int = COMMAND_LOG_SIZE) -> None:
        try:
            self._conn = self._open(path)
        except sqlite3.DatabaseError as exc:  # unreadable: keep it for a post-mortem, start empty
            aside = path.with_name(f"{path.name}.corrupt-{int(time.time())}")
            log.error("command log %s is unreadable (%s); moved it to %s", path, exc, aside)
            for suffix in ("-wal", "-shm"):
                Path(f"{path}{suffix}").unlink(missing_ok=True)
            path.replace(aside)
            self._conn = self._open(path)
        self._size = size
        self._lock = threading.Lock()

    @staticmethod
    def _open(path: Path) -> sqlite3.Connection:
        conn = sqlite3.connect(str(path), check_same_thread=False, isolation_level=None)
        try:
            conn.execute("PRAGMA journal_mode = WAL")
            conn.execute("PRAGMA synchronous = NORMAL")
            conn.execute("CREATE TABLE IF NOT EXISTS commands (id TEXT PRIMARY KEY, cmd TEXT NOT NULL, "
                         "received REAL NOT NULL, outcome TEXT)")
        except BaseException:
            conn.close()
            raise
        return conn

    def outcome(self, command_id: str) -> tuple[bool, Any]:
        """(seen before?, its recorded outcome or None while it has not finished)."""
        with self._lock:
            row = self._conn.execute("SELECT outcome FROM commands WHERE id = ?", (command_id,)).fetchone()
        if row is None:
            return False, None
        return True, (json.loads(row[0]) if row[0] else None)

    def begin(self, command_id: str, cmd: str) -> None:
        """Record the id before the handler runs, so a crash mid-way never runs it twice."""
        with self._lock:
            self._conn.execute("INSERT OR IGNORE INTO commands (id, cmd, received) VALUES (?, ?, ?)",
                               (command_id, cmd, time.time()))
            self._conn.execute("DELETE FROM commands WHERE rowid NOT IN "
                               "(SELECT rowid FROM commands ORDER BY received DESC LIMIT ?)", (self._size,))

    def finish(self, command_id: str, outcome: Mapping[str, Any]) -> None:
        """Record how the command ended (what a repeated id is answered with)."""
        with self._lock:
            self._conn.execute("UPDATE commands SET outcome = ? WHERE id = ?",
                               (json.dumps(outcome, default=str), command_id))

    def close(self) -> None:
        """Close the database."""
        with self._lock:
            self._conn.close()


class CommandRouter:
    """Validates inbound ``cmd`` messages and dispatches them to registered handlers, one at a time."""

    def __init__(self, agent: AgentServices, log_path: Path) -> None:
        self._agent = agent
        self._handlers: dict[str, _Registered] = {}
        self._queue: queue.Queue[tuple[str, bytes] | None] = queue.Queue(maxsize=256)
        self._log = CommandLog(log_path)
        self._thread: threading.Thread | None = None

    def register(self, name: str, handler: Handler, *, args_schema: Mapping[str, Any] | None = None,
                 description: str = "") -> None:
        """Add a command: ``handler(args, ctx)`` returns a JSON-able result or raises an EdgeInferError."""
        self._handlers[name] = _Registered(handler, args_schema or {"type": "object"}, description)

    @property
    def names(self) -> list[str]:
        """The registered commands, sorted."""
        return sorted(self._handlers)

    def submit(self, topic: str, payload: bytes) -> None:
        """Queue a received message (called from the MQTT thread; never blocks it)."""
        try:
            self._queue.put_nowait((topic, payload))
        except queue.Full:
            self._agent.emit("cmd_rejected", "error", "command queue full; command dropped",
                             data={"reason": "busy"})

    def start(self) -> None:
        """Start handling queued commands in thread ``edgeinfer-commands``."""
        self._thread = threading.Thread(target=self._run, name="edgeinfer-commands", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        """Finish the command being handled, stop the thread and close the log."""
        if self._thread is not None and self._thread.is_alive():
            self._queue.put(None)
            self._thread.join(timeout)
        self._log.close()

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            try:
                self.handle(*item)
            except Exception:  # a handler bug must not kill the command thread
                log.exception("command handling failed")

    def handle(self, topic: str, payload: bytes) -> None:
        """Validate, de-duplicate, dispatch and answer one command message."""
        admitted = self._admit(payload)
        if admitted is None:
            return
        message, registered = admitted
        self._log.begin(message["id"], message["cmd"])
        outcome = self._dispatch(message, registered)
        self._log.finish(message["id"], outcome)

    def _admit(self, payload: bytes) -> tuple[Mapping[str, Any], _Registered] | None:
        """The decoded message and its handler; None (after answering why) when it must not run."""
        agent = self._agent
        command_id = _best_effort_id(payload)
        try:
            message = decode("cmd", payload)
        except ProtocolError as exc:
            agent.emit("cmd_rejected", "error", str(exc), cmd_id=command_id, data={"reason": "invalid"})
            return None
        command_id, name = message["id"], message["cmd"]
        seen, outcome = self._log.outcome(command_id)
        if seen:
            agent.emit("cmd_result", "info", f"command {command_id} ({name}) was already handled; not run again",
                       cmd_id=command_id, data={"cmd": name, "duplicate": True, "outcome": outcome})
            return None
        expires = message.get("expires")
        if expires is not None and expires < time.time():
            agent.emit("cmd_rejected", "error", f"command {command_id} ({name}) expired at {expires}",
                       cmd_id=command_id, data={"cmd": name, "reason": "expired"})
            return None
        registered = self._handlers.get(name)
        if registered is None:
            agent.emit("cmd_rejected", "error", f"unknown command {name!r} (known: {', '.join(self.names)})",
                       cmd_id=command_id, data={"cmd": name, "reason": "unknown_command"})
            return None
        problems = schema_errors(message.get("args", {}), registered.args_schema)
        if problems:
            agent.emit("cmd_rejected", "error", f"command {command_id} ({name}): bad args: {'; '.join(problems[:3])}",
                       cmd_id=command_id, data={"cmd": name, "reason": "invalid_args"})
            return None
        return message, registered

    def _dispatch(self, message: Mapping[str, Any], registered: _Registered) -> dict[str, Any]:
        """Run the handler, answer with ``cmd_result`` or ``cmd_rejected``; the outcome the log keeps."""
        agent = self._agent
        command_id, name = message["id"], message["cmd"]
        context = CommandContext(agent=agent, command_id=command_id, message=message)
        try:
            result = registered.handler(message.get("args", {}), context)
        except (EdgeInferError, ValueError) as exc:
            reason = getattr(exc, "reason", None) or "failed"
            outcome = {"ok": False, "reason": reason, "error": str(exc)}
            agent.emit("cmd_rejected", "error", f"command {command_id} ({name}) failed: {exc}", cmd_id=command_id,
                       data={"cmd": name, **outcome})
        except Exception as exc:
            log.exception("command %s (%s) crashed", command_id, name)
            outcome = {"ok": False, "reason": "internal_error", "error": f"{type(exc).__name__}: {exc}"}
            agent.emit("cmd_rejected", "error", f"command {command_id} ({name}) crashed: {exc}", cmd_id=command_id,
                       data={"cmd": name, **outcome})
        else:
            outcome = {"ok": True, "result": result}
            agent.emit("cmd_result", "info", f"command {command_id} ({name}) done", cmd_id=command_id,
                       data={"cmd": name, **outcome})
        return outcome


def _best_effort_id(payload: bytes) -> str | None:
    """The id of a command that failed validation, when one can be read (so the sender can match the error)."""
    try:
        value = json.loads(payload).get("id")
    except Exception:
        return None
    return value[:128] if isinstance(value, str) else None


def _cmd_ping(args: Mapping[str, Any], ctx: CommandContext) -> dict[str, Any]:
    """``ping``: proves the command path works end to end; says which boot answers."""
    return {"pong": True, "boot_id": ctx.agent.boot.boot_id, "uptime_s": round(time.time() - ctx.agent.boot.started, 3)}


def _cmd_restart_pipeline(args: Mapping[str, Any], ctx: CommandContext) -> dict[str, Any]:
    """``restart_pipeline``: stop one pipeline's run and start it again now."""
    runner = ctx.agent.runner(args["pipeline"])
    runner.request_restart()
    return {"pipeline": runner.name}


RESTART_PIPELINE_ARGS_SCHEMA = {
    "type": "object", "required": ["pipeline"], "additionalProperties": False,
    "properties": {"pipeline": {"type": "string", "minLength": 1, "maxLength": 64}},
}


def register_builtin_commands(router: CommandRouter) -> None:
    """The commands every agent answers: ``ping`` and ``restart_pipeline``."""
    router.register("ping", _cmd_ping, description="answer with the boot id and uptime")
    router.register("restart_pipeline", _cmd_restart_pipeline, args_schema=RESTART_PIPELINE_ARGS_SCHEMA,
                    description="restart one pipeline now")

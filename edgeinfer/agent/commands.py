"""Inbound commands: validated, signature-checked, de-duplicated by id, dispatched, answered.

Inbound ``cmd`` messages go to :class:`CommandRouter` in its own thread (``edgeinfer-commands``).
Each one passes, in this order: decode (the ``cmd`` schema) → the command is known → signature
(a command registered ``signed=True``, which is the default, must be signed by the pinned fleet
key, for this device, with an expiry: :meth:`~edgeinfer.updates.signing.VerifyKey.verify_command`)
→ duplicate id (the :class:`CommandLog` survives restarts) → expiry → argument schema → handler;
it is answered with a ``cmd_result`` or ``cmd_rejected`` event. A refused command changes nothing
and is not recorded, so a forged message cannot fill the command log or claim an id a real
command will use. Handlers register with :meth:`CommandRouter.register`; the agent ships ``ping``
(unsigned: it changes nothing) and ``restart_pipeline`` (:func:`register_builtin_commands`), and
model updates plug in the same way. A handler gets the agent's :class:`~.services.AgentServices`
as ``ctx.agent``.
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

from ..errors import CommandRejected, EdgeInferError, ProtocolError
from ..link.protocol import decode, schema_errors
from ..link.vocabulary import Command, EventKind
from ..updates.signing import MAX_COMMAND_TTL_S, SIGNATURE_FIELD, VerifyKey, check_command_expiry
from .services import AgentServices

log = logging.getLogger(__name__)

#: how many unsigned (or expired) command ids the command log remembers; a signed command's id is kept
#: until its expiry has passed, however many others arrive (then the expiry check refuses it anyway)
COMMAND_LOG_SIZE = 1000
#: the log's key prefix for a command that ran without a verified signature (``ping``): such an id lives
#: apart from the signed ones, so an unsigned message cannot claim the id of a signed command to come
#: (``~`` cannot start a command id)
UNVERIFIED_PREFIX = "~"


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
    signed: bool
    on_queued: Callable[[Mapping[str, Any]], None] | None = None


class CommandLog:
    """Command ids already handled, with their outcome, in SQLite (survives restarts, bounded).

    A signed command's row keeps its ``expires`` and stays until that time has passed, so a replay is
    recognised however many commands came in between; the others (unsigned, expired) are capped at
    ``size`` rows, newest kept.
    """

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
            conn.execute("PRAGMA cache_size = -128")  # KiB: a few rows a day; the default 2 MiB is for nothing
            conn.execute("CREATE TABLE IF NOT EXISTS commands (id TEXT PRIMARY KEY, cmd TEXT NOT NULL, "
                         "received REAL NOT NULL, outcome TEXT, expires REAL)")
            columns = {row[1] for row in conn.execute("PRAGMA table_info(commands)")}
            if "expires" not in columns:  # a log written before commands were signed: its rows stay capped
                conn.execute("ALTER TABLE commands ADD COLUMN expires REAL")
        except BaseException:
            conn.close()
            raise
        return conn

    @staticmethod
    def _key(command_id: str, verified: bool) -> str:
        return command_id if verified else UNVERIFIED_PREFIX + command_id

    def outcome(self, command_id: str, *, verified: bool = True) -> tuple[bool, Any]:
        """(seen before?, its recorded outcome or None while it has not finished).

        ``verified``: look among the commands whose signature was verified (else among the unsigned).
        """
        with self._lock:
            row = self._conn.execute("SELECT outcome FROM commands WHERE id = ?",
                                     (self._key(command_id, verified),)).fetchone()
        if row is None:
            return False, None
        return True, (json.loads(row[0]) if row[0] else None)

    def begin(self, command_id: str, cmd: str, *, verified: bool = True, expires: float | None = None) -> None:
        """Record the id before the handler runs, so a crash mid-way never runs it twice.

        ``expires``: the signed expiry of a verified command; its row is kept until then. An unverified
        command's expiry is not kept (anybody can send one: its rows must stay capped).
        """
        now = time.time()
        with self._lock:
            self._conn.execute("INSERT OR IGNORE INTO commands (id, cmd, received, expires) VALUES (?, ?, ?, ?)",
                               (self._key(command_id, verified), cmd, now, expires if verified else None))
            self._conn.execute(
                "DELETE FROM commands WHERE (expires IS NULL OR expires < :now) AND rowid NOT IN "
                "(SELECT rowid FROM commands WHERE expires IS NULL OR expires < :now ORDER BY received DESC "
                "LIMIT :size)", {"now": now, "size": self._size})

    def finish(self, command_id: str, outcome: Mapping[str, Any], *, verified: bool = True) -> None:
        """Record how the command ended (what a repeated id is answered with)."""
        with self._lock:
            self._conn.execute("UPDATE commands SET outcome = ? WHERE id = ?",
                               (json.dumps(outcome, default=str), self._key(command_id, verified)))

    def __len__(self) -> int:
        """How many ids the log holds now."""
        with self._lock:
            return self._conn.execute("SELECT COUNT(*) FROM commands").fetchone()[0]

    def close(self) -> None:
        """Close the database."""
        with self._lock:
            self._conn.close()


class CommandRouter:
    """Validates inbound ``cmd`` messages and dispatches them to registered handlers, one at a time.

    ``key`` is the pinned fleet key (None: no key, so every signed-only command is refused with
    ``no_fleet_key``); ``device_id`` is whom a signed command must name (default: the agent's device).
    """

    def __init__(self, agent: AgentServices, log_path: Path, *, key: VerifyKey | None = None,
                 device_id: str | None = None, max_ttl_s: float = MAX_COMMAND_TTL_S) -> None:
        self._agent = agent
        self._key = key
        self._device_id = device_id if device_id is not None else agent.topics.device
        self._max_ttl_s = max_ttl_s
        self._handlers: dict[str, _Registered] = {}
        self._queue: queue.Queue[tuple[str, bytes] | None] = queue.Queue(maxsize=256)
        self._log = CommandLog(log_path)
        self._thread: threading.Thread | None = None

    def register(self, name: Command | str, handler: Handler, *, args_schema: Mapping[str, Any] | None = None,
                 description: str = "", signed: bool = True,
                 on_queued: Callable[[Mapping[str, Any]], None] | None = None) -> None:
        """Add a command: ``handler(args, ctx)`` returns a JSON-able result or raises an EdgeInferError.

        ``signed``: the command changes the device's state, so it runs only when signed by the fleet key
        (the default: a new command is safe unless it says otherwise). ``signed=False`` is for commands
        that change nothing (``ping``).

        ``on_queued(args)`` runs on the MQTT thread as soon as a verified, unexpired command of this name is queued,
        while the command before it may still be running (a rollback ends an update's trial rather than waiting it
        out). It must be quick and must not fail; the command itself still runs in turn, checked in full.
        """
        self._handlers[str(name)] = _Registered(handler, args_schema or {"type": "object"}, description, signed,
                                                on_queued)

    @property
    def log(self) -> CommandLog:
        """The command log (ids handled, their outcomes)."""
        return self._log

    @property
    def names(self) -> list[str]:
        """The registered commands, sorted."""
        return sorted(self._handlers)

    def submit(self, topic: str, payload: bytes) -> None:
        """Queue a received message (called from the MQTT thread; never blocks it)."""
        try:
            self._queue.put_nowait((topic, payload))
        except queue.Full:
            self._agent.emit(EventKind.CMD_REJECTED, "error", "command queue full; command dropped",
                             data={"reason": "busy"})
            return
        self._announce(payload)

    def _announce(self, payload: bytes) -> None:
        """Tell a command's ``on_queued`` hook that it waits in the queue, once its signature and expiry check out
        (a forged or replayed message must not end anything). Quiet: the command thread answers every refusal in
        order."""
        try:
            message = decode("cmd", payload)
            registered = self._handlers.get(message["cmd"])
            if registered is None or registered.on_queued is None or self._key is None:
                return
            self._key.verify_command_signature(message, device_id=self._device_id)
            check_command_expiry(message, max_ttl_s=self._max_ttl_s)
            if self._log.outcome(message["id"], verified=True)[0]:
                return  # a replay ends nothing
            registered.on_queued(message.get("args", {}))
        except Exception as exc:  # refused here means refused in turn, with its answer
            log.debug("queued command not announced: %s", exc)

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
        """Validate, verify, de-duplicate, dispatch and answer one command message."""
        admitted = self._admit(payload)
        if admitted is None:
            return
        message, registered, verified = admitted
        command_id = message["id"]
        self._log.begin(command_id, message["cmd"], verified=verified,
                        expires=message.get("expires") if verified else None)
        outcome = self._dispatch(message, registered)
        self._log.finish(command_id, outcome, verified=verified)

    def _admit(self, payload: bytes) -> tuple[Mapping[str, Any], _Registered, bool] | None:
        """The decoded message, its handler and whether its signature was verified; None (after answering
        why) when it must not run. Nothing is recorded here: a refused message leaves no trace in the log."""
        agent = self._agent
        command_id = _best_effort_id(payload)
        try:
            message = decode("cmd", payload)
        except ProtocolError as exc:
            agent.emit(EventKind.CMD_REJECTED, "error", str(exc), cmd_id=command_id, data={"reason": "invalid"})
            return None
        command_id, name = message["id"], message["cmd"]

        def reject(reason: str, text: str) -> None:
            agent.emit(EventKind.CMD_REJECTED, "error", f"command {command_id} ({name}): {text}", cmd_id=command_id,
                       data={"cmd": name, "reason": reason})

        registered = self._handlers.get(name)
        if registered is None:
            reject("unknown_command", f"unknown command {name!r} (known: {', '.join(self.names)})")
            return None
        # a command that must be signed is checked with the key; one that need not be is checked when it
        # carries a signature anyway and a key is pinned (a bad signature is never ignored)
        must_verify = registered.signed or (SIGNATURE_FIELD in message and self._key is not None)
        if must_verify:
            try:
                if self._key is None:
                    raise CommandRejected("no_fleet_key", "this agent pins no update_public_key to check "
                                                          "the command's signature with")
                self._key.verify_command_signature(message, device_id=self._device_id)
            except CommandRejected as exc:
                reject(exc.reason, exc.detail or exc.reason)
                return None
        seen, outcome = self._log.outcome(command_id, verified=must_verify)
        if seen:  # a replay or a redelivery: answered with the first outcome, never run again
            agent.emit(EventKind.CMD_RESULT, "info",
                       f"command {command_id} ({name}) was already handled; not run again", cmd_id=command_id,
                       data={"cmd": name, "duplicate": True, "outcome": outcome})
            return None
        try:
            if must_verify:
                check_command_expiry(message, max_ttl_s=self._max_ttl_s)
            elif message.get("expires") is not None and message["expires"] < time.time():
                raise CommandRejected("expired", f"expired at {message['expires']}")
        except CommandRejected as exc:
            reject(exc.reason, exc.detail or exc.reason)
            return None
        problems = schema_errors(message.get("args", {}), registered.args_schema)
        if problems:
            reject("invalid_args", f"bad args: {'; '.join(problems[:3])}")
            return None
        return message, registered, must_verify

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
            agent.emit(EventKind.CMD_REJECTED, "error", f"command {command_id} ({name}) failed: {exc}",
                       cmd_id=command_id, data={"cmd": name, **outcome})
        except Exception as exc:
            log.exception("command %s (%s) crashed", command_id, name)
            outcome = {"ok": False, "reason": "internal_error", "error": f"{type(exc).__name__}: {exc}"}
            agent.emit(EventKind.CMD_REJECTED, "error", f"command {command_id} ({name}) crashed: {exc}",
                       cmd_id=command_id, data={"cmd": name, **outcome})
        else:
            outcome = {"ok": True, "result": result}
            agent.emit(EventKind.CMD_RESULT, "info", f"command {command_id} ({name}) done", cmd_id=command_id,
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


def _cmd_sample(args: Mapping[str, Any], ctx: CommandContext) -> dict[str, Any]:
    """``sample``: keep the next frames of a pipeline as samples (the dashboard's request)."""
    runner = ctx.agent.runner(args["pipeline"])
    pipeline = runner.pipeline
    if pipeline is None:
        raise CommandRejected("not_running", f"pipeline {runner.name} is not running ({runner.status})")
    try:
        streams = pipeline.samples.request(int(args["frames"]), args.get("stream", ""), ctx.command_id)
    except ValueError as exc:
        raise CommandRejected("no_sampling", f"pipeline {runner.name}: {exc}") from None
    return {"pipeline": runner.name, "streams": streams, "frames": int(args["frames"])}


SAMPLE_ARGS_SCHEMA = {
    "type": "object", "required": ["pipeline", "frames"], "additionalProperties": False,
    "properties": {"pipeline": {"type": "string", "minLength": 1, "maxLength": 64},
                   "stream": {"type": "string", "maxLength": 64},
                   "frames": {"type": "integer", "minimum": 1, "maximum": 1000}},
}


def register_builtin_commands(router: CommandRouter) -> None:
    """The commands every agent answers: ``ping`` (unsigned: it changes nothing), ``restart_pipeline`` and
    ``sample`` (and ``capture``, its old name, which a manager of an older version sends)."""
    router.register(Command.PING, _cmd_ping, description="answer with the boot id and uptime", signed=False)
    router.register(Command.RESTART_PIPELINE, _cmd_restart_pipeline, args_schema=RESTART_PIPELINE_ARGS_SCHEMA,
                    description="restart one pipeline now")
    router.register(Command.SAMPLE, _cmd_sample, args_schema=SAMPLE_ARGS_SCHEMA,
                    description="keep the next N frames of a pipeline as samples")
    old_name = Command.CAPTURE  # sample's old name, an alias: a manager of an older version sends it
    router.register(old_name, _cmd_sample, args_schema=SAMPLE_ARGS_SCHEMA, description="sample's old name")

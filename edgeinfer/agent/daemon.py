"""The on-device daemon: runs pipelines, reports over MQTT, takes commands.

:class:`Agent` ties the parts together:

- one :class:`PipelineRunner` per configured pipeline, each in its own thread
  (``edgeinfer-pipeline-<name>``): it builds the :class:`edgeinfer.Pipeline`, watches it, reports
  ``pipeline_started`` / ``fallback`` / ``pipeline_ended`` / ``pipeline_failed`` events, and
  restarts a failed pipeline with exponential backoff and jitter (a run that lasted resets it);
- the main thread ticks every ``telemetry_interval_s``: it takes each pipeline's window
  (``Pipeline.take_window()``), samples the system probes and writes one telemetry message to the
  on-disk spool; :class:`~edgeinfer.link.mqtt.MqttLink` drains the spool at QoS 1 and removes rows only
  on PUBACK, so nothing is lost to network cuts, broker restarts or an agent crash;
- the retained ``state`` (birth) is re-published at every connect and whenever a pipeline's state
  changes; the Last Will turns it offline;
- inbound ``cmd`` messages go to :class:`CommandRouter` in its own thread (``edgeinfer-commands``):
  each is validated, de-duplicated by id (the log survives restarts), dispatched to a handler, and
  answered with a ``cmd_result`` or ``cmd_rejected`` event. Handlers register with
  :meth:`CommandRouter.register`; the agent ships ``ping`` and ``restart_pipeline``, and model
  updates plug in the same way.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import platform
import queue
import sqlite3
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .._backoff import EQUAL_JITTER, Backoff
from .._version import __version__
from ..errors import ConfigError, EdgeInferError, ProtocolError
from ..link.mqtt import MqttLink
from ..link.protocol import PROTOCOL_VERSION, Topics, decode, encode, schema_errors
from ..link.spool import PRIORITY_EVENT, PRIORITY_TELEMETRY, Spool
from .config import AgentConfig, PipelineConfig, resolve_profile
from .telemetry import BootSequence, SystemProbe, default_throttle_sensors, pipeline_entry, telemetry_message

log = logging.getLogger(__name__)

#: a pipeline that ran this long before failing restarts after the minimum delay again
STABLE_RUN_S = 60.0
#: how long shutdown waits for the broker to acknowledge the offline state and last messages
SHUTDOWN_DRAIN_S = 3.0
#: how many command ids the command log remembers (for de-duplication across restarts)
COMMAND_LOG_SIZE = 1000
_VERSION_PACKAGES = ("paho-mqtt", "ai-edge-litert", "tflite-runtime", "onnxruntime", "openvino", "numpy",
                     "opencv-python-headless")

PipelineFactory = Callable[[PipelineConfig], Any]
EmitFn = Callable[..., None]


def default_pipeline_factory(config: PipelineConfig) -> Any:
    """Build an :class:`edgeinfer.Pipeline` from a pipeline config (not started)."""
    try:
        from ..pipeline.core import Pipeline
    except ImportError as exc:  # a build without the pipeline module
        raise EdgeInferError(f"this edgeinfer has no pipeline module ({exc}); install a release with "
                             "edgeinfer.pipeline") from exc
    return Pipeline(config.model, config.source, **config.pipeline_kwargs())


def software_versions() -> dict[str, str | None]:
    """edgeinfer, Python and the installed runtimes' versions, read from package metadata (nothing imported)."""
    from importlib.metadata import PackageNotFoundError, version

    out: dict[str, str | None] = {"edgeinfer": __version__, "python": platform.python_version(),
                                  "protocol": str(PROTOCOL_VERSION)}
    for name in _VERSION_PACKAGES:
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            out[name] = None
    return out


def delegate_report(profile: Any = None, root: str = "/") -> list[dict[str, Any]]:
    """Every registered delegate with ``available`` and the reason when it is not.

    With a device profile: its delegate plan for this host (its order first, then the others),
    as ``edgeinfer device --json`` lists it.
    """
    if profile is not None:
        try:
            from ..runtime.selection import plan

            return plan(None, profile=profile, root=root, include_others=True).to_dict()["delegates"]
        except Exception as exc:  # the report must never stop the agent
            log.warning("delegate plan for profile %s failed (%s); listing delegates without it",
                        getattr(profile, "name", profile), exc)
    from ..runtime.delegates.registry import delegate_names, get_delegate

    out = []
    for name in delegate_names():
        try:
            reason = get_delegate(name).unavailable_reason()
        except Exception as exc:  # a broken third-party delegate must not stop the report
            reason = f"cannot load the delegate: {exc}"
        out.append({"name": name, "available": reason is None, "reason": reason})
    return out


def _lock_data_dir(config: AgentConfig) -> Any:
    """Hold an exclusive lock on ``data_dir`` for the agent's life: two agents on one spool (and one
    MQTT client id) would steal each other's session and send everything twice."""
    import fcntl
    import os

    handle = open(config.data_dir / "agent.lock", "a+")  # noqa: SIM115 - held open until close()
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        handle.seek(0)
        other = handle.read().strip() or "?"
        handle.close()
        raise ConfigError(f"{config.path or 'config'}: data_dir: another agent (pid {other}) is running with "
                          f"{config.data_dir}; give each agent its own data_dir") from None
    handle.seek(0)
    handle.truncate()
    handle.write(f"{os.getpid()}\n")
    handle.flush()
    return handle


def sd_notify(state: str) -> bool:
    """Tell systemd (``Type=notify``) about ``state`` (READY=1, WATCHDOG=1, STOPPING=1); False when not under it."""
    import os
    import socket

    address = os.environ.get("NOTIFY_SOCKET")
    if not address:
        return False
    if address.startswith("@"):  # abstract namespace
        address = "\0" + address[1:]
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
            sock.connect(address)
            sock.sendall(state.encode())
        return True
    except OSError as exc:
        log.debug("sd_notify(%s) failed: %s", state, exc)
        return False


def _watchdog_interval() -> float | None:
    """Half of systemd's WatchdogSec (from $WATCHDOG_USEC, if it is meant for this process)."""
    import os

    usec = os.environ.get("WATCHDOG_USEC")
    pid = os.environ.get("WATCHDOG_PID")
    if not usec or (pid and pid != str(os.getpid())):
        return None
    try:
        return max(0.05, int(usec) / 1e6 / 2)
    except ValueError:
        return None


# ------------------------------------------------------------------------------------- pipelines

def _merge(first: Any, second: Any) -> Any:
    """Two consecutive windows of one pipeline as one (frames and drops add up; the later figures win)."""
    if first is None or second is None:
        return second if first is None else first
    with contextlib.suppress(TypeError, ValueError):
        return dataclasses.replace(second, frames=first.frames + second.frames,
                                   dropped=first.dropped + second.dropped)
    return second


class PipelineRunner:
    """Runs one pipeline in a named thread; restarts it with backoff when it fails."""

    def __init__(self, config: PipelineConfig, *, emit: EmitFn, on_change: Callable[[], None],
                 factory: PipelineFactory = default_pipeline_factory, restart_min_s: float = 1.0,
                 restart_max_s: float = 60.0) -> None:
        self.config = config
        self.name = config.name
        self._emit = emit
        self._on_change = on_change
        self._factory = factory
        self._restart_backoff = Backoff(initial_s=restart_min_s, max_s=restart_max_s, jitter=EQUAL_JITTER)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._restart_requested = threading.Event()
        self._thread: threading.Thread | None = None
        self._pipeline: Any = None
        self._leftover: Any = None
        self.status = "starting"
        self.restarts = 0
        self.last_error: str | None = None
        self.delegate: str | None = None
        self.fallback_reason: str | None = None
        self.model: dict[str, Any] = {"path": config.model, "sha256": None, "version": config.version,
                                      "format": None}
        self.frames_total = 0
        self.dropped_total = 0
        self.last_run_frames = 0

    @property
    def pipeline(self) -> Any:
        """The running Pipeline, or None between runs."""
        with self._lock:
            return self._pipeline

    # -- control --------------------------------------------------------------------------
    def start(self) -> PipelineRunner:
        """Start supervising (the pipeline is built in the runner's thread)."""
        self._thread = threading.Thread(target=self._run, name=f"edgeinfer-pipeline-{self.name}", daemon=True)
        self._thread.start()
        return self

    def request_restart(self) -> None:
        """Stop the current run (if any) and start again now."""
        self._restart_requested.set()

    def stop(self, timeout: float = 10.0) -> None:
        """Stop the pipeline and join the thread."""
        self._stop.set()
        self._restart_requested.set()
        if self._thread is not None:
            self._thread.join(timeout)
            if self._thread.is_alive():
                log.warning("pipeline %s did not stop within %.0f s", self.name, timeout)

    def close(self) -> None:
        """Same as stop(); idempotent."""
        self.stop()

    def swap_engine(self, engine: Any, *, version: str | None = None) -> Any:
        """Hot-swap the running pipeline's engine between two frames (capture keeps going).

        Later restarts load the new model too. Returns the previous engine, which the caller closes
        (or keeps, to roll back). EdgeInferError when the pipeline is not running; ValueError (the
        run untouched) when the engine does not fit the task.
        """
        with self._lock:
            pipeline = self._pipeline
        if pipeline is None:
            raise EdgeInferError(f"pipeline {self.name} is not running ({self.status}); nothing to swap")
        old = pipeline.swap_engine(engine)
        info = engine.model
        self.config = dataclasses.replace(self.config, model=str(info.path), version=version)
        self.delegate = engine.description
        self.fallback_reason = engine.fallback_reason
        self.model = {"path": str(info.path), "sha256": info.sha256, "version": version, "format": info.format.value}
        self._on_change()
        return old

    def take_window(self) -> Any:
        """Stats since the previous call (PipelineStats), or None when nothing ran in the window."""
        with self._lock:
            pipeline, leftover, self._leftover = self._pipeline, self._leftover, None
            current = None
            if pipeline is not None:
                try:
                    current = pipeline.take_window()
                except Exception:
                    log.exception("pipeline %s: take_window failed", self.name)
        window = _merge(leftover, current)
        if window is not None:
            self.frames_total += int(window.frames)
            self.dropped_total += int(window.dropped)
        return window

    def describe(self) -> dict[str, Any]:
        """This pipeline's entry in the ``state`` message."""
        source = self.config.source
        return {"name": self.name, "status": self.status, "task": self.config.task, "source": str(source),
                "delegate": self.delegate, "fallback_reason": self.fallback_reason, "error": self.last_error,
                "restarts": self.restarts, "model": dict(self.model)}

    # -- the thread -----------------------------------------------------------------------
    def _set_status(self, status: str) -> None:
        if status != self.status:
            self.status = status
            self._on_change()

    def _wait(self, seconds: float) -> bool:
        """Sleep up to ``seconds``; True if interrupted by stop or a restart request."""
        return self._restart_requested.wait(seconds)

    def _run(self) -> None:
        attempt = 0
        while not self._stop.is_set():
            self._restart_requested.clear()
            self._set_status("starting")
            started = time.monotonic()
            error: BaseException | None = None
            pipeline = None
            try:
                pipeline = self._factory(self.config)
                pipeline.start()
            except Exception as exc:
                error = exc
                if pipeline is not None:
                    with contextlib.suppress(Exception):
                        pipeline.close()
            else:
                error, requested = self._watch(pipeline)
                if self._stop.is_set():
                    break
                if requested:
                    self.restarts += 1
                    attempt = 0
                    self._emit("pipeline_restarting", "info", f"pipeline {self.name} restarting on request",
                               pipeline=self.name, data={"reason": "requested", "restarts": self.restarts})
                    continue
                if error is None:
                    self.last_error = None
                    self._set_status("ended")
                    self._emit("pipeline_ended", "info", f"pipeline {self.name} ended (its source has no more "
                               "frames)", pipeline=self.name, data={"frames": self.last_run_frames})
                    if self.config.restart != "always":
                        self._wait(1e9)  # until stop or a restart command
                        continue
            if self._stop.is_set():
                break
            if error is not None:
                if time.monotonic() - started >= STABLE_RUN_S:
                    attempt = 0
                self.last_error = f"{type(error).__name__}: {' '.join(str(error).split())}"
                self._set_status("failed")
                self._emit("pipeline_failed", "error", f"pipeline {self.name} failed: {self.last_error}",
                           pipeline=self.name, data={"error": self.last_error, "type": type(error).__name__})
                if self.config.restart == "never":
                    self._wait(1e9)
                    continue
            attempt += 1
            delay = self._restart_backoff.delay(attempt)
            self._set_status("restarting")
            self.restarts += 1
            self._emit("pipeline_restarting", "warning",
                       f"pipeline {self.name} restarts in {delay:.1f} s (attempt {attempt})",
                       pipeline=self.name, data={"delay_s": round(delay, 2), "attempt": attempt,
                                                 "restarts": self.restarts})
            self._wait(delay)
        self._set_status("stopped")

    def _watch(self, pipeline: Any) -> tuple[BaseException | None, bool]:
        """Publish the running pipeline, wait until it ends or we are told to stop; (error, restart requested)."""
        engine = getattr(pipeline, "engine", None)
        model_info = getattr(engine, "model", None)
        self.delegate = getattr(engine, "description", None)
        self.fallback_reason = getattr(engine, "fallback_reason", None)
        if model_info is not None:
            self.model = {"path": str(getattr(model_info, "path", self.config.model)),
                          "sha256": getattr(model_info, "sha256", None), "version": self.config.version,
                          "format": getattr(getattr(model_info, "format", None), "value", None)}
        with self._lock:
            self._pipeline = pipeline
        self.last_error = None
        self._set_status("running")
        self._emit("pipeline_started", "info", f"pipeline {self.name} running on {self.delegate}",
                   pipeline=self.name, data={"delegate": self.delegate, "model": self.model})
        if self.fallback_reason:
            self._emit("fallback", "warning", f"pipeline {self.name} runs on {self.delegate}: {self.fallback_reason}",
                       pipeline=self.name, data={"delegate": self.delegate, "reason": self.fallback_reason})
        try:
            while not self._restart_requested.is_set():
                if pipeline.wait(0.25):
                    break
        finally:
            requested = self._restart_requested.is_set()
            if requested:
                with contextlib.suppress(Exception):
                    pipeline.stop()
            with self._lock:
                self._pipeline = None
                try:
                    self._leftover = _merge(self._leftover, pipeline.take_window())
                    self.last_run_frames = int(pipeline.stats.frames)
                except Exception:
                    log.debug("final stats failed", exc_info=True)
            error = None if requested else getattr(pipeline, "error", None)
            with contextlib.suppress(Exception):
                pipeline.close()
        return error, requested and not self._stop.is_set()


# -------------------------------------------------------------------------------------- commands

@dataclass(frozen=True)
class CommandContext:
    """What a command handler gets besides its arguments."""

    agent: Agent
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
        with self._lock:
            self._conn.execute("UPDATE commands SET outcome = ? WHERE id = ?",
                               (json.dumps(outcome, default=str), command_id))

    def close(self) -> None:
        with self._lock:
            self._conn.close()


class CommandRouter:
    """Validates inbound ``cmd`` messages and dispatches them to registered handlers, one at a time."""

    def __init__(self, agent: Agent, log_path: Path) -> None:
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
        return sorted(self._handlers)

    def submit(self, topic: str, payload: bytes) -> None:
        """Queue a received message (called from the MQTT thread; never blocks it)."""
        try:
            self._queue.put_nowait((topic, payload))
        except queue.Full:
            self._agent.emit("cmd_rejected", "error", "command queue full; command dropped",
                             data={"reason": "busy"})

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="edgeinfer-commands", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
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
        agent = self._agent
        command_id = _best_effort_id(payload)
        try:
            message = decode("cmd", payload)
        except ProtocolError as exc:
            agent.emit("cmd_rejected", "error", str(exc), cmd_id=command_id, data={"reason": "invalid"})
            return
        command_id, name = message["id"], message["cmd"]
        seen, outcome = self._log.outcome(command_id)
        if seen:
            agent.emit("cmd_result", "info", f"command {command_id} ({name}) was already handled; not run again",
                       cmd_id=command_id, data={"cmd": name, "duplicate": True, "outcome": outcome})
            return
        expires = message.get("expires")
        if expires is not None and expires < time.time():
            agent.emit("cmd_rejected", "error", f"command {command_id} ({name}) expired at {expires}",
                       cmd_id=command_id, data={"cmd": name, "reason": "expired"})
            return
        registered = self._handlers.get(name)
        if registered is None:
            agent.emit("cmd_rejected", "error", f"unknown command {name!r} (known: {', '.join(self.names)})",
                       cmd_id=command_id, data={"cmd": name, "reason": "unknown_command"})
            return
        args = message.get("args", {})
        problems = schema_errors(args, registered.args_schema)
        if problems:
            agent.emit("cmd_rejected", "error", f"command {command_id} ({name}): bad args: {'; '.join(problems[:3])}",
                       cmd_id=command_id, data={"cmd": name, "reason": "invalid_args"})
            return
        self._log.begin(command_id, name)
        context = CommandContext(agent=agent, command_id=command_id, message=message)
        try:
            result = registered.handler(args, context)
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
        self._log.finish(command_id, outcome)


def _best_effort_id(payload: bytes) -> str | None:
    """The id of a command that failed validation, when one can be read (so the sender can match the error)."""
    try:
        value = json.loads(payload).get("id")
    except Exception:
        return None
    return value[:128] if isinstance(value, str) else None


def _cmd_ping(args: Mapping[str, Any], ctx: CommandContext) -> dict[str, Any]:
    return {"pong": True, "boot_id": ctx.agent.boot.boot_id, "uptime_s": round(time.time() - ctx.agent.boot.started, 3)}


def _cmd_restart_pipeline(args: Mapping[str, Any], ctx: CommandContext) -> dict[str, Any]:
    runner = ctx.agent.runner(args["pipeline"])
    runner.request_restart()
    return {"pipeline": runner.name}


# ----------------------------------------------------------------------------------------- agent

@dataclass
class _Figures:
    """Cumulative figures for /metrics (Prometheus counters must only go up)."""

    latest: dict[str, Any] | None = None
    totals: dict[str, dict[str, int]] = field(default_factory=dict)


class Agent:
    """The device agent. ``run()`` blocks until ``stop()`` (e.g. from a SIGTERM handler)."""

    def __init__(self, config: AgentConfig, *, pipeline_factory: PipelineFactory = default_pipeline_factory,
                 probe: SystemProbe | None = None) -> None:
        self.config = config
        self.topics: Topics = config.topics
        self.boot = BootSequence()
        self.probe = probe  # built in open(), once the device profile is known
        self.profile: Any = None
        self._factory = pipeline_factory
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._state_dirty = threading.Event()
        self._spool: Spool | None = None
        self._link: MqttLink | None = None
        self._metrics: Any = None
        self._runners: list[PipelineRunner] = []
        self._delegates: list[dict[str, Any]] = []
        self._versions: dict[str, str | None] = {}
        self.figures = _Figures()
        self.commands: CommandRouter | None = None
        self.updates: Any = None
        self._opened = False
        self._closed = False
        self._lock_file: Any = None
        self._spool_write_errors = 0

    # -- public ----------------------------------------------------------------------------
    def stop(self) -> None:
        """Ask run() to finish (safe from a signal handler or another thread)."""
        self._stop.set()
        self._wake.set()

    def runner(self, name: str) -> PipelineRunner:
        """The runner of pipeline ``name``; ValueError lists the names."""
        for runner in self._runners:
            if runner.name == name:
                return runner
        raise ValueError(f"no pipeline named {name!r} (have: {', '.join(r.name for r in self._runners) or 'none'})")

    @property
    def stopping(self) -> bool:
        """True once stop() was asked for: long command handlers should wrap up."""
        return self._stop.is_set()

    @property
    def runners(self) -> list[PipelineRunner]:
        return list(self._runners)

    @property
    def link(self) -> MqttLink | None:
        return self._link

    @property
    def spool(self) -> Spool | None:
        return self._spool

    def emit(self, event: str, level: str, message: str, *, pipeline: str | None = None,
             cmd_id: str | None = None, data: Mapping[str, Any] | None = None) -> None:
        """Log an event and spool it for the ``events`` topic."""
        log.log({"info": logging.INFO, "warning": logging.WARNING}.get(level, logging.ERROR), "event %s: %s",
                event, message)
        body = {"v": PROTOCOL_VERSION, "type": "event", "fleet": self.topics.fleet, "device": self.topics.device,
                "ts": round(time.time(), 3), "boot_id": self.boot.boot_id, "seq": self.boot.next("events"),
                "event": event, "level": level, "message": message, "pipeline": pipeline, "cmd_id": cmd_id,
                "data": dict(data or {})}
        self._spool_message(self.topics.events, body, PRIORITY_EVENT)

    def run(self) -> None:
        """Open everything, tick telemetry until stop(), then shut down cleanly."""
        self.open()
        try:
            self._loop()
        finally:
            self.close()

    # -- lifecycle -------------------------------------------------------------------------
    def open(self) -> None:
        """Create the data dir, spool and command log; start the MQTT link, commands and pipelines."""
        if self._opened:
            return
        self._opened = True
        config = self.config
        try:
            config.data_dir.mkdir(parents=True, exist_ok=True)
            probe_file = config.data_dir / ".write-test"
            probe_file.write_bytes(b"")
            probe_file.unlink()
        except OSError as exc:
            raise ConfigError(f"{config.path or 'config'}: data_dir: cannot write to {config.data_dir} "
                              f"({exc.strerror}) — create it and give the agent's user write access") from None
        self._lock_file = _lock_data_dir(config)
        from .deploy import UpdateService

        self.updates = UpdateService(config)  # A/B model slots: may replace the configured model
        self.config = config = self.updates.installed_config(config)
        self.profile = resolve_profile(config)
        if self.probe is None:
            sensors = config.sensors
            self.probe = SystemProbe(root=sensors.root, thermal_zones=sensors.thermal_zones,
                                     throttle=sensors.throttle or default_throttle_sensors(sensors.root),
                                     profile=self.profile)
        self._spool = Spool(config.data_dir / "spool.sqlite3", max_bytes=config.spool_max_bytes)
        self._versions = software_versions()
        self._delegates = delegate_report(self.profile, config.sensors.root)
        self.commands = CommandRouter(self, config.data_dir / "commands.sqlite3")
        self.commands.register("ping", _cmd_ping, description="answer with the boot id and uptime")
        self.commands.register("restart_pipeline", _cmd_restart_pipeline, args_schema={
            "type": "object", "required": ["pipeline"], "additionalProperties": False,
            "properties": {"pipeline": {"type": "string", "minLength": 1, "maxLength": 64}}},
            description="restart one pipeline now")
        self.updates.register(self.commands)
        offline = encode(self._state_message(online=False, reason="connection lost"))
        self._link = MqttLink(config.link_settings(), spool=self._spool, will=(self.topics.state, offline),
                              subscriptions=[self.topics.cmd], on_message=self._on_message,
                              on_connected=self._on_connected)
        # runners exist before the link connects: a command queued in the persistent session may
        # arrive at once and name a pipeline; commands wait in the router's queue until it starts
        self._runners = [PipelineRunner(p, emit=self.emit, on_change=self._state_changed, factory=self._factory,
                                        restart_min_s=config.restart_min_s, restart_max_s=config.restart_max_s)
                         for p in config.pipelines]
        self._link.set_retained(self.topics.state, encode(self._state_message(online=True)))
        self._link.start()
        if config.metrics is not None:
            self._start_metrics(*config.metrics)
        self.emit("agent_started", "info", f"agent {__version__} started on {config.device_id}",
                  data={"versions": self._versions, "pipelines": [p.name for p in config.pipelines],
                        "broker": str(self._link.broker), "profile": getattr(self.profile, "name", None)})
        for runner in self._runners:
            runner.start()
        self.commands.start()
        sd_notify("READY=1")

    def _start_metrics(self, host: str, port: int) -> None:
        from .metrics import MetricsServer

        try:
            self._metrics = MetricsServer(self, host, port).start()
        except (OSError, ImportError) as exc:
            self.emit("error", "error", f"cannot serve /metrics on {host}:{port}: {exc}",
                      data={"reason": "metrics_unavailable"})

    def close(self) -> None:
        """Stop pipelines, send a last window and the offline state, disconnect, close the spool. Idempotent."""
        if self._closed or not self._opened:
            self._closed = True
            return
        self._closed = True
        sd_notify("STOPPING=1")
        self.emit("agent_stopping", "info", "agent stopping")
        for runner in self._runners:
            runner._stop.set()
            runner._restart_requested.set()
        for runner in self._runners:
            runner.stop()
        with contextlib.suppress(Exception):
            self._tick(final=True)
        if self.commands is not None:
            self.commands.stop()
        if self._metrics is not None:
            self._metrics.close()
        if self._link is not None:
            self._link.set_retained(self.topics.state, encode(self._state_message(online=False, reason="shutdown")))
            self._link.stop(drain_timeout=SHUTDOWN_DRAIN_S)
        if self._spool is not None:
            self._spool.close()
        if self._lock_file is not None:
            self._lock_file.close()
            self._lock_file = None

    def __enter__(self) -> Agent:
        self.open()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- the main loop ---------------------------------------------------------------------
    def _loop(self) -> None:
        interval = self.config.telemetry_interval_s
        self._last_tick = time.monotonic()
        self.probe.sample()  # CPU figures are deltas: take the first mark now
        next_tick = self._last_tick + interval
        watchdog = _watchdog_interval()
        next_watchdog = time.monotonic()
        while not self._stop.is_set():
            now = time.monotonic()
            if watchdog is not None and now >= next_watchdog:
                sd_notify("WATCHDOG=1")  # from the main loop: if it hangs, systemd restarts the agent
                next_watchdog = now + watchdog
            if now >= next_tick:
                try:
                    self._tick()
                except Exception as exc:  # a telemetry bug must not stop the daemon (or its pipelines)
                    log.exception("telemetry tick failed")
                    self.emit("error", "error", f"telemetry failed: {type(exc).__name__}: {exc}",
                              data={"reason": "telemetry_failed"})
                next_tick += interval
                if next_tick <= time.monotonic():  # fell behind (suspended, overloaded): do not burst
                    next_tick = time.monotonic() + interval
            if self._state_dirty.is_set():
                self._state_dirty.clear()
                if self._link is not None:
                    self._link.set_retained(self.topics.state, encode(self._state_message(online=True)))
            until = next_tick if watchdog is None else min(next_tick, next_watchdog)
            self._wake.wait(max(0.0, until - time.monotonic()))
            self._wake.clear()

    def _tick(self, final: bool = False) -> None:
        now = time.monotonic()
        window_s = max(1e-3, now - getattr(self, "_last_tick", now - self.config.telemetry_interval_s))
        self._last_tick = now
        pipelines = []
        for runner in self._runners:
            stats = runner.take_window()
            entry = pipeline_entry(runner.name, runner.status, stats, delegate=runner.delegate,
                                   restarts=runner.restarts)
            pipelines.append(entry)
            totals = self.figures.totals.setdefault(runner.name, {"frames": 0, "dropped": 0})
            totals["frames"] += entry["frames"]
            totals["dropped"] += entry["dropped"]
        spool = self._spool.stats() if self._spool is not None else None
        spool_part = {"pending": spool.pending, "bytes": spool.bytes, "dropped": spool.dropped,
                      "dropped_events": spool.dropped_events, "rejected": spool.rejected,
                      "write_errors": self._spool_write_errors} if spool else {"pending": 0, "dropped": 0}
        link_status = self._link.status.to_dict() if self._link is not None else None
        message = telemetry_message(self.topics, self.boot, interval_s=window_s, pipelines=pipelines,
                                    system=self.probe.sample(), spool=spool_part, mqtt=link_status)
        self.figures.latest = message
        self._spool_message(self.topics.telemetry, message, PRIORITY_TELEMETRY)

    def _spool_message(self, topic: str, message: Mapping[str, Any], priority: int) -> None:
        spool = self._spool
        if spool is None or spool.closed:
            return
        try:
            spool.append(topic, encode(message), qos=1, priority=priority)
        except sqlite3.Error as exc:  # disk full, I/O error: report on stderr, keep running
            self._spool_write_errors += 1
            log.error("cannot write to the spool %s: %s — message lost", spool.path, exc)
            return
        if self._link is not None:
            self._link.notify()

    # -- state and commands ----------------------------------------------------------------
    def _state_changed(self) -> None:
        self._state_dirty.set()
        self._wake.set()

    def _state_message(self, *, online: bool, reason: str | None = None) -> dict[str, Any]:
        message: dict[str, Any] = {
            "v": PROTOCOL_VERSION, "type": "state", "fleet": self.topics.fleet, "device": self.topics.device,
            "ts": round(time.time(), 3), "online": online, "boot_id": self.boot.boot_id,
            "started": round(self.boot.started, 3), "profile": getattr(self.profile, "name", None),
            "groups": list(self.config.groups),
        }
        if reason:
            message["reason"] = reason
        if online or reason == "shutdown":
            message.update({"versions": self._versions, "delegates": self._delegates,
                            "pipelines": [runner.describe() for runner in self._runners]})
        return message

    def _on_connected(self, offline_s: float | None) -> None:
        """After a reconnect (not the first connect): say how long the device was cut off."""
        if offline_s is None:
            return
        link = self._link
        self.emit("mqtt_reconnected", "warning", f"reconnected to the broker after {offline_s:.1f} s offline",
                  data={"offline_s": round(offline_s, 3), "session_present": link.status.session_present if link
                        else None, "pending": self._spool.pending if self._spool else None})

    def _on_message(self, topic: str, payload: bytes) -> None:
        if topic != self.topics.cmd:
            log.warning("ignoring a message on unexpected topic %s", topic)
            return
        if self.commands is not None:
            self.commands.submit(topic, payload)

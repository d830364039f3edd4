"""The on-device daemon: runs pipelines, reports over MQTT, takes commands.

:class:`Agent` ties the parts together:

- one :class:`~.runner.PipelineRunner` per configured pipeline, each in its own thread, which
  builds, watches and restarts its pipeline and reports what it does as events;
- the main thread ticks every ``telemetry_interval_s``: it takes each pipeline's window
  (``Pipeline.take_window()``), samples the system probes and writes one telemetry message to the
  on-disk spool; :class:`~edgeinfer.link.mqtt.MqttLink` drains the spool at QoS 1 and removes rows
  only on PUBACK, so nothing is lost to network cuts, broker restarts or an agent crash;
- the retained ``state`` (birth) is re-published at every connect and whenever a pipeline's state
  changes; the Last Will turns it offline;
- inbound ``cmd`` messages go to the :class:`~.commands.CommandRouter` (its own thread); the
  built-in commands, model updates (:mod:`.deploy`) and ``/metrics`` (:mod:`.metrics`) see the
  agent only through :class:`~.services.AgentServices`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import sqlite3
import threading
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from .._version import __version__
from ..capture.hwdecode import use_board_decoders
from ..errors import ConfigError
from ..link.mqtt import MqttLink
from ..link.protocol import PROTOCOL_VERSION, Topics, encode
from ..link.spool import PRIORITY_EVENT, PRIORITY_TELEMETRY, Spool
from ..link.vocabulary import DeploymentKind, EventKind
from ..util.redact import redact, redact_values
from .commands import CommandRouter, register_builtin_commands
from .config import AgentConfig, resolve_profile
from .diagnosis import add_diagnosis_commands
from .inventory import delegate_report, software_versions
from .live_view import add_view_commands
from .log_ring import LogRing
from .metrics import start_metrics
from .model_check import ConfigErrors
from .pipelines import Runners
from .provisioning import link_tls, start_renewer
from .runner import PipelineFactory, PipelineRunner, default_pipeline_factory
from .services import TelemetryFigures
from .telemetry import (
    BootSequence,
    SystemProbe,
    default_throttle_sensors,
    event_message,
    footprint_section,
    spool_section,
    telemetry_message,
)
from .uploads import start_uploader

if TYPE_CHECKING:
    from .pipeline_config import PipelineConfig

log = logging.getLogger(__name__)

#: how long shutdown waits for the broker to acknowledge the offline state and last messages
SHUTDOWN_DRAIN_S = 3.0


def claim_data_dir(config: AgentConfig) -> Any:
    """Create ``data_dir``, prove it writable, and lock it for the agent's life (the open lock file).

    Two agents on one spool (and one MQTT client id) would steal each other's session and send
    everything twice, so a second agent on the same ``data_dir`` is a ConfigError.
    """
    import fcntl
    import os

    try:
        config.data_dir.mkdir(parents=True, exist_ok=True)
        probe_file = config.data_dir / ".write-test"
        probe_file.write_bytes(b"")
        probe_file.unlink()
    except OSError as exc:
        raise ConfigError(f"{config.path or 'config'}: data_dir: cannot write to {config.data_dir} "
                          f"({exc.strerror}) — create it and give the agent's user write access") from None
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


def watchdog_interval() -> float | None:
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


def report_reconnect(agent: Agent, offline_s: float | None) -> None:
    """The link's ``on_connected``: after a reconnect (not the first connect), say how long the device was cut off."""
    if offline_s is None:
        return
    link, spool = agent.link, agent.spool
    agent.emit(EventKind.MQTT_RECONNECTED, "warning", f"reconnected to the broker after {offline_s:.1f} s offline",
               data={"offline_s": round(offline_s, 3), "session_present": link.status.session_present if link
                     else None, "pending": spool.pending if spool else None})


class Agent:
    """The device agent. ``run()`` blocks until ``stop()`` (e.g. from a SIGTERM handler).

    It is the :class:`~.services.AgentServices` its plug-ins (commands, updates, /metrics) are given.
    """

    def __init__(self, config: AgentConfig, *, pipeline_factory: PipelineFactory = default_pipeline_factory,
                 probe: SystemProbe | None = None) -> None:
        self.config = config
        self.topics: Topics = config.topics
        self.boot = BootSequence()
        self.probe = probe  # built in open(), once the device profile is known
        self.profile: Any = None
        self.figures = TelemetryFigures()
        self.commands: CommandRouter | None = None
        self.updates: Any = None
        self._factory = pipeline_factory
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._state_dirty = threading.Event()
        self._spool: Spool | None = None
        self._link: MqttLink | None = None
        self._metrics: Any = None
        self.live_views: Any = None  # live_view pushes (edgeinfer.agent.live_view)
        self.uploader: Any = None  # event evidence and samples to the fleet manager (agent/uploads.py)
        self.log_ring = LogRing()  # the recent log lines the fleet may ask for (agent/log_ring.py)
        self.diagnosis: Any = None  # the logs and doctor commands (agent/diagnosis.py)
        self.renewer: Any = None  # renews a provisioned device's certificate (agent/provisioning.py)
        self.pipelines = Runners(self._make_runner)  # built in open(), once the configuration is known
        self.configuration: Any = None  # the fleet's configuration revisions (agent/configuration.py)
        self._delegates: list[dict[str, Any]] = []
        self._versions: dict[str, str | None] = {}
        self._opened = self._closed = False
        self._lock_file: Any = None
        self._last_tick: float | None = None
        self._spool_write_errors = 0
        self.exit_status = 0  # what the process exits with after run(): request_exit()
        self.config_errors = ConfigErrors(self.stop)  # a pipeline's first start failed as configured: exit 78

    # -- what plug-ins see (AgentServices) -------------------------------------------------
    def stop(self) -> None:
        """Ask run() to finish (safe from a signal handler or another thread)."""
        self._stop.set()
        self._wake.set()

    def request_exit(self, status: int) -> None:
        """Stop, and have the process end with ``status`` (an agent update: its launcher starts the new slot)."""
        self.exit_status = status
        self.stop()

    def runner(self, name: str) -> PipelineRunner:
        """The runner of pipeline ``name``; ValueError lists the names."""
        return self.pipelines.get(name)

    def add_pipeline(self, config: PipelineConfig) -> PipelineRunner:
        """Start a pipeline beside the others (a configuration revision), and say so in the state."""
        runner = self.pipelines.add(config)
        self._state_changed()
        return runner

    def remove_pipeline(self, name: str) -> None:
        """Stop pipeline ``name`` and drop it; the others go on."""
        self.pipelines.remove(name)
        self._state_changed()

    def use_agent_keys(self, config: AgentConfig) -> None:
        """Take ``config``'s agent keys a fleet revision sets (``telemetry_interval_s``: from the next tick)."""
        self.config = dataclasses.replace(self.config, telemetry_interval_s=config.telemetry_interval_s)
        self._wake.set()

    @property
    def stopping(self) -> bool:
        """True once stop() was asked for: long command handlers should wrap up."""
        return self._stop.is_set()

    @property
    def runners(self) -> list[PipelineRunner]:
        """The pipelines' runners, in config order (empty before open())."""
        return self.pipelines.all

    @property
    def link(self) -> MqttLink | None:
        """The MQTT link (None before open())."""
        return self._link

    @property
    def spool(self) -> Spool | None:
        """The on-disk outbox (None before open())."""
        return self._spool

    @property
    def versions(self) -> Mapping[str, str | None]:
        """edgeinfer, Python, protocol and runtime versions (read in open())."""
        return dict(self._versions)

    def emit(self, event: EventKind | str, level: str, message: str, *, pipeline: str | None = None,
             cmd_id: str | None = None, data: Mapping[str, Any] | None = None) -> None:
        """Log an event and spool it for the ``events`` topic, its secrets masked (ValueError: an unknown kind)."""
        log.log({"info": logging.INFO, "warning": logging.WARNING}.get(level, logging.ERROR), "event %s: %s",
                event, message)
        body = event_message(self.topics, self.boot, EventKind(event).value, level, redact(message),
                             pipeline=pipeline, cmd_id=cmd_id, data=redact_values(dict(data or {})))
        self._spool_message(self.topics.events, body, PRIORITY_EVENT)

    def _make_runner(self, config: PipelineConfig, on_config_error: Any) -> PipelineRunner:
        uploader, settings = self.uploader, self.config
        return PipelineRunner(config, emit=self.emit, on_change=self._state_changed, factory=self._factory,
                              restart_min_s=settings.restart_min_s, restart_max_s=settings.restart_max_s,
                              on_evidence=uploader.enqueue if uploader else None,
                              on_sample=uploader.enqueue_sample if uploader else None, on_config_error=on_config_error)

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
        self.log_ring.install()  # first: the start's own lines are in the ring
        self._lock_file = claim_data_dir(self.config)
        from .configuration import ConfigUpdates
        from .deploy import UpdateService

        self.updates = UpdateService(self.config)  # A/B model slots: may replace the configured model
        self.configuration = ConfigUpdates(self.config)  # the fleet's revision over agent.yaml, if one was applied
        self.config = config = self.updates.installed_config(self.configuration.effective())
        self.profile = resolve_profile(config)
        use_board_decoders(self.profile.decoders() if self.profile is not None else {})  # RTSP: hardware decoding
        if self.probe is None:
            sensors = config.sensors
            self.probe = SystemProbe(root=sensors.root, thermal_zones=sensors.thermal_zones,
                                     throttle=sensors.throttle or default_throttle_sensors(sensors.root),
                                     profile=self.profile)
        self._spool = Spool(config.data_dir / "spool.sqlite3", max_bytes=config.spool_max_bytes)
        self._versions = software_versions()
        self._delegates = delegate_report(self.profile, config.sensors.root)
        # state-changing commands must be signed by the same pinned fleet key as model updates
        self.commands = CommandRouter(self, config.data_dir / "commands.sqlite3", key=self.updates.key,
                                      device_id=config.device_id)
        register_builtin_commands(self.commands)
        self.updates.register(self.commands)
        self.updates.register_kind(DeploymentKind.CONFIG, self.configuration)  # configuration revisions
        offline = encode(self._state_message(online=False, reason="connection lost"))
        tls = link_tls(config)  # kept: a renewed certificate is loaded into it (agent/provisioning.py)
        self._link = MqttLink(config.link_settings(), spool=self._spool, will=(self.topics.state, offline),
                              subscriptions=[self.topics.cmd], on_message=self._on_message,
                              on_connected=functools.partial(report_reconnect, self), tls=tls)
        # runners exist before the link connects: a command queued in the persistent session may
        # arrive at once and name a pipeline; commands wait in the router's queue until it starts
        self.uploader = start_uploader(config, self.emit)
        self.live_views, self._factory = add_view_commands(self, self.commands, config, self._factory)
        self.diagnosis = add_diagnosis_commands(self, self.commands, config, self.log_ring)
        self.pipelines.build(config, self.config_errors.reporter)
        self._link.set_retained(self.topics.state, encode(self._state_message(online=True)))
        self._link.start()
        self.renewer = start_renewer(config, tls, self.emit)  # a provisioned device's certificate
        if config.metrics is not None:
            self._metrics = start_metrics(self, *config.metrics)
        self.emit(EventKind.AGENT_STARTED, "info", f"agent {__version__} started on {config.device_id}",
                  data={"versions": self._versions, "pipelines": [p.name for p in config.pipelines],
                        "broker": str(self._link.broker), "profile": getattr(self.profile, "name", None)})
        self.pipelines.start()
        self.commands.start()
        self.updates.start(self)  # the agent kind: what its launcher decided, and a trial's judgement
        self.configuration.start(self)  # a revision the agent stopped in the middle of: rolled back, said so
        sd_notify("READY=1")

    def close(self) -> None:
        """Stop pipelines, send a last window and the offline state, disconnect, close the spool. Idempotent."""
        if self._closed or not self._opened:
            self._closed = True
            return
        self._closed = True
        sd_notify("STOPPING=1")
        self.emit(EventKind.AGENT_STOPPING, "info", "agent stopping")
        self.pipelines.stop()
        with contextlib.suppress(Exception):
            self._tick()
        if self.commands is not None:
            self.commands.stop()
        # unsent events stay on disk
        for service in (self.uploader, self._metrics, self.live_views, self.diagnosis, self.renewer):
            if service is not None:
                service.close()
        if self._link is not None:
            self._link.set_retained(self.topics.state, encode(self._state_message(online=False, reason="shutdown")))
            self._link.stop(drain_timeout=SHUTDOWN_DRAIN_S)
        if self._spool is not None:
            self._spool.close()
        if self._lock_file is not None:
            self._lock_file.close()
            self._lock_file = None
        self.log_ring.uninstall()

    def __enter__(self) -> Agent:
        self.open()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- the main loop ---------------------------------------------------------------------
    def _loop(self) -> None:
        self._last_tick = time.monotonic()
        self.probe.sample()  # CPU figures are deltas: take the first mark now
        next_tick = self._last_tick + self.config.telemetry_interval_s
        watchdog = watchdog_interval()
        next_watchdog = time.monotonic()
        while not self._stop.is_set():
            now = time.monotonic()
            if watchdog is not None and now >= next_watchdog:
                sd_notify("WATCHDOG=1")  # from the main loop: if it hangs, systemd restarts the agent
                next_watchdog = now + watchdog
            interval = self.config.telemetry_interval_s  # a fleet revision may change it
            next_tick = min(next_tick, now + interval)
            if now >= next_tick:
                self._safe_tick()
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

    def _safe_tick(self) -> None:
        try:
            self._tick()
        except Exception as exc:  # a telemetry bug must not stop the daemon (or its pipelines)
            log.exception("telemetry tick failed")
            self.emit(EventKind.ERROR, "error", f"telemetry failed: {type(exc).__name__}: {exc}",
                      data={"reason": "telemetry_failed"})

    def _tick(self) -> None:
        """Spool one telemetry message: every pipeline's window since the last tick, the probes, the link."""
        now = time.monotonic()
        window_s = self.config.telemetry_interval_s if self._last_tick is None else max(1e-3, now - self._last_tick)
        self._last_tick = now
        link_status = self._link.status.to_dict() if self._link is not None else None
        system = self.probe.sample()
        message = telemetry_message(self.topics, self.boot, interval_s=window_s,
                                    pipelines=self.pipelines.windows(self.figures), system=system,
                                    spool=spool_section(self._spool, self._spool_write_errors), mqtt=link_status,
                                    footprint=footprint_section(self.runners, system))
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

    state_changed = _state_changed  # AgentServices: plug-ins say their part of the state changed

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
                            "pipelines": [runner.describe() for runner in self.runners]})
            message.update(self.updates.state_sections(self.config.pipelines) if self.updates is not None else {})
            if self.configuration is not None:  # the revision it runs, the one on trial, the last refused
                message["config"] = self.configuration.describe()
        return message

    def _on_message(self, topic: str, payload: bytes) -> None:
        if topic != self.topics.cmd:
            log.warning("ignoring a message on unexpected topic %s", topic)
            return
        if self.commands is not None:
            self.commands.submit(topic, payload)

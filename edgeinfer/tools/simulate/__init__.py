"""Simulated agents: thousands in one process, on one thread, speaking the real protocol to a real broker.

For load tests, demos and benchmarks (``edgeinfer fleet simulate``). Each device is a paho client with a persistent
MQTT 5 session, a retained birth and a Last Will on ``state``, telemetry with its ``boot_id`` and ``seq`` every
interval (phases spread over the interval), and answers to ``deploy`` commands with the agent's own ``update``
events (downloading → validating → active, or failed for the share ``fail_rate`` picks, fixed per device and
``seed``; a configuration deployment the same way, refused by the share ``config_refuse_rate`` picks, the
configuration each runs in its ``state``), and ``rollback`` commands as the agent does. Telemetry carries a
classifier's output summary; how a device runs a deployed model — slower, with drifted answers, failing — is the
``behaviours`` setting, by the artifact's sha256 or the model's name (:class:`Behaviour`), so a canary analysis can
be tried on a fleet without hardware. All clients share one network thread through paho's external-loop API
(``selectors``; no thread per device). Connections are spread over a ramp, and a lost connection is retried with
:class:`~edgeinfer.util.backoff.Backoff` and equal jitter, so a thousand devices do not reconnect in lockstep after a
broker restart. Telemetry made while offline waits in the client (up to ``max_pending`` per device; beyond that it
is counted as dropped) and goes out after the reconnect; a message counts as acked on a PUBACK that accepts it, and
as refused on one whose reason code is a failure (>= 0x80, e.g. 0x87 Not authorized: the broker's ACL does not let
the account write that topic). Mosquitto says so under MQTT 5, which the simulator speaks; under MQTT 3.1.1 a
broker cannot refuse a publish (it acknowledges and drops it). A device's fleet (the topic level) is the one its
credential names (``fleet enroll --json`` prints it), else ``SimulationSettings.fleet``, else ``default``, as for
an agent and ``fleet enroll``.
"""

from __future__ import annotations

import heapq
import itertools
import json
import logging
import queue
import random
import selectors
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from ...errors import ClosedError
from ...link.settings import parse_broker_url
from ...link.vocabulary import DEFAULT_FLEET, Command, TargetState
from ...util.backoff import EQUAL_JITTER, Backoff
from .connections import DeviceConnections
from .device import Behaviour, SimDevice, fails

log = logging.getLogger(__name__)

#: threads that make TLS devices' first connections (their handshakes wait on the broker, not on this process)
CONNECTORS = 8
#: the longest the network thread runs due timers before it reads its sockets again
TIMER_SLICE_S = 0.05

__all__ = ["Behaviour", "Simulation", "SimulationReport", "SimulationSettings"]


@dataclass(frozen=True, kw_only=True)
class SimulationSettings:
    broker: str  # mqtt://host:port
    devices: int
    #: the devices' fleet; None: the one each device's credential names, else DEFAULT_FLEET. A fleet that
    #: contradicts a credential's is a ValueError (the broker would refuse every message of that device)
    fleet: str | None = None
    prefix: str = "sim"  # device ids f"{prefix}-{i:05d}"
    interval_s: float = 1.0
    duration_s: float | None = None  # None: until stop()
    fail_rate: float = 0.0
    #: share of devices that refuse every configuration document they are sent (fixed per device and seed)
    config_refuse_rate: float = 0.0
    seed: int = 0
    ramp_s: float | None = None  # None: min(10, devices / 100) seconds
    groups: tuple[str, ...] = ()
    update_delay_s: tuple[float, float] = (0.05, 0.3)  # between the update events of one device
    max_pending: int = 10_000  # unacknowledged telemetry kept per device
    reconnect_min_s: float = 0.5
    reconnect_max_s: float = 30.0
    #: device id -> (MQTT user name, password) or (user name, password, fleet), from `edgeinfer fleet enroll
    #: --json` (a broker with accounts)
    credentials: Mapping[str, tuple[str, ...]] | None = field(default=None, repr=False)
    #: device id -> the agent.yaml keys of a provisioned identity (``cert``, ``key``, ``ca``, ``groups``: what
    #: :func:`.provision.provision_fleet` returns): each device connects with its own certificate (``broker`` is the
    #: certificate listener, mqtts://), and the device ids are these
    identities: Mapping[str, Mapping[str, Any]] | None = field(default=None, repr=False)
    #: devices join while it runs (:meth:`Simulation.join`: each as soon as it is provisioned), ``devices`` of them at
    #: most; ``identities`` are those there from the start (they may be none)
    joining: bool = False
    #: how devices run a deployed model, by its artifact sha256 or its model name: "slow:5", "drift",
    #: "errors:0.5", "healthy" (:class:`Behaviour`); a model named nowhere runs healthy
    behaviours: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        parse_broker_url(self.broker)  # ValueError with the shape of a good URL
        if self.devices < 1:
            raise ValueError(f"devices must be at least 1, not {self.devices}")
        if not 0.0 <= self.fail_rate <= 1.0:
            raise ValueError(f"fail rate must be within 0..1, not {self.fail_rate}")
        if not 0.0 <= self.config_refuse_rate <= 1.0:
            raise ValueError(f"config refuse rate must be within 0..1, not {self.config_refuse_rate}")
        if self.interval_s <= 0:
            raise ValueError(f"interval must be > 0 s, not {self.interval_s}")
        if self.identities is not None:
            if self.credentials is not None:
                raise ValueError("credentials or identities (certificates), not both")
            if len(self.identities) > self.devices or (len(self.identities) < self.devices and not self.joining):
                raise ValueError(f"{len(self.identities)} identities for {self.devices} devices")
            if not parse_broker_url(self.broker).tls:
                raise ValueError(f"devices with certificates connect to an mqtts:// broker, not {self.broker}")
        elif self.joining:
            raise ValueError("devices that join are provisioned ones: joining needs identities ({} while none are)")
        if self.credentials is not None:
            missing = [d for d in self.device_ids() if d not in self.credentials]
            if missing:
                raise ValueError(f"no credentials for {len(missing)} device(s), e.g. {missing[0]}")
            for device_id in self.device_ids():
                theirs = _credential_fleet(self.credentials[device_id])
                if self.fleet is not None and theirs is not None and theirs != self.fleet:
                    raise ValueError(f"fleet {self.fleet!r} contradicts the credentials: {device_id} is enrolled in "
                                     f"fleet {theirs!r} (leave the fleet out to take each device's from its "
                                     "credential)")
        for spec in self.behaviours.values():
            Behaviour.parse(spec)  # ValueError names the shapes it takes

    def device_ids(self) -> list[str]:
        if self.identities is not None:
            return list(self.identities)
        return [f"{self.prefix}-{i:05d}" for i in range(self.devices)]

    def fleet_of(self, device_id: str) -> str:
        """The fleet ``device_id`` publishes in: its credential's, else ``fleet``, else DEFAULT_FLEET."""
        credential = (self.credentials or {}).get(device_id)
        return (_credential_fleet(credential) if credential else None) or self.fleet or DEFAULT_FLEET


def _credential_fleet(credential: tuple[str, ...]) -> str | None:
    """The fleet a credential names (its third item), or None for a bare (user name, password)."""
    return credential[2] if len(credential) > 2 and credential[2] else None


@dataclass
class SimulationReport:
    devices: int
    published: int
    acked: int
    refused: int  # telemetry the broker answered with a failure reason code (MQTT 5), e.g. 0x87 Not authorized
    dropped: int
    online: int
    connects: int
    peak_connects_per_s: int
    commands: int
    updates_active: int
    updates_failed: int
    elapsed_s: float
    #: seconds from the start (:meth:`Simulation.start`'s ``since``: a provisioned fleet's, the start of its
    #: provisioning) until every device had connected once (None: some never did, or devices may still join)
    all_online_s: float | None = None
    #: CPU seconds of the TLS devices' first connections (each device's TLS context, its TCP connection and
    #: handshake, its CONNECT) on the threads that made them; the CONNACK and what follows are the network thread's
    connect_cpu_s: float = 0.0
    #: CPU seconds of the network thread (every device's reads and writes, telemetry, timers, keepalives)
    network_cpu_s: float = 0.0
    connect_times: list[float] = field(default_factory=list, repr=False)
    per_device: dict[str, dict[str, Any]] = field(default_factory=dict, repr=False)

    def to_dict(self) -> dict[str, Any]:
        out = {k: v for k, v in self.__dict__.items() if k != "connect_times"}
        out["elapsed_s"] = round(self.elapsed_s, 3)
        if self.all_online_s is not None:
            out["all_online_s"] = round(self.all_online_s, 3)
        out["connect_cpu_s"] = round(self.connect_cpu_s, 3)
        out["network_cpu_s"] = round(self.network_cpu_s, 3)
        return out


def peak_per_second(times: list[float]) -> int:
    """The most events within any one-second window."""
    ordered, best, start = sorted(times), 0, 0
    for end, t in enumerate(ordered):
        while t - ordered[start] >= 1.0:
            start += 1
        best = max(best, end - start + 1)
    return best


class Simulation(DeviceConnections):
    """``start()`` (or ``run()``), then ``stop()`` (graceful) or ``kill()`` (abrupt: Last Wills fire)."""

    def __init__(self, settings: SimulationSettings) -> None:
        from ...link.paho_client import require_paho

        require_paho()
        self.settings = settings
        self.broker = parse_broker_url(settings.broker)
        self._behaviours = {model: Behaviour.parse(spec) for model, spec in settings.behaviours.items()}
        #: device id -> its identity's agent.yaml keys (settings.identities, and the devices that joined)
        self.identities: dict[str, Mapping[str, Any]] = dict(settings.identities or {})
        self._joining = settings.joining
        self._lock = threading.Lock()  # devices join, and add their connects' CPU, from provisioning threads
        self.connect_cpu_s = 0.0
        self.devices = [self._device(device_id) for device_id in settings.device_ids()]
        self._rng = random.Random(settings.seed)
        self._backoff = Backoff(initial_s=settings.reconnect_min_s, max_s=settings.reconnect_max_s,
                                jitter=EQUAL_JITTER)
        self._selector = selectors.DefaultSelector()
        self._timers: list[tuple[float, int, Callable[[], None]]] = []
        self._order = itertools.count()
        self._stop = threading.Event()
        # TLS: a device's first connection (its context, the TCP connect and the handshake, which paho does blocking)
        # is made on a small pool, so that thousands of handshakes neither wait one behind the other nor hold up
        # the network thread; a failed one comes back through _failed to be retried there
        self._connector = (ThreadPoolExecutor(CONNECTORS, thread_name_prefix="edgeinfer-simulate-connect")
                           if self.broker.tls else None)
        self._failed: queue.SimpleQueue[SimDevice] = queue.SimpleQueue()
        self._producing = True
        self._turns = 0  # turns of the network thread's loop (stop() waits for one after it stops producing)
        self._abrupt = False
        self._thread: threading.Thread | None = None
        self._started_at: float | None = None
        self._ended_at: float | None = None
        self._network_cpu: float | None = None  # the network thread's CPU seconds, once it has ended
        self.connect_times: list[float] = []
        self.first_connects: list[float] = []  # when each device connected for the first time
        self.commands = 0
        self.updates = {"active": 0, "failed": 0}
        self.rollbacks = 0
        self.first_refusal: str | None = None  # what the broker refused first (logged once), for a report

    # ------------------------------------------------------------------------------ public API
    def device_ids(self) -> list[str]:
        return [d.device_id for d in self.devices]

    def failing_devices(self) -> list[str]:
        return [d.device_id for d in self.devices if d.failing]

    @property
    def online(self) -> int:
        return sum(d.connected for d in self.devices)

    def start(self, since: float | None = None) -> Simulation:
        """Start the network thread; ``since`` (``time.monotonic()``, default now) is when the simulation's clock
        starts (``elapsed_s``, ``all_online_s``): a provisioned fleet's, when its provisioning did."""
        if self._thread is not None:
            raise ClosedError("a simulation runs once — create a new one")
        self._started_at = time.monotonic() if since is None else since
        self._thread = threading.Thread(target=self._run, name="edgeinfer-simulate", daemon=True)
        self._thread.start()
        return self

    def join(self, identity: Mapping[str, Any]) -> None:
        """A device provisioned while the simulation runs (settings ``joining``), by its identity's agent.yaml keys
        (``device_id``, ``cert``, ``key``, ``ca``, ``groups``): added, and its first connection made on the calling
        thread — the provisioning thread that just got its certificate, as an agent connects as soon as it has one
        (the handshake waits on the broker, not on this process). ClosedError once joining is done."""
        device_id = str(identity["device_id"])
        with self._lock:
            if not self._joining:
                raise ClosedError(f"{device_id} cannot join: this simulation takes no more devices")
            if device_id in self.identities or len(self.devices) >= self.settings.devices:
                raise ValueError(f"{device_id} cannot join: already there, or {self.settings.devices} devices are")
            self.identities[device_id] = identity
            device = self._device(device_id)
            self.devices.append(device)
        self._first_connect(device)

    def done_joining(self) -> None:
        """No more devices join: ``all_online_s`` is when every device that did had connected once."""
        with self._lock:
            self._joining = False

    def run(self, on_progress: Callable[[SimulationReport], None] | None = None,
            progress_every_s: float = 5.0) -> SimulationReport:
        """Start, run for duration_s (or until stop() / KeyboardInterrupt), then stop; the final report."""
        if self._thread is None:
            self.start()
        deadline = None if self.settings.duration_s is None else time.monotonic() + self.settings.duration_s
        try:
            while not self._stop.is_set() and (deadline is None or time.monotonic() < deadline):
                self._stop.wait(min(progress_every_s, max(0.0, (deadline or 1e18) - time.monotonic())))
                if on_progress is not None:
                    on_progress(self.report())
        finally:
            self.stop()
        return self.report()

    def stop(self, drain_s: float = 5.0) -> None:
        """Stop publishing, wait up to ``drain_s`` for outstanding PUBACKs, disconnect cleanly (no Last Will)."""
        if self._thread is None or not self._thread.is_alive():
            return
        self._producing = False
        deadline = time.monotonic() + drain_s
        # the network thread may be inside a publish that checked _producing just before: wait until it
        # has begun a new turn of its loop (so that publish is in flight) before waiting for the PUBACKs
        turn = self._turns
        while time.monotonic() < deadline and self._turns < turn + 2 and self._thread.is_alive():
            time.sleep(0.005)
        while time.monotonic() < deadline and any(d.in_flight for d in self.devices if d.connected):
            time.sleep(0.05)
        self._stop.set()
        self._thread.join(30)

    def kill(self) -> None:
        """Drop every connection without a DISCONNECT: the broker publishes each device's Last Will."""
        self._abrupt = True
        self.stop(drain_s=0.0)

    def report(self) -> SimulationReport:
        per_device = {d.device_id: {"fleet": d.fleet, "boot_id": d.boot_id, "seq_first": d.counters.seq_first,
                                    "seq_last": d.counters.seq_last, "published": d.counters.published,
                                    "acked": d.counters.acked, "refused": d.counters.refused,
                                    "connects": d.counters.connects, "failing": d.failing} for d in self.devices}
        end = self._ended_at or time.monotonic()
        total = lambda name: sum(getattr(d.counters, name) for d in self.devices)  # noqa: E731
        times = list(self.connect_times)
        firsts = list(self.first_connects)
        everyone = firsts and not self._joining and len(firsts) == len(self.devices)
        all_online = max(firsts) - (self._started_at or end) if everyone else None
        return SimulationReport(
            devices=len(self.devices), published=total("published"), acked=total("acked"),
            refused=total("refused"), dropped=total("dropped"),
            online=self.online, connects=total("connects"), peak_connects_per_s=peak_per_second(times),
            commands=self.commands, updates_active=self.updates["active"], updates_failed=self.updates["failed"],
            elapsed_s=end - (self._started_at or end), all_online_s=all_online, connect_cpu_s=self.connect_cpu_s,
            network_cpu_s=self._network_cpu_s(), connect_times=times,
            per_device=per_device)

    def _network_cpu_s(self) -> float:
        if self._network_cpu is not None:
            return self._network_cpu
        try:  # the thread's own CPU clock, read from this one
            return time.clock_gettime(time.pthread_getcpuclockid(self._thread.ident))  # type: ignore[union-attr]
        except (AttributeError, OSError, TypeError):
            return 0.0

    def __enter__(self) -> Simulation:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _device(self, device_id: str) -> SimDevice:
        """A device's state; the groups it reports are its identity's (the claim's), else the settings' ``groups``."""
        settings = self.settings
        identity = self.identities.get(device_id)
        return SimDevice(device_id, settings.fleet_of(device_id), fails(device_id, settings.seed, settings.fail_rate),
                         groups=tuple(identity.get("groups") or ()) if identity else settings.groups,
                         behaviours=self._behaviours,
                         config_refuses=fails(f"config:{device_id}", settings.seed, settings.config_refuse_rate))

    # ------------------------------------------------------------------------------ the network thread
    def _later(self, delay: float, action: Callable[[], None]) -> None:
        heapq.heappush(self._timers, (time.monotonic() + delay, next(self._order), action))

    def _run(self) -> None:
        ramp = self.settings.ramp_s if self.settings.ramp_s is not None else min(10.0, len(self.devices) / 100)
        for index, device in enumerate(self.devices):
            self._later(ramp * index / len(self.devices), lambda d=device: self._connect(d))
        last_misc = time.monotonic()
        try:
            while not self._stop.is_set():
                self._turns += 1
                while not self._failed.empty():
                    self._retry(self._failed.get())
                wait = min(0.05, max(0.0, self._timers[0][0] - time.monotonic())) if self._timers else 0.05
                for key, mask in self._selector.select(wait):
                    self._pump(key.data, mask)
                now = time.monotonic()
                # due timers, for a slice of time: a TLS connect blocks for its handshake, and a thousand of them
                # run back to back would leave the devices already connected unread (their CONNACKs waiting)
                while self._timers and self._timers[0][0] <= now and time.monotonic() - now < TIMER_SLICE_S:
                    heapq.heappop(self._timers)[2]()
                if now - last_misc >= 1.0:  # keepalive pings and paho's retries
                    last_misc = now
                    for device in self.devices:
                        if device.connected and device.client.loop_misc() != 0:
                            self._lost(device)
        finally:
            self._shutdown()
            self._ended_at = time.monotonic()
            self._network_cpu = time.thread_time()

    def _pump(self, device: SimDevice, mask: int) -> None:
        client = device.client
        rc = client.loop_read() if mask & selectors.EVENT_READ else 0
        if rc == 0 and mask & selectors.EVENT_WRITE:
            rc = client.loop_write()
        if rc != 0:
            self._lost(device)

    def _on_connect(self, client: Any, device: SimDevice, flags: Any, reason: Any, properties: Any) -> None:
        if reason.is_failure:
            log.warning("%s: the broker refused the connection: %s", device.device_id, reason)
            return
        device.connected = True
        device.reconnect_attempt = 0
        device.counters.connects += 1
        self.connect_times.append(time.monotonic())
        client.subscribe(device.topics.cmd, qos=1)
        client.publish(device.topics.state, device.state(), qos=1, retain=True)
        if device.counters.connects == 1:
            self.first_connects.append(time.monotonic())
            phase = self._rng.uniform(0, self.settings.interval_s)
            self._later(phase, lambda: self._tick(device))

    def _tick(self, device: SimDevice) -> None:
        """One telemetry window of ``device``, then the next one ``interval_s`` later."""
        if not self._producing or self._stop.is_set():
            return
        if len(device.in_flight) >= self.settings.max_pending:
            device.counters.dropped += 1  # a full spool: the agent drops too, and says so
        else:
            payload = device.telemetry(self._rng, self.settings.interval_s)
            info = device.client.publish(device.topics.telemetry, payload, qos=1)
            device.in_flight[info.mid] = device.seq
            device.counters.published += 1
        self._later(self.settings.interval_s, lambda: self._tick(device))

    def _on_publish(self, client: Any, device: SimDevice, mid: int, reason: Any, properties: Any) -> None:
        seq = device.in_flight.pop(mid, None)
        refused = reason is not None and reason.is_failure  # MQTT 5 PUBACK reason code >= 0x80
        if refused and self.first_refusal is None:
            self.first_refusal = f"{device.device_id}: {reason} (reason code {reason.value:#04x})"
            log.warning("the broker refused a message of %s in fleet %s: %s (reason code %#04x) — does its "
                        "account (credential) belong to another fleet or device?", device.device_id, device.fleet,
                        reason, reason.value)
        if seq is None:
            return
        counters = device.counters
        if refused:
            counters.refused += 1
            return
        counters.acked += 1
        counters.seq_first = seq if counters.seq_first is None else min(counters.seq_first, seq)
        counters.seq_last = seq if counters.seq_last is None else max(counters.seq_last, seq)

    def _on_message(self, client: Any, device: SimDevice, message: Any) -> None:
        try:
            command = json.loads(message.payload)
        except ValueError:
            return
        self.commands += 1
        if isinstance(command, dict) and command.get("cmd") == Command.ROLLBACK:
            self._later(self._rng.uniform(*self.settings.update_delay_s), lambda: self._roll_back(device, command))
            return
        if not isinstance(command, dict) or command.get("cmd") != Command.DEPLOY:
            return
        for delay, state in device.update_plan(command, self._rng, self.settings.update_delay_s):
            self._later(delay, lambda s=state: self._report_update(device, command, s))

    def _report_update(self, device: SimDevice, command: dict, state: str) -> None:
        device.client.publish(device.topics.events, device.update_event(command, state), qos=1)
        if state in self.updates:
            self.updates[state] += 1
        if state == TargetState.ACTIVE:  # the agent re-publishes its birth with the new model
            device.client.publish(device.topics.state, device.state(), qos=1, retain=True)

    def _roll_back(self, device: SimDevice, command: dict) -> None:
        event = device.roll_back(command)
        if event is None:
            return
        device.client.publish(device.topics.events, event, qos=1)
        self.rollbacks += 1
        device.client.publish(device.topics.state, device.state(), qos=1, retain=True)

    def _shutdown(self) -> None:
        if self._connector is not None:
            self._connector.shutdown(wait=True, cancel_futures=True)
        for device in self.devices:
            client = device.client
            if client is None:
                continue
            if self._abrupt:
                sock = client.socket()
                if sock is not None:
                    sock.close()
            elif device.connected:
                client.disconnect()
                client.loop_write()
            device.connected = False
        self._selector.close()

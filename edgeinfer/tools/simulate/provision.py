"""Simulated first boots: many devices trade one claim for certificates of their own, through the real flow.

Each simulated device is what an agent with a claim is on its first boot (docs/provisioning.md, *The device's side*),
and runs the agent's own code for it (:func:`edgeinfer.agent.provisioning.provision`): its key pair (EC P-256,
made on the simulator, mode 0600), a certificate request with an empty subject, ``POST /api/v1/provision`` with the
claim and its hardware (serial ``<serial_prefix><n>``, a locally administered MAC), the answer written to
``<folder>/<serial>/identity/`` as the agent writes it. A pool of ``concurrency`` threads asks at once (each a blocking
HTTPS request: the manager, not this process, does most of the work); a refusal is counted by its status, a pending
device waits as the agent does (until ``timeout_s``). Each identity is handed to ``on_provisioned`` on the thread that
got it, as soon as it is written: ``fleet simulate --claim`` joins the device to a running :class:`Simulation` there,
which connects it to the broker's certificate listener with its own certificate, as an agent connects as soon as it
is provisioned. A folder that already holds a device's identity is kept (a second run resumes, as a restarted agent
does: the same key, the same request, the same certificate).
"""

from __future__ import annotations

import hashlib
import statistics
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ...agent.identity import identity_dir, read_identity
from ...agent.provisioning import ManagerHTTP, provision
from ...errors import ProvisioningRefused

__all__ = ["ProvisionReport", "ProvisionSettings", "provision_fleet"]

#: what a simulated device says its board is
SIMULATED_MODEL = "edgeinfer simulated device"
#: what a refusal's HTTP status means, for a summary that counts refusals by reason
REFUSAL_REASONS = {400: "bad request", 401: "unknown claim", 403: "claim refused the device",
                   409: "serial taken by another key"}


@dataclass(frozen=True, kw_only=True)
class ProvisionSettings:
    manager_url: str  # https://host:port, as the claim's agent.yaml lines say
    claim: str
    devices: int
    folder: Path  # each device's identity in <folder>/<serial>/identity/
    ca: str | None = None  # the fleet CA: verifies the manager's HTTPS
    serial_prefix: str = "sim-"
    concurrency: int = 32
    timeout_s: float | None = None  # None: as long as it takes (a pending device waits, as the agent does)

    def __post_init__(self) -> None:
        if not self.manager_url.startswith(("http://", "https://")):
            raise ValueError(f"manager URL must be http(s)://HOST:PORT, not {self.manager_url!r}")
        if self.devices < 1:
            raise ValueError(f"devices must be at least 1, not {self.devices}")
        if not 1 <= self.concurrency <= 1024:
            raise ValueError(f"concurrency must be within 1..1024, not {self.concurrency}")

    def serials(self) -> list[str]:
        width = max(5, len(str(self.devices - 1)))
        return [f"{self.serial_prefix}{i:0{width}d}" for i in range(self.devices)]


def hardware_of(serial: str) -> dict[str, str]:
    """What a simulated board says of itself: its serial, a model, a MAC fixed by the serial (locally administered)."""
    digest = hashlib.sha256(serial.encode()).digest()
    return {"serial": serial, "model": SIMULATED_MODEL, "mac": ":".join(f"{b:02x}" for b in (0x02, *digest[:5]))}


@dataclass
class ProvisionReport:
    devices: int
    provisioned: int  # holding a certificate (resumed ones included)
    resumed: int  # whose identity was on disk already (not asked again)
    refused: dict[str, int]  # "<status> <reason>" -> devices
    failed: int  # no answer before the timeout, or pending when it ran out
    elapsed_s: float
    latency_ms: dict[str, float]  # one device's provisioning, first request to identity written: p50, p95, max
    #: CPU time (user + system) of the threads provisioning, while they did: the devices' keys, requests, HTTPS
    #: requests and files (not what ``on_provisioned`` does with them: the connects)
    cpu_s: float
    refusal_examples: dict[str, str] = field(default_factory=dict)
    #: device id -> the agent.yaml keys of its identity (device_id, broker, ca, cert, key, groups, ...)
    identities: dict[str, dict[str, Any]] = field(default_factory=dict, repr=False)

    def to_dict(self) -> dict[str, Any]:
        out = {k: v for k, v in self.__dict__.items() if k != "identities"}
        out["elapsed_s"] = round(self.elapsed_s, 3)
        out["cpu_s"] = round(self.cpu_s, 3)
        out["per_device_ms"] = round(1000 * self.elapsed_s / max(1, self.provisioned), 3)
        out["cpu_per_device_ms"] = round(1000 * self.cpu_s / max(1, self.provisioned), 3)
        return out


def provision_fleet(settings: ProvisionSettings, *, stop: threading.Event | None = None,
                    on_progress: Callable[[int, int], None] | None = None,
                    on_provisioned: Callable[[dict[str, Any]], None] | None = None,
                    progress_every_s: float = 5.0) -> ProvisionReport:
    """Provision every device (see the module's docstring); ``on_progress(done, devices)`` every few seconds,
    ``on_provisioned(identity)`` for each device's identity (a kept one too) on the thread that got it."""
    stop = stop or threading.Event()
    http = ManagerHTTP(settings.manager_url, cafile=settings.ca)  # one TLS context for every device's requests
    results: dict[str, Any] = {}  # serial -> identity keys | ProvisioningRefused | None
    latencies: list[float] = []
    tally = {"resumed": 0, "cpu_s": 0.0, "answered": 0.0}  # answered: when the last answer came (monotonic)
    lock = threading.Lock()

    def one(serial: str) -> None:
        folder = identity_dir(settings.folder / serial)
        began, cpu = time.monotonic(), time.thread_time()
        outcome: Any = read_identity(folder)
        kept = outcome is not None
        if not kept:
            try:
                outcome = provision(settings.manager_url, settings.claim, folder, hardware_of(serial), stop=stop,
                                    http=http)
            except ProvisioningRefused as exc:
                outcome = exc
        spent = time.thread_time() - cpu
        with lock:
            results[serial] = outcome
            tally["cpu_s"] += spent
            tally["resumed"] += kept
            tally["answered"] = time.monotonic()
            if isinstance(outcome, dict) and not kept:
                latencies.append(time.monotonic() - began)
        if isinstance(outcome, dict) and on_provisioned is not None:
            on_provisioned(outcome)

    timer = threading.Timer(settings.timeout_s, stop.set) if settings.timeout_s else None
    started = time.monotonic()
    if timer is not None:
        timer.daemon = True
        timer.start()
    with ThreadPoolExecutor(settings.concurrency, thread_name_prefix="edgeinfer-provision") as pool:
        futures = [pool.submit(one, serial) for serial in settings.serials()]
        pending: Any = futures
        while pending:  # returns as soon as the last is done, not at the next progress report
            pending = wait(pending, timeout=progress_every_s).not_done
            if on_progress is not None:
                on_progress(len(results), settings.devices)
        for future in futures:
            future.result()  # what is not a refusal (a bug, a full disk) is raised, not counted
    if timer is not None:
        timer.cancel()
    # until the last answer (the last devices' connects, on_provisioned's, are the simulation's time)
    elapsed = (tally["answered"] or time.monotonic()) - started
    return _report(settings, results, latencies, tally["resumed"], elapsed, tally["cpu_s"])


def _report(settings: ProvisionSettings, results: dict[str, Any], latencies: list[float], resumed: int,
            elapsed_s: float, cpu_s: float) -> ProvisionReport:
    refused: dict[str, int] = {}
    examples: dict[str, str] = {}
    identities: dict[str, dict[str, Any]] = {}
    for outcome in results.values():
        if isinstance(outcome, ProvisioningRefused):
            reason = f"{outcome.status} {REFUSAL_REASONS.get(outcome.status, 'refused')}"
            refused[reason] = refused.get(reason, 0) + 1
            examples.setdefault(reason, str(outcome))
        elif isinstance(outcome, dict):
            identities[outcome["device_id"]] = outcome
    ordered = sorted(latencies)
    latency = {} if not ordered else {
        "p50": round(1000 * statistics.median(ordered), 2),
        "p95": round(1000 * ordered[min(len(ordered) - 1, int(0.95 * len(ordered)))], 2),
        "max": round(1000 * ordered[-1], 2)}
    return ProvisionReport(devices=settings.devices, provisioned=len(identities), resumed=resumed, refused=refused,
                           failed=settings.devices - len(identities) - sum(refused.values()), elapsed_s=elapsed_s,
                           latency_ms=latency, cpu_s=cpu_s, refusal_examples=examples, identities=identities)

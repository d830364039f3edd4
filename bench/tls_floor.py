"""What a device's provisioning costs in TLS alone: the floor under ``bench/provision_fleet.py``.

Every device provisioned through the real flow makes two TLS 1.3 handshakes — its HTTPS request to the manager (no
client certificate yet) and its MQTT connection to the broker's certificate listener (its own certificate) — and one
TLS context holding its certificate and key. This bench makes exactly those, one at a time, against a real
``fleet serve --tls`` (its managed Mosquitto) on a fresh PostgreSQL, with one device provisioned through the real flow
for its certificate, and reads what each costs on each side:

- ``context``: ``link/settings.tls_context(ca, cert, key)``, the device's context (the client's CPU);
- ``mqtt_handshake``: TCP connect, the TLS handshake presenting the device's certificate, close (the client's CPU,
  Mosquitto's CPU from /proc);
- ``https_handshake``: TCP connect, the TLS handshake to the manager's HTTPS with the agent's context (one for all
  requests, as ``ManagerHTTP`` makes it), close (the client's CPU, the manager's CPU from /proc).

The kinds are alternated round by round; the servers' idle CPU over the same time is measured and taken off. Reported:
medians of the rounds in ms of CPU per operation, their sum per device (``tls_ms_per_device``) and what that sum is
for 10,000 devices on this machine's cores (``tls_s_for_10000_devices``): the part of ``provision_fleet.py``'s time
that no change to edgeinfer's own code shortens while Python's ``ssl`` and Mosquitto use this OpenSSL.

    python bench/tls_floor.py [--rounds 5] [--per-round 200]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import ssl
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from urllib.parse import urlsplit

sys.path.insert(0, str(Path(__file__).resolve().parent))
from provision_fleet import Manager, cpu_s

from edgeinfer.agent.identity import identity_dir
from edgeinfer.agent.provisioning import provision
from edgeinfer.link.settings import parse_broker_url, tls_context
from edgeinfer.tools.simulate.provision import hardware_of


def handshake(context: ssl.SSLContext, host: str, port: int) -> None:
    """One TCP connection, its TLS handshake, closed (the server reads the whole handshake before the close)."""
    with socket.create_connection((host, port), timeout=30) as raw, context.wrap_socket(raw, server_hostname=host):
        pass


def timed(op: Callable[[], object], n: int, servers: dict[str, int]) -> dict[str, float]:
    """``op`` n times: ms of CPU per op of this thread and of each server process (idle not yet taken off), and the
    wall time it took (seconds)."""
    before = {name: cpu_s(pid) for name, pid in servers.items()}
    cpu, wall = time.thread_time(), time.monotonic()
    for _ in range(n):
        op()
    out = {"client": 1000 * (time.thread_time() - cpu) / n, "wall_s": time.monotonic() - wall}
    out.update({name: 1000 * (cpu_s(pid) - before[name]) / n for name, pid in servers.items()})
    return out


def idle_rate(servers: dict[str, int], seconds: float) -> dict[str, float]:
    """The servers' CPU seconds per second while nothing is asked of them."""
    before = {name: cpu_s(pid) for name, pid in servers.items()}
    time.sleep(seconds)
    return {name: (cpu_s(pid) - before[name]) / seconds for name, pid in servers.items()}


def measure(manager: Manager, device_dir: Path, rounds: int, per_round: int) -> dict:
    """Provision one device into ``device_dir``, then time its TLS operations (see the module's docstring)."""
    claim = manager.api("/api/claims", {"groups": ["bench"], "max_devices": 1, "approve": "auto"})
    keys = provision(manager.url, claim["token"], identity_dir(device_dir), hardware_of("tls-floor-0"),
                     cafile=str(manager.ca))
    assert keys is not None
    broker, https = parse_broker_url(keys["broker"]), urlsplit(manager.url)
    device_context = tls_context(keys["ca"], keys["cert"], keys["key"])
    agent_context = ssl.create_default_context(cafile=str(manager.ca))  # as ManagerHTTP makes it
    kinds: dict[str, tuple[Callable[[], object], dict[str, int]]] = {
        "context": (lambda: tls_context(keys["ca"], keys["cert"], keys["key"]), {}),
        "mqtt_handshake": (lambda: handshake(device_context, broker.host, broker.port),
                           {"mosquitto": manager.mosquitto_pid()}),
        "https_handshake": (lambda: handshake(agent_context, https.hostname, https.port),
                            {"manager": manager.proc.pid}),
    }
    for op, _servers in kinds.values():  # warm up: the first of each pays for imports and caches
        op()
    samples: dict[str, list[dict[str, float]]] = {kind: [] for kind in kinds}
    for _ in range(rounds):
        for kind, (op, servers) in kinds.items():
            got = timed(op, per_round, servers)
            idle = idle_rate(servers, min(2.0, got["wall_s"]))  # what the server spends meanwhile on its own
            for name, rate in idle.items():
                got[name] -= 1000 * rate * got["wall_s"] / per_round
            samples[kind].append(got)
    medians = {kind: {side: round(statistics.median(s[side] for s in got), 3)
                      for side in got[0] if side != "wall_s"} for kind, got in samples.items()}
    per_device = sum(sum(sides.values()) for sides in medians.values())
    cores = os.cpu_count() or 1
    return {"rounds": rounds, "per_round": per_round, "cpu_ms_per_operation": medians,
            "tls_ms_per_device": round(per_device, 2),
            "tls_s_for_10000_devices": round(10_000 * per_device / 1000 / cores, 1), "cpus": cores,
            "openssl": ssl.OPENSSL_VERSION,
            "rounds_ms": {kind: [{k: round(v, 3) for k, v in s.items()} for s in got] for kind, got in samples.items()}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--per-round", type=int, default=200)
    args = parser.parse_args()
    from support.postgres import PostgresServer

    with tempfile.TemporaryDirectory(prefix="tls-floor-") as workdir:
        postgres = PostgresServer(Path(workdir) / "pg").start()
        manager = Manager(Path(workdir) / "manager", postgres.create_database("fleet"))
        (Path(workdir) / "manager").mkdir()
        try:
            manager.start()
            print(json.dumps(measure(manager, Path(workdir) / "device", args.rounds, args.per_round), indent=2))
        finally:
            manager.stop()
            postgres.stop()


if __name__ == "__main__":
    main()

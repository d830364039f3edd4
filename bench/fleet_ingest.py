"""How many telemetry messages a second one fleet manager stores, with zero loss, against the broker.

Every phase drains the same kind of backlog: ``--messages`` valid telemetry messages from
``--devices`` device ids, published at QoS 1 while the consumer is offline, so they wait in its
persistent session in Mosquitto (the managed broker's config lifts Mosquitto's per-client queue
limit). Then the consumer connects and the time from its first to its last stored message is
taken. The consumers, in one run:

- **broker**: ``mosquitto_sub`` (C, MQTT 5, QoS 1) draining its session to /dev/null — the
  broker's own delivery rate on this machine, the ceiling for any consumer;
- **1 manager**: ``edgeinfer fleet serve`` (a subprocess) draining into the database — every
  message validated, stored once, acknowledged only after its batch committed;
- **2 managers** (PostgreSQL only): two ``fleet serve`` processes sharing the backlog through an
  MQTT 5 shared subscription; every (device, boot_id, seq) must be stored exactly once.

After each manager phase the database is checked: rows == messages published, no duplicate key,
and the manager's counters (``/metrics``) say received == stored + duplicates + invalid.

    python bench/fleet_ingest.py [--db sqlite|postgres|both] [--messages N] [--devices D] [--reps R]

Figures vary with the machine's load: take the medians, and compare within one run.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "tests")]

TOPIC = "edgeinfer/v1/bench/{device}/telemetry"


def telemetry(device: str, boot: str, seq: int) -> bytes:
    stage = {"p50": 8.0, "p95": 12.0, "p99": 20.0}
    return json.dumps({
        "v": 1, "type": "telemetry", "fleet": "bench", "device": device, "ts": time.time(), "boot_id": boot,
        "seq": seq, "interval_s": 1.0,
        "pipelines": [{"name": "main", "status": "running", "delegate": "xnnpack", "frames": 30, "dropped": 0,
                       "fps": 29.8, "restarts": 0,
                       "stages": {s: stage for s in ("capture", "preprocess", "inference", "postprocess", "latency")}}],
        "system": {"cpu_percent": 35.0, "process_cpu_percent": 80.0, "rss_bytes": 90_000_000,
                   "temperature_c": {"cpu": 51.0}, "throttled": False},
        "spool": {"pending": 0, "dropped": 0}}).encode()


def _publish_share(url: str, devices: list[str], per_device: int, boots: dict[str, str]) -> None:
    import paho.mqtt.client as paho
    from paho.mqtt.enums import CallbackAPIVersion

    host, port = url.removeprefix("mqtt://").split(":")
    client = paho.Client(CallbackAPIVersion.VERSION2, client_id=f"bench-pub-{os.getpid()}", protocol=paho.MQTTv5)
    client.max_inflight_messages_set(1000)
    client.max_queued_messages_set(0)
    client.connect(host, int(port))
    client.loop_start()
    infos = []
    for seq in range(1, per_device + 1):
        for device in devices:
            infos.append(client.publish(TOPIC.format(device=device), telemetry(device, boots[device], seq), qos=1))
    for info in infos:
        info.wait_for_publish(120)
    client.disconnect()
    client.loop_stop()


def publish(url: str, messages: int, devices: int, processes: int = 2) -> None:
    """``messages`` telemetry messages from ``devices`` ids, by ``processes`` publishers, all acknowledged."""
    ids = [f"dev-{i:05d}" for i in range(devices)]
    boots = {d: uuid.uuid4().hex for d in ids}
    per_device = messages // devices
    shares = [ids[i::processes] for i in range(processes)]
    workers = [multiprocessing.Process(target=_publish_share, args=(url, share, per_device, boots))
               for share in shares]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
        if w.exitcode:
            raise SystemExit(f"a publisher failed ({w.exitcode})")


# ----------------------------------------------------------------------------------- consumers
def broker_session(url: str, client_id: str, *, create: bool, count: int = 0) -> float:
    """mosquitto_sub with a persistent session: create it, or drain ``count`` messages; seconds it took."""
    host, port = url.removeprefix("mqtt://").split(":")
    cmd = ["mosquitto_sub", "-h", host, "-p", port, "-V", "mqttv5", "-q", "1", "-c", "-i", client_id,
           "-x", "3600", "-t", "edgeinfer/v1/+/+/telemetry"]
    if create:
        subprocess.run([*cmd, "-W", "1"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        return 0.0
    started = time.perf_counter()
    subprocess.run([*cmd, "-C", str(count)], stdout=subprocess.DEVNULL, check=True, timeout=600)
    return time.perf_counter() - started


def forget_session(url: str, client_id: str) -> None:
    """End a persistent session (a clean connect): the broker stops queueing copies for it."""
    host, port = url.removeprefix("mqtt://").split(":")
    subprocess.run(["mosquitto_sub", "-h", host, "-p", port, "-i", client_id, "-t", "nothing", "-W", "1"],
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


class Manager:
    """``edgeinfer fleet serve`` as a subprocess."""

    def __init__(self, workdir: Path, name: str, broker: str, db: str, *options: str) -> None:
        self.workdir = workdir / name
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.log = self.workdir / "serve.log"
        self.cmd = [sys.executable, "-m", "edgeinfer", "fleet", "serve", "--broker", broker, "--db", db,
                    "--http", "127.0.0.1:0", "--data-dir", str(self.workdir), "--manager-id", f"bench-{name}",
                    *options]
        self.proc: subprocess.Popen | None = None
        self.http = ""

    def start(self) -> Manager:
        return self.launch().wait_ready()

    def launch(self) -> Manager:
        with open(self.log, "wb") as log:  # a fresh log: the address is read from it
            self.proc = subprocess.Popen(self.cmd, stdout=log, stderr=log, cwd=REPO)
        return self

    def wait_ready(self) -> Manager:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            found = re.search(r"HTTP (http://[^,]+),", self.log.read_text(errors="replace"))
            if found:
                self.http = found.group(1)
                return self
            if self.proc.poll() is not None:
                raise SystemExit(f"fleet serve exited: {self.log.read_text()[-2000:]}")
            time.sleep(0.1)
        raise SystemExit("fleet serve did not start")

    def counters(self) -> dict[str, float]:
        text = urllib.request.urlopen(f"{self.http}/metrics", timeout=10).read().decode()
        out: dict[str, float] = {}
        for line in text.splitlines():
            match = re.match(r'^(edgeinfer_fleet_[a-z_]+?)(?:_total)?(\{kind="telemetry"\})? ([0-9.e+-]+)$', line)
            if match and (match.group(2) or "{" not in line):
                out[match.group(1)] = float(match.group(3))
        return out

    def cpu_s(self) -> float:
        """CPU time (user + system, every thread) the manager process has used."""
        fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def peak_rss_mib(self) -> float:
        """The most memory the manager process has held (VmHWM)."""
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
        return 0.0

    def wait_subscribed(self, timeout: float = 30) -> None:
        """Connected, and a moment for the SUBACKs: a session stopped before it subscribed queues nothing."""
        deadline = time.monotonic() + timeout
        while self.counters().get("edgeinfer_fleet_mqtt_connected") != 1.0:
            if time.monotonic() > deadline:
                raise SystemExit(f"fleet serve did not connect to the broker: {self.log.read_text()[-2000:]}")
            time.sleep(0.1)
        time.sleep(1.0)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def tree_cpu_s(pid: int) -> float:
    """CPU time (user + system) of process ``pid`` and all its descendants now alive (PostgreSQL's backends)."""
    parents: dict[int, int] = {}
    times: dict[int, float] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:  # gone meanwhile
            continue
        parents[int(entry.name)] = int(fields[1])
        times[int(entry.name)] = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    total, todo = 0.0, [pid]
    while todo:
        current = todo.pop()
        total += times.get(current, 0.0)
        todo.extend(child for child, parent in parents.items() if parent == current)
    return total


def row_count(engine) -> int:
    import sqlalchemy as sa

    with engine.connect() as conn:
        return int(conn.execute(sa.text("SELECT count(*) FROM telemetry")).scalar())


def stored_rows(engine) -> tuple[int, int]:
    """(rows, distinct keys): the second is a heavier query, run once a phase is over."""
    import sqlalchemy as sa

    with engine.connect() as conn:
        keys = conn.execute(sa.text(
            "SELECT count(*) FROM (SELECT DISTINCT device_id, boot_id, seq FROM telemetry) AS k")).scalar()
    return row_count(engine), int(keys)


def drain_into_managers(workdir: Path, broker: str, db: str, engine, messages: int, devices: int,
                        count: int, others: dict[str, int]) -> dict:
    """``others``: name -> pid of the processes that share the machine with the managers (the broker, the
    database server), whose CPU per message is reported too."""
    names = [f"{workdir.name}-m{i}" for i in range(count)]  # a session per phase: a plain or a shared one
    shared = ("--shared-group", "bench") if count > 1 else ()
    for name in names:  # their sessions (and subscriptions) exist before anything is published
        first_run = Manager(workdir, name, broker, db, *shared).start()
        first_run.wait_subscribed()
        first_run.stop()
    with engine.begin() as conn:
        import sqlalchemy as sa

        conn.execute(sa.text("DELETE FROM telemetry"))
    base_id = f"base-{uuid.uuid4().hex[:6]}"
    broker_session(broker, base_id, create=True)
    publish(broker, messages, devices)
    broker_s = broker_session(broker, base_id, create=False, count=messages)
    managers = [Manager(workdir, name, broker, db, *shared) for name in names]
    for m in managers:  # all at once: one that started later would find its share of the backlog taken
        m.launch()
    for m in managers:
        m.wait_ready()
    cpu_before = sum(m.cpu_s() for m in managers)  # start-up is done: the HTTP address is printed
    others_before = {name: tree_cpu_s(pid) for name, pid in others.items()}
    first: float | None = None
    first_rows = 0
    progress, progress_at = -1, time.monotonic()
    while True:  # polled lightly: the poller shares the machine with the managers it times
        rows = row_count(engine)
        now = time.perf_counter()
        if rows and first is None:
            first, first_rows = now, rows
        if rows != progress:
            progress, progress_at = rows, time.monotonic()
        if rows >= messages or time.monotonic() - progress_at > 60:  # stalled: report what was lost
            break
        time.sleep(0.1)
    last = time.perf_counter()
    time.sleep(1.0)  # anything more (a duplicate would show here)
    cpu_s = sum(m.cpu_s() for m in managers) - cpu_before
    others_s = {name: tree_cpu_s(pid) - others_before[name] for name, pid in others.items()}
    rows, keys = stored_rows(engine)
    counters = [m.counters() for m in managers]
    peak_rss = max(m.peak_rss_mib() for m in managers)
    for m in managers:
        m.stop()
    for client_id in (base_id, *(f"bench-{name}" for name in names)):
        forget_session(broker, client_id)
    received = sum(c.get("edgeinfer_fleet_messages_received", 0) for c in counters)
    stored = sum(c.get("edgeinfer_fleet_messages_stored", 0) for c in counters)
    duplicates = sum(c.get("edgeinfer_fleet_messages_duplicate", 0) for c in counters)
    invalid = sum(c.get("edgeinfer_fleet_messages_invalid", 0) for c in counters)
    rate = (rows - first_rows) / (last - first) if first is not None and last > first else 0.0
    return {"managers": count, "published": messages, "rows": rows, "distinct": keys, "lost": messages - keys,
            "received": received, "stored": stored, "duplicates": duplicates, "invalid": invalid,
            "per_manager_received": [c.get("edgeinfer_fleet_messages_received", 0) for c in counters],
            "peak_rss_mib": peak_rss,
            "mean_batch": received / max(1, sum(c.get("edgeinfer_fleet_ingest_batches", 0) for c in counters)),
            "manager_msg_s": rate, "broker_msg_s": messages / broker_s,
            "manager_cpu_us_per_msg": 1e6 * cpu_s / max(1, rows),
            **{f"{name}_cpu_us_per_msg": 1e6 * spent / max(1, rows) for name, spent in others_s.items()}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--db", choices=("sqlite", "postgres", "both"), default="both")
    parser.add_argument("--messages", type=int, default=60_000)
    parser.add_argument("--devices", type=int, default=200)
    parser.add_argument("--reps", type=int, default=3)
    args = parser.parse_args()
    import sqlalchemy as sa

    from edgeinfer.fleet.broker import ManagedMosquitto, free_port

    workdir = Path(tempfile.mkdtemp(prefix="edgeinfer-bench-ingest-"))
    results: dict[str, list[dict]] = {}
    postgres = None
    try:
        with ManagedMosquitto(workdir / "broker", port=free_port(), allow_anonymous=True) as broker:
            backends = ["sqlite", "postgres"] if args.db == "both" else [args.db]
            for backend in backends:
                if backend == "sqlite":
                    url = f"sqlite:///{workdir / 'fleet.sqlite3'}"
                else:
                    from support.postgres import PostgresServer

                    postgres = PostgresServer(workdir / "pg").start()
                    url = postgres.create_database("bench")
                from edgeinfer.fleet.db import FleetDB

                FleetDB(url).close()  # migrated once, before anything is timed
                others = {"broker": broker.pid}
                if postgres is not None and backend == "postgres":
                    others["database"] = int((postgres.data / "postmaster.pid").read_text().split()[0])
                engine = sa.create_engine(url)
                for count in ((1, 2) if backend == "postgres" else (1,)):
                    for rep in range(args.reps):
                        result = drain_into_managers(workdir / f"{backend}-{count}-{rep}", broker.url, url, engine,
                                                     args.messages, args.devices, count, others)
                        results.setdefault(f"{backend}/{count}", []).append(result)
                        print(f"{backend:8s} managers={count} rep={rep}: stored {result['manager_msg_s']:8.0f} msg/s,"
                              f" broker {result['broker_msg_s']:8.0f} msg/s, manager CPU "
                              f"{result['manager_cpu_us_per_msg']:.0f} us/msg{_others(result)}, lost {result['lost']}, "
                              f"rows {result['rows']}/{result['published']}, duplicates {result['duplicates']:.0f}, "
                              f"mean batch {result['mean_batch']:.0f}, peak RSS {result['peak_rss_mib']:.0f} MiB",
                              flush=True)
                engine.dispose()
    finally:
        if postgres is not None:
            postgres.stop()
        shutil.rmtree(workdir, ignore_errors=True)
    print("\nmedians")
    one = {}
    for key, runs in results.items():
        rate = statistics.median(r["manager_msg_s"] for r in runs)
        ceiling = statistics.median(r["broker_msg_s"] for r in runs)
        cpu = statistics.median(r["manager_cpu_us_per_msg"] for r in runs)
        spent = {name: statistics.median(r[name] for r in runs) for name in runs[0] if name.endswith("_cpu_us_per_msg")}
        busy = rate * sum(spent.values()) / 1e6  # cores kept busy by the managers, the broker and the database
        one.setdefault(key.split("/")[0], rate)
        scale = f", x{rate / one[key.split('/')[0]]:.2f} of one manager" if key.endswith("/2") else ""
        print(f"  {key:11s} {rate:8.0f} msg/s stored = {rate / ceiling:.2f} of the broker's {ceiling:.0f} msg/s"
              f"{scale}; manager CPU {cpu:.0f} us/msg (all its processes' threads){_others(spent)}; "
              f"{busy:.1f} of {os.cpu_count()} cores busy; "
              f"lost {sum(r['lost'] for r in runs)} of {sum(r['published'] for r in runs)}")


def _others(result: dict) -> str:
    return "".join(f", {key.removesuffix('_cpu_us_per_msg')} {value:.0f}" for key, value in result.items()
                   if key.endswith("_cpu_us_per_msg") and not key.startswith("manager"))


if __name__ == "__main__":
    main()

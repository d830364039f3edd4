#!/usr/bin/env python3
"""What does the agent cost a small device? Resident memory and cold start, against a bare script.

Two programs run MobileNet v2 (quant, XNNPACK through LiteRT, one thread) on the same 640x480 clip,
looping, paced at 30 fps, each a fresh process, alternating over ``--reps`` repetitions:

    bare    the least a program can do: LiteRT's Interpreter and OpenCV's VideoCapture, resize, invoke
    agent   ``edgeinfer agent`` with one pipeline, the fleet's update key pinned, telemetry every second
            to a real Mosquitto this bench starts (Debian's ``mosquitto``)

Measured: the process's resident set (``VmRSS``) after ``--seconds`` of steady state, read from
/proc; and the cold start — seconds from the process's exec (the kernel's own start time) to its
first result (the agent reports it in its telemetry's ``footprint``, with the runtimes it loaded).
Clips: ``mp4`` (MPEG-4, read by OpenCV in both) and ``mjpeg`` (an MJPEG AVI: the agent reads it with
PyAV + libjpeg-turbo to decode at reduced scale, which costs its own FFmpeg). Goals (issue 18):
agent <= 100 MiB and <= 1.3x bare; cold start <= 1 s.

``--soak SECONDS`` instead runs one agent that long (an hour: not in CI) and reports its RSS growth
after a warm-up (the first tenth, at least 60 s): goal <= 1 %.

    python bench/footprint.py [--reps 3] [--seconds 20] [--clips mp4,mjpeg] [--json]
    python bench/footprint.py --soak 3600
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

MODEL = "mobilenet_v2_1.0_224_quant.tflite"
GOAL_MIB, GOAL_RATIO, GOAL_COLD_S, GOAL_GROWTH = 100.0, 1.3, 1.0, 0.01

BARE = r"""
import os, sys, time
t_exec = time.time()
def age():
    uptime = float(open("/proc/uptime").read().split()[0])
    stat = open("/proc/self/stat").read()
    return uptime - int(stat[stat.rindex(")") + 2:].split()[19]) / os.sysconf("SC_CLK_TCK")
import cv2
from ai_edge_litert.interpreter import Interpreter
model, clip, seconds = sys.argv[1], sys.argv[2], float(sys.argv[3])
interpreter = Interpreter(model, num_threads=1)
interpreter.allocate_tensors()
inp, out = interpreter.get_input_details()[0], interpreter.get_output_details()[0]
capture = cv2.VideoCapture(clip)
first, frames, start = None, 0, time.monotonic()
while time.monotonic() - start < seconds:
    ok, frame = capture.read()
    if not ok:
        capture.set(cv2.CAP_PROP_POS_FRAMES, 0)
        continue
    rgb = cv2.resize(cv2.cvtColor(frame, cv2.COLOR_BGR2RGB), (224, 224))
    interpreter.set_tensor(inp["index"], rgb[None])
    interpreter.invoke()
    interpreter.get_tensor(out["index"])
    if first is None:
        first = age()
    frames += 1
    time.sleep(max(0.0, start + frames / 30 - time.monotonic()))
rss = int(open("/proc/self/status").read().split("VmRSS:")[1].split()[0]) * 1024
print({"rss_bytes": rss, "first_result_s": first, "frames": frames})
"""


def assets_dir() -> Path:
    return Path(os.environ.get("EDGEINFER_ASSETS", REPO.parent / "shared" / "assets")).resolve()


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def make_clips(folder: Path) -> dict[str, Path]:
    import cv2

    from edgeinfer.capture import make_test_clip

    images = [assets_dir() / "images" / name for name in ("parrot.jpg", "cat.bmp", "grace_hopper.bmp")]
    mjpeg = make_test_clip(folder / "clip.avi", images, size=(640, 480), frames_per_image=60)
    mp4 = folder / "clip.mp4"
    writer = cv2.VideoWriter(str(mp4), cv2.VideoWriter_fourcc(*"mp4v"), 30, (640, 480))
    for image in images:
        frame = cv2.resize(cv2.imread(str(image)), (640, 480))
        for _ in range(60):
            writer.write(frame)
    writer.release()
    return {"mp4": mp4, "mjpeg": mjpeg}


class Broker:
    """Debian's mosquitto on a free port, anonymous, for the agent's telemetry."""

    def __init__(self, folder: Path) -> None:
        if shutil.which("mosquitto") is None and not Path("/usr/sbin/mosquitto").exists():
            raise SystemExit("mosquitto is not installed (apt-get install mosquitto)")
        self.port = free_port()
        conf = folder / "mosquitto.conf"
        conf.write_text(f"listener {self.port} 127.0.0.1\nallow_anonymous true\npersistence false\n")
        binary = shutil.which("mosquitto") or "/usr/sbin/mosquitto"
        self.process = subprocess.Popen([binary, "-c", str(conf)], stdout=subprocess.DEVNULL,
                                        stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            with socket.socket() as probe:
                if probe.connect_ex(("127.0.0.1", self.port)) == 0:
                    return
            time.sleep(0.05)
        raise SystemExit("mosquitto did not start")

    def close(self) -> None:
        self.process.terminate()
        self.process.wait(10)


class Telemetry:
    """The agent's newest telemetry message, from a paho subscriber."""

    def __init__(self, port: int) -> None:
        import paho.mqtt.client as paho
        from paho.mqtt.enums import CallbackAPIVersion

        self.latest: dict | None = None
        self.client = paho.Client(CallbackAPIVersion.VERSION2, client_id=f"footprint-{os.getpid()}")
        self.client.on_message = lambda _c, _u, message: setattr(self, "latest", json.loads(message.payload))
        self.client.connect("127.0.0.1", port)
        self.client.subscribe("edgeinfer/v1/+/+/telemetry", qos=0)
        self.client.loop_start()

    def close(self) -> None:
        self.client.loop_stop()
        self.client.disconnect()


def agent_config(folder: Path, port: int, clip: Path) -> Path:
    import yaml

    from edgeinfer.updates.signing import SigningKey

    key = SigningKey.generate().public_key_b64()
    config = folder / "agent.yaml"
    shutil.rmtree(folder / "data", ignore_errors=True)
    config.write_text(yaml.safe_dump({
        "device_id": "footprint", "fleet": "bench", "broker": f"mqtt://127.0.0.1:{port}", "profile": "none",
        "data_dir": str(folder / "data"), "telemetry_interval_s": 1.0, "update_public_key": key,
        "pipelines": [{"name": "main", "model": str(assets_dir() / "models" / MODEL), "source": str(clip),
                       "loop": True, "max_fps": 30, "threads": 1, "policy": "latest"}]}))
    return config


def vm_rss(pid: int) -> int:
    return int(Path(f"/proc/{pid}/status").read_text().split("VmRSS:")[1].split()[0]) * 1024


def run_agent(folder: Path, broker: Broker, clip: Path, seconds: float, *, samples: list | None = None) -> dict:
    config = agent_config(folder, broker.port, clip)
    telemetry = Telemetry(broker.port)
    process = subprocess.Popen([sys.executable, "-m", "edgeinfer", "agent", "--config", str(config)], cwd=REPO,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        start = time.monotonic()
        while time.monotonic() - start < seconds:
            time.sleep(min(10.0, seconds) if samples is not None else 0.5)
            if process.poll() is not None:
                raise SystemExit(f"the agent exited with {process.returncode}")
            if samples is not None:
                samples.append((time.monotonic() - start, vm_rss(process.pid)))
        rss = vm_rss(process.pid)
        latest = telemetry.latest or {}
    finally:
        process.terminate()
        process.wait(30)
        telemetry.close()
    footprint = latest.get("footprint") or {}
    frames = sum(p.get("frames", 0) for p in latest.get("pipelines", []))
    return {"rss_bytes": rss, "first_result_s": footprint.get("first_result_s"),
            "runtimes": footprint.get("runtimes"), "telemetry_rss_bytes": footprint.get("rss_bytes"),
            "frames_last_window": frames}


def run_bare(clip: Path, seconds: float) -> dict:
    done = subprocess.run([sys.executable, "-c", BARE, str(assets_dir() / "models" / MODEL), str(clip), str(seconds)],
                          capture_output=True, text=True, timeout=seconds + 120)
    if done.returncode != 0:
        raise SystemExit(f"the bare script failed: {done.stderr[-2000:]}")
    import ast

    return ast.literal_eval(done.stdout.strip().splitlines()[-1])


def mib(value: float) -> float:
    return round(value / 2**20, 1)


def compare(args: argparse.Namespace, folder: Path, broker: Broker, clips: dict[str, Path]) -> dict:
    report: dict[str, dict] = {}
    for name in args.clips.split(","):
        runs: dict[str, list[dict]] = {"bare": [], "agent": []}
        for rep in range(args.reps):
            order = ("bare", "agent") if rep % 2 == 0 else ("agent", "bare")
            for which in order:
                run = (run_bare(clips[name], args.seconds) if which == "bare"
                       else run_agent(folder, broker, clips[name], args.seconds))
                runs[which].append(run)
                print(f"  {name} {which:5} rep {rep + 1}: {mib(run['rss_bytes'])} MiB, first result "
                      f"{run['first_result_s']:.2f} s", file=sys.stderr)
        bare_rss = statistics.median(r["rss_bytes"] for r in runs["bare"])
        agent_rss = statistics.median(r["rss_bytes"] for r in runs["agent"])
        bare_cold = statistics.median(r["first_result_s"] for r in runs["bare"])
        agent_cold = statistics.median(r["first_result_s"] for r in runs["agent"])
        report[name] = {"bare_mib": mib(bare_rss), "agent_mib": mib(agent_rss),
                        "rss_ratio": round(agent_rss / bare_rss, 3),
                        "bare_cold_start_s": round(bare_cold, 3), "agent_cold_start_s": round(agent_cold, 3),
                        "cold_start_ratio": round(agent_cold / bare_cold, 3),
                        "agent_runtimes": runs["agent"][-1]["runtimes"],
                        "goals": {"rss_le_100_mib": mib(agent_rss) <= GOAL_MIB,
                                  "ratio_le_1_3": agent_rss / bare_rss <= GOAL_RATIO,
                                  "cold_start_le_1_s": agent_cold <= GOAL_COLD_S}}
    return report


def soak(args: argparse.Namespace, folder: Path, broker: Broker, clips: dict[str, Path]) -> dict:
    samples: list[tuple[float, int]] = []
    clip = clips[args.clips.split(",")[0]]
    stop = threading.Event()
    result = run_agent(folder, broker, clip, args.soak, samples=samples)
    stop.set()
    warm = max(60.0, args.soak / 10)
    after = [rss for t, rss in samples if t >= warm]
    if len(after) < 2:
        raise SystemExit("the soak was too short to have a warm-up and an end")
    growth = (after[-1] - after[0]) / after[0]
    return {"seconds": args.soak, "warm_up_s": warm, "rss_after_warm_up_mib": mib(after[0]),
            "rss_end_mib": mib(after[-1]), "rss_max_mib": mib(max(after)), "growth": round(growth, 4),
            "goal_growth_le_1pct": growth <= GOAL_GROWTH, "samples": len(samples), "runtimes": result["runtimes"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=20.0, help="steady state before RSS is read")
    parser.add_argument("--clips", default="mp4,mjpeg")
    parser.add_argument("--soak", type=float, default=0.0, help="run one agent this long instead")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="edgeinfer-footprint-") as tmp:
        folder = Path(tmp)
        clips = make_clips(folder)
        broker = Broker(folder)
        try:
            summary = ({"soak": soak(args, folder, broker, clips)} if args.soak
                       else {"reps": args.reps, "seconds": args.seconds, "clips": compare(args, folder, broker, clips)})
        finally:
            broker.close()
    if args.json:
        print(json.dumps(summary, indent=1))
        return
    if args.soak:
        s = summary["soak"]
        print(f"soak {s['seconds']:.0f} s: RSS {s['rss_after_warm_up_mib']} MiB after {s['warm_up_s']:.0f} s, "
              f"{s['rss_end_mib']} MiB at the end (max {s['rss_max_mib']}): growth {s['growth'] * 100:+.2f} % "
              f"({'ok' if s['goal_growth_le_1pct'] else 'OVER'} the 1 % goal)")
        return
    print(f"MobileNet v2 quant on XNNPACK, 640x480 at 30 fps, {args.reps} reps, RSS after {args.seconds:g} s, medians")
    print(f"{'clip':6} {'bare MiB':>9} {'agent MiB':>10} {'ratio':>6} {'bare cold s':>12} {'agent cold s':>13} "
          f"{'ratio':>6}  agent runtimes")
    for name, row in summary["clips"].items():
        print(f"{name:6} {row['bare_mib']:9.1f} {row['agent_mib']:10.1f} {row['rss_ratio']:6.2f} "
              f"{row['bare_cold_start_s']:12.2f} {row['agent_cold_start_s']:13.2f} {row['cold_start_ratio']:6.2f}  "
              f"{','.join(row['agent_runtimes'] or [])}")


if __name__ == "__main__":
    main()

"""The demo's agent step: ``edgeinfer agent`` runs the sample clip and its telemetry arrives over MQTT.

A local Mosquitto is started on a free port, a subscriber plays the fleet manager, and the agent
runs as the user would run it (``edgeinfer agent --config agent.yaml``, a subprocess). Skipped, with
the reason, when Mosquitto, paho-mqtt or the pipeline is missing.
"""

from __future__ import annotations

import getpass
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

DEMO_SECONDS = 4.0


def _mosquitto() -> str | None:
    found = shutil.which("mosquitto")
    return found or ("/usr/sbin/mosquitto" if Path("/usr/sbin/mosquitto").exists() else None)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _wait_port(port: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                return True
        time.sleep(0.05)
    return False


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
    parts.append(f"rss {system['rss_bytes'] / 2**20:.0f} MiB" if system.get("rss_bytes") else "")
    parts.append(f"spool {message['spool']['pending']} pending")
    return "  ".join(p for p in parts if p)


def run_agent_demo(clip: Path, model: Path, labels: Path, workdir: Path,
                   echo: Callable[[str], None] = print) -> dict[str, Any]:
    """Run the agent on ``clip`` for a few seconds against a local broker; print the telemetry it sends."""
    echo("== 3. the device agent on the clip, reporting over MQTT")
    broker = _mosquitto()
    reason = None
    if broker is None:
        reason = "mosquitto is not installed (make system-deps installs it)"
    else:
        try:
            import paho.mqtt.client
        except ImportError:
            reason = "paho-mqtt is not installed (pip install 'edgeinfer[fleet]')"
    if reason is None:
        try:
            import edgeinfer.pipeline  # noqa: F401
        except ImportError:
            reason = "this build has no pipeline module"
    if reason:
        echo(f"   skipped: {reason}")
        return {"skipped": reason}

    import paho.mqtt.client as paho
    from paho.mqtt.enums import CallbackAPIVersion

    workdir = workdir.resolve()
    port = _free_port()
    conf = workdir / "mosquitto.conf"
    conf.write_text(f"user {getpass.getuser()}\nlistener {port} 127.0.0.1\nallow_anonymous true\n"
                    "persistence false\n")
    data_dir = workdir / "agent-data"
    shutil.rmtree(data_dir, ignore_errors=True)
    config = workdir / "agent.yaml"
    config.write_text(yaml.safe_dump({
        "device_id": "demo-cam", "fleet": "demo", "broker": f"mqtt://127.0.0.1:{port}",
        "data_dir": str(data_dir), "telemetry_interval_s": 1.0,
        "pipelines": [{"name": "main", "model": str(model), "source": str(clip), "labels": str(labels),
                       "loop": True, "max_fps": 25}],
    }, sort_keys=False))

    received: list[tuple[str, dict]] = []
    lock = threading.Lock()

    def on_message(client: Any, userdata: Any, message: Any) -> None:
        with lock:
            received.append((message.topic.rsplit("/", 1)[1], json.loads(message.payload)))

    subscribed = threading.Event()
    fleet = paho.Client(CallbackAPIVersion.VERSION2, client_id=f"edgeinfer-demo-fleet-{os.getpid()}")
    fleet.on_message = on_message
    fleet.on_connect = lambda c, *a: c.subscribe("edgeinfer/v1/demo/+/#", qos=1)
    fleet.on_subscribe = lambda *a: subscribed.set()
    mosquitto = subprocess.Popen([broker, "-c", str(conf)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    agent = None
    try:
        if not _wait_port(port, 10):
            echo("   skipped: mosquitto did not start")
            return {"skipped": "mosquitto did not start"}
        fleet.connect("127.0.0.1", port)
        fleet.loop_start()
        subscribed.wait(10)
        echo(f"   broker: mosquitto on 127.0.0.1:{port}; the fleet side subscribes to edgeinfer/v1/demo/+/#")
        echo(f"   $ edgeinfer agent --config {config}")
        log = open(workdir / "agent.log", "wb")  # noqa: SIM115 - closed below
        agent = subprocess.Popen([sys.executable, "-m", "edgeinfer", "agent", "--config", str(config)],
                                 stdout=log, stderr=subprocess.STDOUT)
        shown = 0
        deadline = time.monotonic() + 30
        first_running = None
        while time.monotonic() < deadline:
            with lock:
                batch = received[shown:]
                shown = len(received)
            for kind, body in batch:
                if kind == "state":
                    echo(f"   state      online={body['online']} profile={body.get('profile')} "
                         f"boot {body['boot_id'][:8]}")
                elif kind == "events":
                    echo(f"   event      {body['event']}: {body['message']}")
                elif kind == "telemetry":
                    echo(f"   telemetry  {_describe(body)}")
                    if first_running is None and any(p["status"] == "running" and p["frames"]
                                                     for p in body["pipelines"]):
                        first_running = time.monotonic()
            if first_running is not None and time.monotonic() - first_running > DEMO_SECONDS:
                break
            if agent.poll() is not None:
                break
            time.sleep(0.1)
        agent.send_signal(signal.SIGTERM)
        code = agent.wait(30)
        log.close()
        time.sleep(0.3)
        with lock:
            for kind, body in received[shown:]:
                if kind == "state":
                    echo(f"   state      online={body['online']} ({body.get('reason')})")
            telemetry = [b for k, b in received if k == "telemetry"]
        fps = [p["fps"] for m in telemetry for p in m["pipelines"] if p["status"] == "running" and p["frames"]]
        echo(f"   agent exited with {code}; {len(telemetry)} telemetry messages, seq "
             f"{telemetry[0]['seq'] if telemetry else '-'}..{telemetry[-1]['seq'] if telemetry else '-'}")
        return {"exit_code": code, "telemetry": len(telemetry), "seqs": [m["seq"] for m in telemetry],
                "fps": fps[-1] if fps else 0.0, "delegate": next(
                    (p["delegate"] for m in telemetry for p in m["pipelines"] if p.get("delegate")), None)}
    finally:
        if agent is not None and agent.poll() is None:
            agent.kill()
        fleet.loop_stop()
        mosquitto.terminate()
        mosquitto.wait(10)

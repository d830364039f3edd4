"""What the agent's telemetry costs the pipeline: throughput with and without it, in one run.

Each repetition runs the same pipeline (same model, same clip, same frame count, ``policy="every"``)
twice, in alternating order:

- **bare**: ``Pipeline.start()`` / ``wait()`` with nothing else running;
- **agent**: the same pipeline run *by the real agent* (``edgeinfer.agent.Agent`` with its
  telemetry tick, system probes, SQLite spool and MQTT link publishing to a real Mosquitto that
  this script starts on a free port; without Mosquitto, the link retries in the background and the
  spool still takes every window).

The pipeline's own ``stats.fps`` is compared; medians over the repetitions; the cost is
``1 - median(agent) / median(bare)``. Goal: < 2 % at the default 1 s interval. ``--interval 0.1``
shows the headroom at ten times the default rate.

    python bench/telemetry_overhead.py [--model M] [--frames N] [--reps R] [--interval S]

Take final figures on a quiet machine: other processes on the cores move both columns.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
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
ASSETS = Path(os.environ.get("EDGEINFER_ASSETS", REPO.parent / "shared" / "assets")).resolve()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_mosquitto(workdir: Path) -> tuple[subprocess.Popen | None, str]:
    """A throwaway broker on a free port; (None, url of nothing) when mosquitto is not installed."""
    binary = shutil.which("mosquitto") or ("/usr/sbin/mosquitto" if Path("/usr/sbin/mosquitto").exists() else None)
    port = free_port()
    if binary is None:
        return None, f"mqtt://127.0.0.1:{port}"
    import getpass

    conf = workdir / "mosquitto.conf"
    conf.write_text(f"user {getpass.getuser()}\nlistener {port} 127.0.0.1\nallow_anonymous true\npersistence false\n")
    proc = subprocess.Popen([binary, "-c", str(conf)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                break
        time.sleep(0.05)
    return proc, f"mqtt://127.0.0.1:{port}"


def make_clip(workdir: Path) -> Path:
    from edgeinfer.demo import write_demo_clip

    clip = workdir / "clip.avi"
    images = [ASSETS / "images" / name for name in ("parrot.jpg", "cat.bmp", "grace_hopper.bmp", "squat.bmp")]
    write_demo_clip(clip, images, seconds_each=2.0, fps=25, size=(640, 480))
    return clip


def run_bare(model: Path, clip: Path, frames: int, threads: int | None) -> float:
    from edgeinfer.pipeline import Pipeline

    with Pipeline(model, str(clip), policy="every", max_frames=frames, loop=True, threads=threads) as pipeline:
        pipeline.start()
        pipeline.wait()
        if pipeline.error is not None:
            raise RuntimeError(f"pipeline failed: {pipeline.error}")
        stats = pipeline.stats
    assert stats.frames == frames, f"ran {stats.frames} frames, expected {frames}"
    return stats.fps


def run_with_agent(model: Path, clip: Path, frames: int, threads: int | None, broker: str, interval: float,
                   workdir: Path) -> tuple[float, int]:
    """(pipeline fps, telemetry messages acknowledged by the broker) with the real agent running it."""
    from edgeinfer.pipeline import Pipeline

    from edgeinfer.agent import Agent
    from edgeinfer.agent_config import parse_config

    finished: dict[str, object] = {}

    class MeasuredPipeline(Pipeline):  # keeps the final stats: the agent closes the pipeline when it ends
        def close(self) -> None:
            if "stats" not in finished and self.error is None:
                finished["stats"] = self.stats
            super().close()

    def factory(config):
        return MeasuredPipeline(config.model, config.source, **config.pipeline_kwargs())

    data_dir = Path(tempfile.mkdtemp(dir=workdir))
    config = parse_config({
        "device_id": "bench", "broker": broker, "data_dir": str(data_dir), "telemetry_interval_s": interval,
        "pipelines": [{"name": "main", "model": str(model), "source": str(clip), "policy": "every",
                       "max_frames": frames, "loop": True, "threads": threads, "restart": "never"}],
    }, file="bench", base=workdir)
    agent = Agent(config, pipeline_factory=factory)
    thread = threading.Thread(target=agent.run, name="bench-agent", daemon=True)
    thread.start()
    deadline = time.monotonic() + 600
    while "stats" not in finished and time.monotonic() < deadline:
        runner = agent._runners[0] if agent._runners else None
        if runner is not None and runner.status == "failed":
            raise RuntimeError(f"pipeline failed under the agent: {runner.last_error}")
        time.sleep(0.05)
    acked = agent.link.status.acked if agent.link else 0
    agent.stop()
    thread.join(30)
    stats = finished["stats"]
    assert stats.frames == frames, f"ran {stats.frames} frames, expected {frames}"
    return stats.fps, acked


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=str(ASSETS / "models" / "mobilenet_v1_0.25_128_quant.tflite"),
                        help="default: the fastest shared model, the worst case for a fixed per-window cost")
    parser.add_argument("--frames", type=int, default=600, help="frames per run")
    parser.add_argument("--reps", type=int, default=5, help="repetitions (each runs both cases)")
    parser.add_argument("--interval", type=float, default=1.0, help="telemetry interval, s")
    parser.add_argument("--threads", type=int, default=None, help="delegate threads")
    args = parser.parse_args()

    import logging

    logging.basicConfig(level=logging.ERROR)
    workdir = Path(tempfile.mkdtemp(prefix="edgeinfer-bench-"))
    broker, url = start_mosquitto(workdir)
    try:
        clip = make_clip(workdir)
        model = Path(args.model)
        print(f"model {model.name}, {args.frames} frames per run, {args.reps} reps, telemetry every "
              f"{args.interval:g} s, broker {'mosquitto ' + url if broker else 'none (spool only)'}")
        run_bare(model, clip, min(50, args.frames), args.threads)  # warm caches and the runtime
        bare: list[float] = []
        agent: list[float] = []
        for rep in range(args.reps):
            order = ("bare", "agent") if rep % 2 == 0 else ("agent", "bare")
            for case in order:
                if case == "bare":
                    bare.append(run_bare(model, clip, args.frames, args.threads))
                else:
                    fps, acked = run_with_agent(model, clip, args.frames, args.threads, url, args.interval, workdir)
                    agent.append(fps)
            print(f"  rep {rep + 1}: bare {bare[-1]:8.1f} fps   agent {agent[-1]:8.1f} fps   "
                  f"(broker acknowledged {acked} messages)")
        mb, ma = statistics.median(bare), statistics.median(agent)
        cost = 1 - ma / mb
        print(f"median: bare {mb:.1f} fps, with agent telemetry {ma:.1f} fps; ratio {ma / mb:.4f}; "
              f"cost {cost * 100:+.2f} % (goal < 2 %) -> {'OK' if cost < 0.02 else 'OVER GOAL'}")
        return 0
    finally:
        if broker is not None:
            broker.send_signal(signal.SIGTERM)
            broker.wait(10)
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())

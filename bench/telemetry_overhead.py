"""What the agent's telemetry costs the pipeline: throughput with and without it, in one run.

Each repetition runs the same pipeline (same model, same clip, same frame count, ``policy="every"``)
twice, in alternating order:

- **bare**: the pipeline hosted exactly as the agent hosts it (a ``PipelineRunner`` thread, the main
  thread polling), with no telemetry, spool, MQTT or command thread;
- **agent**: the same pipeline run *by the real agent* (``edgeinfer.agent.Agent`` with its
  telemetry tick, system probes, SQLite spool and MQTT link publishing to a real Mosquitto that
  this script starts on a free port; without Mosquitto, the link retries in the background and the
  spool still takes every window).

The pipeline's own ``stats.fps`` is compared; the cost is ``1 - median(agent_i / bare_i)`` over the
repetitions (the two runs of a repetition are neighbours in time, so their ratio cancels slow drifts
in the machine's load); medians of each column are printed too. Goal: < 2 % at the default 1 s
interval. The CPU time of the agent's own threads (from /proc) is printed as well: it does not
depend on what else runs on the machine. ``--interval 0.1``
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
#: the agent's own threads besides its main loop: the MQTT link and the command router
AGENT_THREADS = ("edgeinfer-mqtt", "edgeinfer-commands")


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
    """A 640x480 MJPEG clip of four shared photos, two seconds each at 25 fps."""
    from edgeinfer.capture import make_test_clip

    images = [ASSETS / "images" / name for name in ("parrot.jpg", "cat.bmp", "grace_hopper.bmp", "squat.bmp")]
    return make_test_clip(workdir / "clip.avi", images, size=(640, 480), fps=25, frames_per_image=50)


def _measured_factory(finished: dict):
    """A pipeline factory whose pipelines keep their final stats (the runner closes them when they end)."""
    from edgeinfer.pipeline.core import Pipeline

    class MeasuredPipeline(Pipeline):
        def close(self) -> None:
            if "stats" not in finished and self.error is None:
                finished["stats"] = self.stats
            super().close()

    def factory(config):
        return MeasuredPipeline(config.model, config.source, config.options)

    return factory


def _config(model: Path, clip: Path, frames: int, threads: int | None, broker: str, interval: float,
            workdir: Path):
    from edgeinfer.agent.config import parse_config

    return parse_config({
        "device_id": "bench", "broker": broker, "data_dir": str(Path(tempfile.mkdtemp(dir=workdir))),
        "telemetry_interval_s": interval,
        "pipelines": [{"name": "main", "model": str(model), "source": str(clip), "policy": "every",
                       "max_frames": frames, "loop": True, "threads": threads, "restart": "never"}],
    }, file="bench", base=workdir)


def _wait_for(finished: dict, runner_of) -> None:
    deadline = time.monotonic() + 600
    while "stats" not in finished and time.monotonic() < deadline:
        runner = runner_of()
        if runner is not None and runner.status == "failed":
            raise RuntimeError(f"pipeline failed: {runner.last_error}")
        time.sleep(0.05)


def run_bare(config) -> float:
    """The pipeline hosted exactly as the agent hosts it (a PipelineRunner thread), with no telemetry."""
    from edgeinfer.agent.runner import PipelineRunner

    finished: dict = {}
    runner = PipelineRunner(config.pipelines[0], emit=lambda *a, **k: None, on_change=lambda: None,
                            factory=_measured_factory(finished))
    runner.start()
    try:
        _wait_for(finished, lambda: runner)
    finally:
        runner.stop()
    return _fps(finished, config)


def _thread_cpu_s(native_ids: list[int]) -> float:
    """CPU seconds (user + system) the given OS threads of this process have used (Linux /proc)."""
    ticks = os.sysconf("SC_CLK_TCK")
    total = 0
    for tid in native_ids:
        try:
            fields = Path(f"/proc/self/task/{tid}/stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        total += int(fields[11]) + int(fields[12])  # utime, stime
    return total / ticks


def run_with_agent(config) -> tuple[float, int, float, float]:
    """(pipeline fps, messages acknowledged, CPU s of the agent's own threads, run wall s) under the real agent."""
    from edgeinfer.agent.daemon import Agent

    finished: dict = {}
    agent = Agent(config, pipeline_factory=_measured_factory(finished))
    thread = threading.Thread(target=agent.run, name="bench-agent", daemon=True)
    thread.start()
    try:
        while not agent.runners or agent.runners[0].status != "running":  # agent fully up
            time.sleep(0.01)
        own = [thread.native_id, *(t.native_id for t in threading.enumerate() if t.name in AGENT_THREADS)]
        cpu0, wall0 = _thread_cpu_s(own), time.perf_counter()
        _wait_for(finished, lambda: agent.runners[0] if agent.runners else None)
        cpu, wall = _thread_cpu_s(own) - cpu0, time.perf_counter() - wall0
        acked = agent.link.status.acked if agent.link else 0
    finally:
        agent.stop()
        thread.join(30)
    return _fps(finished, config), acked, cpu, wall


def _fps(finished: dict, config) -> float:
    stats = finished["stats"]
    expected = config.pipelines[0].max_frames
    assert stats.frames == expected, f"ran {stats.frames} frames, expected {expected}"
    return stats.fps


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=str(ASSETS / "models" / "mobilenet_v1_0.25_128_quant.tflite"),
                        help="default: the fastest shared model, the worst case for a fixed per-window cost")
    parser.add_argument("--frames", type=int, default=3000, help="frames per run")
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
        def config(frames: int):
            return _config(model, clip, frames, args.threads, url, args.interval, workdir)

        run_bare(config(min(50, args.frames)))  # warm caches and the runtime
        bare: list[float] = []
        agent: list[float] = []
        acked = 0
        agent_cpu = agent_wall = 0.0
        for rep in range(args.reps):
            order = ("bare", "agent") if rep % 2 == 0 else ("agent", "bare")
            for case in order:
                if case == "bare":
                    bare.append(run_bare(config(args.frames)))
                else:
                    fps, acked, cpu, wall = run_with_agent(config(args.frames))
                    agent.append(fps)
                    agent_cpu += cpu
                    agent_wall += wall
            print(f"  rep {rep + 1}: bare {bare[-1]:8.1f} fps   agent {agent[-1]:8.1f} fps   "
                  f"(broker acknowledged {acked} messages)")
        mb, ma = statistics.median(bare), statistics.median(agent)
        # each repetition's two runs are neighbours in time: their ratio cancels slow drifts of the
        # machine's load, so the median of those ratios is the figure the goal is judged on
        paired = statistics.median(a / b for a, b in zip(agent, bare))
        cost = 1 - paired
        print(f"median: bare {mb:.1f} fps, with agent telemetry {ma:.1f} fps (ratio of medians {ma / mb:.4f})")
        print(f"median of per-repetition ratios {paired:.4f}: telemetry costs {cost * 100:+.2f} % "
              f"(goal < 2 %) -> {'OK' if cost < 0.02 else 'OVER GOAL'}")
        print(f"the agent's own threads (telemetry tick, spool, MQTT, commands) used {agent_cpu * 1000:.0f} ms of "
              f"CPU in {agent_wall:.1f} s of pipeline runs: {agent_cpu / agent_wall * 100:.2f} % of one core "
              f"(/proc clock ticks; the fps ratio is the goal figure, this one is immune to other load)")
        return 0
    finally:
        if broker is not None:
            broker.send_signal(signal.SIGTERM)
            broker.wait(10)
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())

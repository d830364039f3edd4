#!/usr/bin/env python3
"""What does delegate failover cost a healthy pipeline?

The invoke watchdog and failover add, per frame, one timestamp store and one uncontended lock
around each invoke, the output summary (a few dictionary updates), and a thread that wakes every
0.1 s. This bench measures that against **the pipeline without any of it**: the tree at
``--baseline`` (default: the commit before failover landed), unpacked with ``git archive`` into a
temporary folder and imported from there. Three variants, each a fresh process, in the same run:

    baseline     the pipeline before failover (git archive of --baseline)
    watchdog     this tree, defaults (watchdog and failover on)
    hooks-only   this tree, watchdog=False, failover=False (the per-frame hooks, no watchdog thread)

and, in one process each, the watchdog on and off over the same engine: for a Pipeline, and for a
MultiPipeline of two unpaced streams (its engine worker's watchdog: a timestamp and a lock per batch).

Each process runs the model on generated frames as fast as it can (``policy=every``, unpaced
synthetic source, a real photo) and reports frames per second after a warm-up, and the process's
CPU time per frame. Variants run in rotating order over ``--reps`` repetitions so that noise from
elsewhere hits them alike; reported: medians, and the ratio of each to the baseline (goal: the
watchdog costs <= 2 % of fps).

    python bench/watchdog.py [--reps 7] [--frames 600] [--models tiny,v2] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
#: the last commit before delegate failover (the pipeline without watchdog, failover or output summary)
BASELINE_REV = "bc1cedb"
GOAL = 0.02
MODELS = {"tiny": "mobilenet_v1_0.25_128_quant.tflite", "v2": "mobilenet_v2_1.0_224_quant.tflite"}
VARIANTS = ("baseline", "hooks-only")

#: one process, the current tree: the same engine under pipelines with and without the watchdog, in
#: alternating blocks (same process, same cores: the least noisy comparison there is)
PAIR_WORKER = r"""
import json, statistics, sys, time
import edgeinfer
from edgeinfer import Pipeline
from edgeinfer.capture import SyntheticSource
model, image, frames, warmup = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
blocks = int(sys.argv[5])
engine = edgeinfer.load(model, "xnnpack", threads=1)
configs = {"watchdog": {}, "off": {"watchdog": False, "failover": False}}
fps = {name: [] for name in configs}
for block in range(blocks):
    for name in (list(configs) if block % 2 == 0 else list(configs)[::-1]):
        source = SyntheticSource((640, 480), fps=None, image=image)
        with Pipeline(engine, source, max_frames=frames, **configs[name]) as pipeline:
            for index, _ in enumerate(pipeline):
                if index == warmup:
                    t0 = time.perf_counter()
            fps[name].append((frames - warmup - 1) / (time.perf_counter() - t0))
print(json.dumps({name: statistics.median(values) for name, values in fps.items()}))
"""
#: the same for a MultiPipeline (two unpaced streams on one engine): its engine worker's watchdog on and off
MULTI_PAIR_WORKER = r"""
import json, statistics, sys, threading, time
import edgeinfer
from edgeinfer import MultiPipeline
from edgeinfer.capture import SyntheticSource
model, image, frames, warmup = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
blocks = int(sys.argv[5])
engine = edgeinfer.load(model, "xnnpack", threads=1)
configs = {"watchdog": {}, "off": {"watchdog": False}}
fps = {name: [] for name in configs}
for block in range(blocks):
    for name in (list(configs) if block % 2 == 0 else list(configs)[::-1]):
        sources = {s: SyntheticSource((640, 480), fps=None, image=image) for s in ("a", "b")}
        count, marks, done = [0], {}, threading.Event()
        def on_result(_result):
            count[0] += 1
            if count[0] == warmup:
                marks["t0"] = time.perf_counter()
            elif count[0] == frames:
                marks["t1"] = time.perf_counter()
                done.set()
        with MultiPipeline(engine, sources, policy="every", **configs[name]) as multi:
            multi.start(on_result)
            done.wait(600)
            multi.stop()
        fps[name].append((frames - warmup) / (marks["t1"] - marks["t0"]))
print(json.dumps({name: statistics.median(values) for name, values in fps.items()}))
"""
#: one process per variant: the pipeline before failover (imported from the unpacked baseline) or this tree
SINGLE_WORKER = r"""
import json, sys, time
from edgeinfer import Pipeline
from edgeinfer.capture import SyntheticSource
model, image, frames, warmup = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
options = json.loads(sys.argv[5])
source = SyntheticSource((640, 480), fps=None, image=image)
with Pipeline(model, source, max_frames=frames, threads=1, **options) as pipeline:
    for index, _ in enumerate(pipeline):
        if index == warmup:
            t0, c0 = time.perf_counter(), time.process_time()
    t1, c1 = time.perf_counter(), time.process_time()
n = frames - warmup - 1
print(json.dumps({"fps": n / (t1 - t0), "cpu_ms_per_frame": (c1 - c0) * 1e3 / n}))
"""


def assets_dir() -> Path:
    return Path(os.environ.get("EDGEINFER_ASSETS", REPO.parent / "shared" / "assets")).resolve()


def unpack_baseline(rev: str, into: Path) -> Path:
    """The package as it was at ``rev``, in ``into``."""
    archive = subprocess.run(["git", "-C", str(REPO), "archive", rev, "edgeinfer", "device_profiles"], check=True,
                             capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return into


def _worker(code: str, root: Path, *args: str) -> dict:
    env = dict(os.environ, PYTHONPATH=str(root), OMP_NUM_THREADS="1")
    result = subprocess.run([sys.executable, "-c", code, *args], cwd=root, env=env, capture_output=True, text=True,
                            timeout=900)
    if result.returncode != 0:
        raise SystemExit(f"worker failed:\n{result.stderr}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def spread(values: list[float]) -> dict:
    return {"median": round(statistics.median(values), 4), "min": round(min(values), 4), "max": round(max(values), 4)}


def bench_model(name: str, baseline_root: Path, reps: int, frames: int, warmup: int) -> dict:
    model = assets_dir() / "models" / MODELS[name]
    image = str(assets_dir() / "images" / "parrot.jpg")
    # 1. the watchdog thread and failover, same engine, same process
    pairs = [_worker(PAIR_WORKER, REPO, str(model), image, str(frames), str(warmup), "6") for _ in range(reps)]
    watchdog_ratio = [p["watchdog"] / p["off"] for p in pairs]
    # 2. the per-frame hooks against the pipeline before failover, one process per run, rotating order
    samples: dict[str, list[dict]] = {v: [] for v in VARIANTS}
    for rep in range(reps):
        for variant in VARIANTS[rep % 2:] + VARIANTS[:rep % 2]:
            root = baseline_root if variant == "baseline" else REPO
            options = json.dumps({"watchdog": False, "failover": False} if variant == "hooks-only" else {})
            samples[variant].append(_worker(SINGLE_WORKER, root, str(model), image, str(frames), str(warmup), options))
    fps = {v: [s["fps"] for s in runs] for v, runs in samples.items()}
    base = statistics.median(fps["baseline"])
    # 3. a MultiPipeline's engine worker watchdog, same engine, same process
    multi = [_worker(MULTI_PAIR_WORKER, REPO, str(model), image, str(frames), str(warmup), "6") for _ in range(reps)]
    multi_ratio = [p["watchdog"] / p["off"] for p in multi]
    return {
        "model": MODELS[name], "reps": reps, "frames": frames,
        "same_process": {"watchdog_fps_over_off": spread(watchdog_ratio),
                         "fps_watchdog": round(statistics.median(p["watchdog"] for p in pairs), 1),
                         "fps_off": round(statistics.median(p["off"] for p in pairs), 1)},
        "vs_baseline": {v: {"fps": spread(values), "ratio": round(statistics.median(values) / base, 4)}
                        for v, values in fps.items()},
        "watchdog_cost_pct": round((1 - statistics.median(watchdog_ratio)) * 100, 2),
        "multi_same_process": {"watchdog_fps_over_off": spread(multi_ratio),
                               "fps_watchdog": round(statistics.median(p["watchdog"] for p in multi), 1),
                               "fps_off": round(statistics.median(p["off"] for p in multi), 1)},
        "multi_watchdog_cost_pct": round((1 - statistics.median(multi_ratio)) * 100, 2),
        "hooks_cost_pct": round((1 - statistics.median(fps["hooks-only"]) / base) * 100, 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--reps", type=int, default=7)
    parser.add_argument("--frames", type=int, default=600)
    parser.add_argument("--warmup", type=int, default=50)
    parser.add_argument("--models", default="tiny,v2")
    parser.add_argument("--baseline", default=BASELINE_REV, help="the git revision without failover")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="edgeinfer-baseline-") as folder:
        baseline_root = unpack_baseline(args.baseline, Path(folder))
        report = {"baseline": args.baseline, "goal_pct": GOAL * 100,
                  "models": [bench_model(m, baseline_root, args.reps, args.frames, args.warmup)
                             for m in args.models.split(",")]}
    if args.json:
        print(json.dumps(report, indent=2))
        return
    print(f"baseline: {args.baseline} (before failover); {args.reps} reps, medians (min-max); goal: <= 2 % fps")
    for entry in report["models"]:
        same = entry["same_process"]
        ratio = same["watchdog_fps_over_off"]
        print(f"\n{entry['model']} ({entry['frames']} frames per run)")
        print(f"  watchdog on / off, same engine and process: {same['fps_watchdog']:.1f} / {same['fps_off']:.1f} fps"
              f"  x{ratio['median']:.3f} ({ratio['min']:.3f}-{ratio['max']:.3f})")
        for variant, m in entry["vs_baseline"].items():
            f = m["fps"]
            print(f"  {variant:<11} {f['median']:8.1f} fps ({f['min']:.1f}-{f['max']:.1f})  x{m['ratio']:.3f}")
        multi = entry["multi_same_process"]
        mratio = multi["watchdog_fps_over_off"]
        print(f"  MultiPipeline (2 streams) watchdog on / off: {multi['fps_watchdog']:.1f} / {multi['fps_off']:.1f} "
              f"fps  x{mratio['median']:.3f} ({mratio['min']:.3f}-{mratio['max']:.3f})")
        print(f"  cost: watchdog {entry['watchdog_cost_pct']:+.2f} % fps, per-frame hooks "
              f"{entry['hooks_cost_pct']:+.2f} % vs the pipeline before failover, MultiPipeline watchdog "
              f"{entry['multi_watchdog_cost_pct']:+.2f} %")


if __name__ == "__main__":
    main()

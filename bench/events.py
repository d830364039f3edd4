#!/usr/bin/env python3
"""What do event rules with evidence cost a pipeline, and what does an event cost?

The evidence keeps a pre-roll all the time: every frame costs the inference thread one comparison on
the ``evidence_fps`` grid, and ``evidence_fps`` frames a second a downscaled copy; the evidence thread
JPEG-encodes those. This bench runs the face detector (Ultraface, ONNX Runtime) over a generated
1280x720 clip (``cat_720p.jpg`` with a face from ``grace_hopper.bmp`` walking across it), read as fast
as the pipeline goes (``policy=every``), in three variants, each a fresh process, in rotating order
over ``--reps`` repetitions:

    off        no rules
    idle       a rule that never fires (``detection:1.0/nobody``): the pre-roll alone
    firing     ``detection:0.5`` with a 1 s cooldown: an event (snapshot + 2 s + 3 s clip written)
               about every second of the run

Reported, medians: frames per second, the process's CPU time per frame (every thread: encoding
included), and their ratios to ``off``; for ``firing``, the events written.

    python bench/events.py [--reps 5] [--frames 600] [--evidence-fps 5] [--json]
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
VARIANTS = {"off": [], "idle": ["detection:1.0/nobody"], "firing": ["detection:0.5"]}

WORKER = r"""
import json, sys, time
from pathlib import Path
import cv2, numpy as np
sys.path.insert(0, sys.argv[1])
from edgeinfer import Pipeline
assets, frames, rules = Path(sys.argv[2]), int(sys.argv[3]), json.loads(sys.argv[4])
evidence, fps = sys.argv[5], float(sys.argv[6])
clip = Path(evidence).parent / "clip.avi"
if not clip.exists():
    background = cv2.imread(str(assets / "images" / "cat_720p.jpg"))
    face = cv2.resize(cv2.imread(str(assets / "images" / "grace_hopper.bmp")), (240, 300))
    out = cv2.VideoWriter(str(clip), cv2.VideoWriter_fourcc(*"MJPG"), 30, (1280, 720))
    for i in range(frames):
        frame = background.copy()
        x = (i * 7) % (1280 - 240)
        frame[200:500, x:x + 240] = face
        out.write(frame)
    out.release()
options = {"events": rules, "evidence_dir": evidence, "event_cooldown_s": 1.0, "evidence_fps": fps} if rules else {}
got = []
with Pipeline(assets / "models" / "ultraface_rfb_320.onnx", clip, task="detect", policy="every", threads=1,
              reduced_decode=False, **options) as pipeline:
    if rules:
        pipeline.add_event_listener(got.append)
    t0, c0, n = time.perf_counter(), time.process_time(), 0
    for result in pipeline:
        n += 1
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    counts = pipeline.events.counts() if rules else {}
print(json.dumps({"fps": n / wall, "cpu_ms_per_frame": cpu / n * 1e3, "frames": n, "events": len(got),
                  "frames_dropped": counts.get("frames_dropped", 0)}))
"""


def assets_dir() -> Path:
    return Path(os.environ.get("EDGEINFER_ASSETS", REPO.parent / "shared" / "assets")).resolve()


def run_variant(rules: list[str], frames: int, folder: Path, fps: float) -> dict:
    evidence = folder / f"evidence-{len(list(folder.glob('evidence-*')))}"
    done = subprocess.run([sys.executable, "-c", WORKER, str(REPO), str(assets_dir()), str(frames),
                           json.dumps(rules), str(evidence), str(fps)], capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        raise SystemExit(f"worker failed: {done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--frames", type=int, default=600)
    parser.add_argument("--evidence-fps", type=float, default=5.0)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    names = list(VARIANTS)
    runs: dict[str, list[dict]] = {name: [] for name in names}
    with tempfile.TemporaryDirectory(prefix="edgeinfer-bench-events-") as tmp:
        folder = Path(tmp)
        run_variant([], args.frames, folder, args.evidence_fps)  # makes the clip; warms the page cache
        for rep in range(args.reps):
            for name in names[rep % len(names):] + names[:rep % len(names)]:
                runs[name].append(run_variant(VARIANTS[name], args.frames, folder, args.evidence_fps))
    report: dict[str, dict] = {}
    base_fps = statistics.median(r["fps"] for r in runs["off"])
    base_cpu = statistics.median(r["cpu_ms_per_frame"] for r in runs["off"])
    for name in names:
        fps = statistics.median(r["fps"] for r in runs[name])
        cpu = statistics.median(r["cpu_ms_per_frame"] for r in runs[name])
        report[name] = {"fps": round(fps, 2), "cpu_ms_per_frame": round(cpu, 3), "fps_ratio": round(fps / base_fps, 4),
                        "cpu_ratio": round(cpu / base_cpu, 4),
                        "events": statistics.median(r["events"] for r in runs[name]),
                        "frames_dropped": max(r["frames_dropped"] for r in runs[name])}
    summary = {"reps": args.reps, "frames": args.frames, "evidence_fps": args.evidence_fps, "variants": report}
    if args.json:
        print(json.dumps(summary, indent=1))
        return
    print(f"Ultraface on a 1280x720 clip, {args.frames} frames, {args.reps} reps, evidence {args.evidence_fps:g} fps")
    print(f"{'variant':8} {'fps':>8} {'x off':>7} {'CPU ms/frame':>13} {'x off':>7} {'events':>7} {'ev. dropped':>11}")
    for name, row in report.items():
        print(f"{name:8} {row['fps']:8.1f} {row['fps_ratio']:7.3f} {row['cpu_ms_per_frame']:13.2f} "
              f"{row['cpu_ratio']:7.3f} {row['events']:7g} {row['frames_dropped']:11d}")


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""What do capture rules cost the inference thread? Inference fps with capture on and off, in one run.

A real detector (default: Coral's COCO SSD MobileNet v2, LiteRT, one thread) runs through the real
``Pipeline`` over a generated MJPEG clip (default 1280x720, ``--size``) of six shared photos, ten frames
each, cycled (``policy=every``: read as fast as the pipeline goes). Variants, each a fresh Pipeline, rotating order
over ``--rounds`` rounds:

    off          no capture (full-size decode, as capture forces: only the sampler differs)
    idle         ``uncertain:0.999-1.0`` (a band no score falls in: the quantised SSD's scores stop at 0.996;
                 a band under the score threshold is refused, pipeline/rule_check.py) and
                 ``drift:0.99@120`` (its baseline and window each two whole cycles of the clip: the
                 distance stays ~0): every rule evaluated on every frame, none fires
    sometimes    ``random:0.025``: about one frame a second kept (at ~40 fps), spread over the run
    keeping      ``random:1.0`` with ``capture_per_minute`` 1e6: every frame kept, so a copy in the
                 inference thread, the JPEG encode and the writes in the store's thread (the queue of
                 ``QUEUE_SAMPLES`` drops what the disk cannot take, counted)
    off_reduced  informational: no capture with the default reduced decode (capture turns it off: a
                 sample is the full-size frame; 1280x720 MJPEG decodes at 1/2 scale for a 300x300 input,
                 640x480 would not be reduced), i.e. what turning capture on costs a default pipeline

Reported, medians over the rounds: fps (first result to last), its ratio to ``off`` (the median of
each round's own ratio: neighbours in time, so slow drifts of the machine's load cancel), CPU ms a
frame (every thread of the process: the store's encoding included), the model's invoke (p50 ms: is
it slowed by a busy neighbour thread?), the inference thread's time in ``StreamSampler.check`` a
frame (the instance's ``check`` wrapped in two ``perf_counter`` calls: the same call, the same
result; median over all frames, and over the kept ones alone), samples written and dropped, and the
rest of the machine's load meanwhile (cores, /proc/stat).

    PYTHONPATH=. python bench/capture.py [--rounds 5] [--frames 600] [--model M] [--threads 1]
                                            [--size 1280x720] [--json [FILE]]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
ASSETS = Path(os.environ.get("EDGEINFER_ASSETS", REPO.parent / "shared" / "assets")).resolve()
PHOTOS = ["kite_and_cold.jpg", "pets.jpg", "grace_hopper.bmp", "cat_720p.jpg", "parrot.jpg", "squat.bmp"]
FRAMES_PER_PHOTO = 10
CYCLE = FRAMES_PER_PHOTO * len(PHOTOS)
#: (capture rules, extra options) of each variant; None: capture off
VARIANTS: dict[str, tuple[list[str] | None, dict[str, Any]]] = {
    "off": (None, {"reduced_decode": False}),
    "idle": (["uncertain:0.999-1.0", f"drift:0.99@{2 * CYCLE}"], {}),
    "sometimes": (["random:0.025"], {"capture_per_minute": 1_000_000}),
    "keeping": (["random:1.0"], {"capture_per_minute": 1_000_000}),
    "off_reduced": (None, {}),
}
_HZ = os.sysconf("SC_CLK_TCK")


def _busy_jiffies() -> int:
    with open("/proc/stat") as handle:
        fields = handle.readline().split()[1:]
    return sum(int(v) for i, v in enumerate(fields[:8]) if i not in (3, 4))  # all but idle and iowait


class CheckTimer:
    """Stands in for one sampler's ``check``: calls it and keeps the time each call took (s)."""

    def __init__(self, check: Callable[..., str | None]) -> None:
        self._check = check
        self.all: list[float] = []
        self.kept: list[float] = []

    def __call__(self, result: Any, frame: Any, frame_id: int, timestamp: float) -> str | None:
        t0 = time.perf_counter()
        rule = self._check(result, frame, frame_id, timestamp)
        took = time.perf_counter() - t0
        self.all.append(took)
        if rule is not None:
            self.kept.append(took)
        return rule


def make_clip(folder: Path, frames: int, size: tuple[int, int]) -> Path:
    """The photos in turn, ten frames each, cycled to at least ``frames`` frames (MJPEG)."""
    from edgeinfer.capture import make_test_clip

    cycles = -(-frames // CYCLE)
    return make_test_clip(folder / "clip.avi", [ASSETS / "images" / p for p in PHOTOS] * cycles,
                          size=size, fps=30, frames_per_image=FRAMES_PER_PHOTO)


def run_variant(name: str, args: argparse.Namespace, clip: Path, folder: Path) -> dict[str, Any]:
    """One Pipeline run of ``args.frames`` frames under the variant: its figures."""
    from edgeinfer import Pipeline

    rules, extra = VARIANTS[name]
    store = folder / f"samples-{name}-{time.monotonic_ns()}"
    capture = {"capture": rules, "capture_dir": store} if rules else {}
    options = {"threads": args.threads, "policy": "every", "max_frames": args.frames, **capture, **extra}
    if args.labels:
        options["labels"] = args.labels
    with Pipeline(args.model, clip, **options) as pipeline:
        timer = None
        if pipeline.sampler is not None:  # before start(): every frame's check goes through the timer
            timer = pipeline.sampler.check = CheckTimer(pipeline.sampler.check)
        n, first, c1 = 0, 0.0, 0.0
        c0, j0 = time.process_time(), _busy_jiffies()
        for _ in pipeline:
            n += 1
            if n == 1:
                first, c1 = time.perf_counter(), time.process_time()
        wall, cpu = time.perf_counter() - first, time.process_time() - c1
        machine = (_busy_jiffies() - j0) / _HZ - (time.process_time() - c0)
        reduction = pipeline.source.reduction  # the last frame's decode scale: 1/reduction
        stages = {stage: values["p50"] for stage, values in pipeline.stats.stages.items()}
    counts = pipeline.sampler.counts() if pipeline.sampler is not None else {}  # closed: the queue written
    written = sum(1 for _ in store.iterdir()) if store.exists() else 0
    shutil.rmtree(store, ignore_errors=True)
    if n != args.frames:
        raise SystemExit(f"{name}: ran {n} frames, expected {args.frames}")
    return {"fps": (n - 1) / wall, "cpu_ms_per_frame": cpu / (n - 1) * 1e3,
            "check_us": statistics.median(timer.all) * 1e6 if timer else 0.0,
            "check_us_mean": statistics.fmean(timer.all) * 1e6 if timer else 0.0,
            "check_us_kept": statistics.median(timer.kept) * 1e6 if timer and timer.kept else None,
            "kept": counts.get("kept", 0), "written": written, "dropped": counts.get("dropped", 0),
            "failed": counts.get("failed", 0), "reduction": reduction, "infer_ms": stages["infer"],
            "stages_p50_ms": stages, "other_cores": max(machine, 0.0) / (wall or 1.0)}


def summarise(runs: dict[str, list[dict]]) -> dict[str, dict]:
    """Medians over the rounds; the fps ratio is each round's variant / off, then the median."""
    report = {}
    for name, rows in runs.items():
        def med(key: str, rows: list[dict] = rows) -> float | None:
            values = [r[key] for r in rows if r[key] is not None]
            return statistics.median(values) if values else None

        ratios = [r["fps"] / off["fps"] for r, off in zip(rows, runs["off"])]
        cpu_ratios = [r["cpu_ms_per_frame"] / off["cpu_ms_per_frame"] for r, off in zip(rows, runs["off"])]
        report[name] = {"fps": round(med("fps"), 2), "fps_ratio": round(statistics.median(ratios), 4),
                        "fps_ratio_min": round(min(ratios), 4), "fps_ratio_max": round(max(ratios), 4),
                        "cpu_ms_per_frame": round(med("cpu_ms_per_frame"), 3),
                        "cpu_ratio": round(statistics.median(cpu_ratios), 4), "infer_ms": round(med("infer_ms"), 2),
                        "check_us": round(med("check_us"), 2), "check_us_mean": round(med("check_us_mean"), 2),
                        "check_us_kept": None if med("check_us_kept") is None else round(med("check_us_kept"), 1),
                        "decode_scale": f"1/{max(r['reduction'] for r in rows)}",
                        "written": med("written"), "dropped": med("dropped"), "failed": max(r["failed"] for r in rows),
                        "other_cores": round(med("other_cores"), 2),
                        "stages_p50_ms": {k: round(statistics.median(r["stages_p50_ms"][k] for r in rows), 3)
                                          for k in rows[0]["stages_p50_ms"]}}
    return report


def print_table(summary: dict) -> None:
    print(f"{Path(summary['model']).name}, {summary['threads']} thread(s), {summary['size']} MJPEG clip, "
          f"{summary['frames']} frames a run, {summary['rounds']} rounds (rotating order); medians")
    print(f"{'variant':12} {'fps':>7} {'x off':>6} {'(min-max)':>13} {'CPU ms/fr':>9} {'x off':>6} {'invoke':>6} "
          f"{'check us':>9} {'mean':>7} {'kept fr.':>8} {'written':>7} {'dropped':>7} {'decode':>6} {'others':>6}")
    for name, row in summary["variants"].items():
        kept = "-" if row["check_us_kept"] is None else f"{row['check_us_kept']:.1f}"
        print(f"{name:12} {row['fps']:7.1f} {row['fps_ratio']:6.3f} {row['fps_ratio_min']:6.3f}-"
              f"{row['fps_ratio_max']:.3f} {row['cpu_ms_per_frame']:9.2f} {row['cpu_ratio']:6.3f} "
              f"{row['infer_ms']:6.2f} {row['check_us']:9.2f} {row['check_us_mean']:7.2f} {kept:>8} "
              f"{row['written']:7g} {row['dropped']:7g} {row['decode_scale']:>6} {row['other_cores']:6.2f}")
    print("check us: the inference thread's time in StreamSampler.check a frame (median, mean; 'kept fr.': the median "
          "over the frames a rule kept); invoke: the model's p50 ms; others: cores the rest of the machine used "
          "meanwhile")
    print("check alone, on one run's results (a real frame), median us a call: " + ", ".join(
        f"{rules} {us:.2f}" for rules, us in summary["check_alone_us"].items()))


def check_alone(args: argparse.Namespace, clip: Path, folder: Path, passes: int = 5) -> dict[str, float]:
    """``StreamSampler.check`` timed outside the pipeline on one run's own results, rule by rule (none fires):
    what each idle rule costs a frame, without the pipeline's threads around it."""
    import cv2

    from edgeinfer import Pipeline
    from edgeinfer.pipeline.sampling import CaptureRule, SampleStore, StreamSampler

    with Pipeline(args.model, clip, threads=args.threads, max_frames=args.frames, labels=args.labels) as pipeline:
        results = [r.result for r in pipeline]
    frame = cv2.resize(cv2.imread(str(ASSETS / "images" / PHOTOS[0])), args.size)
    report = {}
    for rules in (VARIANTS["idle"][0][:1], VARIANTS["idle"][0][1:], VARIANTS["idle"][0]):
        times = []
        for _ in range(passes):  # each pass a fresh sampler: the drift rule's baseline starts again
            sampler = StreamSampler(tuple(CaptureRule.parse(r) for r in rules), SampleStore(folder / "alone", 1 << 20))
            for i, result in enumerate(results):
                t0 = time.perf_counter()
                kept = sampler.check(result, frame, i, i / 30)
                times.append(time.perf_counter() - t0)
                assert kept is None, f"{rules} kept frame {i}: the idle rules must not fire"
            sampler.close()
        report[" + ".join(rules)] = round(statistics.median(times) * 1e6, 2)
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5, help="rounds (each runs every variant once)")
    parser.add_argument("--frames", type=int, default=600, help="frames a run")
    parser.add_argument("--model", default=str(ASSETS / "models" / "mobilenet_ssd_v2_coco_quant_postprocess.tflite"))
    parser.add_argument("--labels", default=None, help="default: the COCO labels for the default model")
    parser.add_argument("--threads", type=int, default=1, help="the model's threads")
    parser.add_argument("--size", default="1280x720", help="the clip's frame size, WxH")
    parser.add_argument("--variants", default=",".join(VARIANTS), help="which of " + ", ".join(VARIANTS))
    parser.add_argument("--json", nargs="?", const="-", default=None, metavar="FILE",
                        help="the figures as JSON: on stdout instead of the table, or into FILE besides it")
    args = parser.parse_args()
    args.size = tuple(int(v) for v in args.size.lower().split("x"))
    if args.labels is None and "coco" in Path(args.model).name:
        args.labels = str(ASSETS / "labels" / "coco_labels.txt")
    names = [n for n in args.variants.split(",") if n]
    if "off" not in names or set(names) - set(VARIANTS):
        raise SystemExit(f"--variants: 'off' and any of {', '.join(VARIANTS)}")
    import logging

    logging.basicConfig(level=logging.ERROR)
    runs: dict[str, list[dict]] = {name: [] for name in names}
    with tempfile.TemporaryDirectory(prefix="edgeinfer-bench-capture-") as tmp:
        folder = Path(tmp)
        clip = make_clip(folder, args.frames, args.size)
        run_variant("keeping", argparse.Namespace(**{**vars(args), "frames": 30}), clip, folder)  # warm caches
        for rnd in range(args.rounds):
            for name in names[rnd % len(names):] + names[:rnd % len(names)]:
                runs[name].append(run_variant(name, args, clip, folder))
            if args.json != "-":
                print(f"  round {rnd + 1}: " + "  ".join(f"{n} {runs[n][-1]['fps']:.1f}" for n in names) + " fps",
                      flush=True)
        alone = check_alone(args, clip, folder)
    summary = {"model": args.model, "threads": args.threads, "size": "x".join(map(str, args.size)),
               "frames": args.frames, "rounds": args.rounds,
               "cpus": os.cpu_count(), "variants": summarise(runs), "check_alone_us": alone}
    if args.json is not None:
        text = json.dumps(summary, indent=1)
        if args.json == "-":
            print(text)
            return
        Path(args.json).write_text(text + "\n")
    print_table(summary)


if __name__ == "__main__":
    main()

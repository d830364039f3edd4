"""The edgeinfer pipeline against the loop a tutorial would write, invoke alone and decode alone.

All in one run, interleaved (each repetition runs every method once, the order rotating), medians
over the repetitions. Three cases on MJPEG clips generated from the shared photos:

* accelerator-like: MobileNet v2 quant on 1 delegate thread, 1920x1080 — the pipeline should reach
  >= 95% of the slower of invoke alone and decode alone, and >= 1.6x the tutorial loop;
* decode-bound: MobileNet v1 0.25 on all cores, 1920x1080 — >= 95% of decode alone, >= 1.15x tutorial;
* CPU-saturated: MobileNet v2 quant on all cores, 640x480 — >= the tutorial, >= 90% of invoke alone.

Also per frame: CPU time (all threads of the process) and bytes allocated (tracemalloc: the
peak above the level at the start of each frame, averaged). "decode alone" is the faster of a plain
``cv2.VideoCapture.read()`` loop and edgeinfer's own source read loop at the frame size the pipeline
asks for (MJPEG decoded at 1/2, 1/4 or 1/8 scale when the model input allows), so the bar is the
strictest.

Other processes on the machine distort every figure: each measurement records how much CPU the
rest of the machine used meanwhile (from /proc/stat), and the medians use the quiet repetitions.

    PYTHONPATH=. python bench/pipeline.py [--reps 7] [--cases accelerator,decode,cpu] [--json out.json]
                                          [--per-thread]   (+ CPU per frame of each pipeline thread)
"""

from __future__ import annotations

import argparse
import functools
import gc
import json
import os
import statistics
import sys
import time
import tracemalloc
from dataclasses import dataclass, field
from pathlib import Path

import cv2
import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from edgeinfer.capture import cached_test_clip, video_file_source  # noqa: E402
from edgeinfer.pipeline.core import Pipeline  # noqa: E402
from edgeinfer.pipeline.preprocess import input_geometry  # noqa: E402
from edgeinfer.runtime.model import inspect_model  # noqa: E402

ASSETS = Path(os.environ.get("EDGEINFER_ASSETS", REPO.parent / "shared" / "assets")).resolve()
PHOTOS = ["parrot.jpg", "cat.bmp", "grace_hopper.bmp", "cat_720p.jpg", "dog_segmentation.bmp", "squat.bmp"]
#: a repetition counts as quiet when the rest of the machine used less than this many cores
QUIET_CORES = 0.15


@dataclass(frozen=True)
class Case:
    name: str
    title: str
    model: str
    threads: int
    size: tuple[int, int]
    frames: int  # measured frames per method and repetition (after the warm-up)


def cases(all_cores: int) -> dict[str, Case]:
    return {
        "accelerator": Case("accelerator", "accelerator-like: MobileNet v2, 1 thread, 1920x1080",
                            "mobilenet_v2_1.0_224_quant.tflite", 1, (1920, 1080), 200),
        "decode": Case("decode", f"decode-bound: MobileNet v1 0.25, {all_cores} threads, 1920x1080",
                       "mobilenet_v1_0.25_128_quant.tflite", all_cores, (1920, 1080), 200),
        "cpu": Case("cpu", f"CPU-saturated: MobileNet v2, {all_cores} threads, 640x480",
                    "mobilenet_v2_1.0_224_quant.tflite", all_cores, (640, 480), 400),
    }


WARMUP = 20


# ------------------------------------------------------------------------------ measurement
def _busy_jiffies() -> int:
    with open("/proc/stat") as handle:
        fields = handle.readline().split()[1:]
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(v) for v in fields[:8])
    return user + nice + system + irq + softirq + steal


_HZ = os.sysconf("SC_CLK_TCK")


def process_cpu(pid: int) -> float:
    """CPU seconds (user + system, all threads) process ``pid`` has used so far (/proc/PID/stat, 10 ms steps)."""
    with open(f"/proc/{pid}/stat") as handle:
        fields = handle.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _HZ


@dataclass
class Window:
    """Wall time, process CPU time and the rest of the machine's CPU over a measured span: of this process,
    or of the child process ``pid`` (bench/peers.py)."""

    wall: float = 0.0
    cpu: float = 0.0
    foreign_cores: float = 0.0
    pid: int | None = field(default=None, repr=False)
    _t: float = field(default=0.0, repr=False)
    _c: float = field(default=0.0, repr=False)
    _j: int = field(default=0, repr=False)

    def _cpu(self) -> float:
        return time.process_time() if self.pid is None else process_cpu(self.pid)

    def begin(self) -> None:
        self._j = _busy_jiffies()
        self._c = self._cpu()
        self._t = time.perf_counter()

    def end(self) -> Window:
        self.wall = time.perf_counter() - self._t
        self.cpu = self._cpu() - self._c
        machine = (_busy_jiffies() - self._j) / _HZ
        self.foreign_cores = max(machine - self.cpu, 0.0) / self.wall if self.wall > 0 else 0.0
        return self


def other_load(seconds: float = 0.3) -> float:
    """Cores the rest of the machine keeps busy right now (this process is idle meanwhile)."""
    jiffies, cpu = _busy_jiffies(), time.process_time()
    time.sleep(seconds)
    return max((_busy_jiffies() - jiffies) / _HZ - (time.process_time() - cpu), 0.0) / seconds


def wait_quiet(limit_s: float) -> None:
    """Wait (up to ``limit_s``) for a moment when other processes leave the cores alone."""
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline and other_load() >= QUIET_CORES:
        time.sleep(0.5)


def _interpreter(model: Path, threads: int):
    from ai_edge_litert.interpreter import Interpreter

    interpreter = Interpreter(model_path=str(model), num_threads=threads)
    interpreter.allocate_tensors()
    return interpreter


def run_tutorial(case: Case, clip: Path, model: Path, memory: bool = False) -> Window | float:
    """read, cvtColor, resize, expand_dims, set_tensor, invoke, get_tensor — as tutorials write it."""
    interpreter = _interpreter(model, case.threads)
    inp = interpreter.get_input_details()[0]
    out = interpreter.get_output_details()[0]
    height, width = int(inp["shape"][1]), int(inp["shape"][2])
    cap = cv2.VideoCapture(str(clip))
    window = Window()
    tracker = _Allocations() if memory else None
    for i in range(WARMUP + case.frames):
        if i == WARMUP:
            window.begin()
            if tracker:
                tracker.begin()
        ok, frame = cap.read()
        if not ok:
            raise RuntimeError(f"{clip} ended after {i} frames")
        rgb = cv2.cvtColor(frame, cv2.COLOR_BGR2RGB)
        resized = cv2.resize(rgb, (width, height))
        interpreter.set_tensor(inp["index"], np.expand_dims(resized, axis=0))
        interpreter.invoke()
        scores = interpreter.get_tensor(out["index"])
        int(np.argmax(scores))
        if tracker and i >= WARMUP:
            tracker.frame()
    cap.release()
    return tracker.per_frame() if tracker else window.end()


def run_invoke(case: Case, clip: Path, model: Path) -> Window:
    interpreter = _interpreter(model, case.threads)
    inp = interpreter.get_input_details()[0]
    interpreter.set_tensor(inp["index"], np.full(inp["shape"], 128, np.uint8))
    window = Window()
    for i in range(WARMUP + case.frames):
        if i == WARMUP:
            window.begin()
        interpreter.invoke()
    return window.end()


def run_decode_cv2(case: Case, clip: Path, model: Path) -> Window:
    cap = cv2.VideoCapture(str(clip))
    window = Window()
    for i in range(WARMUP + case.frames):
        if i == WARMUP:
            window.begin()
        ok, _ = cap.read()
        if not ok:
            raise RuntimeError(f"{clip} ended after {i} frames")
    cap.release()
    return window.end()


def _input_size(model: Path) -> tuple[int, int]:
    """(width, height) of the model's image input — the frame size the pipeline asks sources for."""
    height, width, _, _ = input_geometry(inspect_model(model).inputs[0])
    return width, height


def run_decode_source(case: Case, clip: Path, model: Path) -> Window:
    """edgeinfer's reader, asked for the same frame size as the pipeline asks (reduced-scale MJPEG)."""
    with video_file_source(clip) as source:
        source.prefer_min_size(_input_size(model))
        buffer = None
        window = Window()
        for i in range(WARMUP + case.frames):
            if i == WARMUP:
                window.begin()
            buffer = source.read(buffer)
            if buffer is None:
                raise RuntimeError(f"{clip} ended after {i} frames")
    return window.end()


PIPELINE_OPTIONS = json.loads(os.environ.get("EDGEINFER_BENCH_PIPELINE", "{}"))


def run_pipeline(case: Case, clip: Path, model: Path, memory: bool = False, callback: bool = False,
                 **options) -> Window | float:
    """The edgeinfer pipeline, consumed by iterating over it (or with a callback)."""
    options = {**PIPELINE_OPTIONS, **options}
    window = Window()
    tracker = _Allocations() if memory else None
    with Pipeline(model, str(clip), threads=case.threads, policy="every", max_frames=WARMUP + case.frames,
                  top_k=5, **options) as pipeline:
        if callback:
            count = 0

            def consume(_result) -> None:
                nonlocal count
                count += 1
                if count == WARMUP:
                    window.begin()

            pipeline.start(consume)
            pipeline.wait()
        for count, _result in enumerate(pipeline if not callback else (), 1):
            if count == WARMUP:
                window.begin()
                if tracker:
                    tracker.begin()
            elif tracker and count > WARMUP:
                tracker.frame()
        if pipeline.frames != WARMUP + case.frames:
            raise RuntimeError(f"pipeline processed {pipeline.frames} frames: {pipeline.error}")
    return tracker.per_frame() if tracker else window.end()


def thread_cpu(case: Case, clip: Path, model: Path, **options) -> dict[str, float]:
    """CPU ms per frame of each of the process's threads during a pipeline run (/proc/self/task)."""
    import threading

    def sample() -> dict[int, float]:
        out = {}
        for task in Path(f"/proc/{os.getpid()}/task").iterdir():
            try:
                fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            out[int(task.name)] = (int(fields[11]) + int(fields[12])) / _HZ
        return out

    options = {**PIPELINE_OPTIONS, **options}
    measured = case.frames - 20  # stop before the end: finished threads leave /proc
    with Pipeline(model, str(clip), threads=case.threads, policy="every", max_frames=WARMUP + case.frames,
                  top_k=5, **options) as pipeline:
        results = iter(pipeline)
        for _ in range(WARMUP):
            next(results)
        names = {t.native_id: t.name for t in threading.enumerate()}
        before = sample()
        for _ in range(measured):
            next(results)
        after = sample()
    per_thread: dict[str, float] = {}
    for tid, seconds in after.items():
        name = names.get(tid, "runtime worker")
        per_thread[name] = per_thread.get(name, 0.0) + (seconds - before.get(tid, 0.0)) / measured * 1e3
    return per_thread


class _Allocations:
    """tracemalloc: per frame, the peak of traced memory above its level when the frame began."""

    def begin(self) -> None:
        gc.collect()
        self.total = 0
        self.frames = 0
        self.level = tracemalloc.get_traced_memory()[0]
        self.start_level = self.level
        tracemalloc.reset_peak()

    def frame(self) -> None:
        current, peak = tracemalloc.get_traced_memory()
        self.total += max(peak - self.level, 0)
        self.frames += 1
        self.level = current
        tracemalloc.reset_peak()

    def per_frame(self) -> float:
        return self.total / max(self.frames, 1)


METHODS = {
    "tutorial": run_tutorial,
    "invoke": run_invoke,
    "decode_cv2": run_decode_cv2,
    "decode_source": run_decode_source,
    "pipeline": run_pipeline,
}
# Pipeline variants to compare in the same interleaved run, e.g.
# EDGEINFER_BENCH_VARIANTS='{"pre_capture": {"preprocess_in": "capture"}}'
for _name, _options in json.loads(os.environ.get("EDGEINFER_BENCH_VARIANTS", "{}")).items():
    METHODS[f"pipeline_{_name}"] = functools.partial(run_pipeline, **_options)


# ------------------------------------------------------------------------------------ report
def median_of(samples: list[Window]) -> tuple[float, float, int]:
    """(median wall, median cpu, samples used): over the quiet repetitions, or all when none was quiet."""
    quiet = [w for w in samples if w.foreign_cores < QUIET_CORES]
    used = quiet or samples
    return statistics.median(w.wall for w in used), statistics.median(w.cpu for w in used), len(quiet)


def bench_case(case: Case, reps: int, cache: Path | None, log, quiet_wait: float = 0.0,
               max_reps: int | None = None, per_thread: bool = False) -> dict:
    """Interleaved repetitions until every method has ``reps`` quiet samples (or ``max_reps`` rounds)."""
    model = ASSETS / "models" / case.model
    photos = [ASSETS / "images" / name for name in PHOTOS]
    per_image = -(-(WARMUP + case.frames) // len(photos))
    clip = cached_test_clip(photos, size=case.size, fps=30, frames_per_image=per_image, cache_dir=cache)
    log(f"\n== {case.title}\n   clip {clip} ({per_image * len(photos)} frames)")
    samples: dict[str, list[Window]] = {name: [] for name in METHODS}
    names = list(METHODS)
    rounds = 0
    limit = max_reps or reps * 3
    while rounds < limit:
        quiet = min(sum(w.foreign_cores < QUIET_CORES for w in samples[name]) for name in names)
        if quiet >= reps:
            break
        order = names[rounds % len(names):] + names[: rounds % len(names)]
        rounds += 1
        line = []
        for name in order:
            gc.collect()
            if quiet_wait:
                wait_quiet(quiet_wait)
            window = METHODS[name](case, clip, model)
            samples[name].append(window)
            mark = "" if window.foreign_cores < QUIET_CORES else "*"
            line.append(f"{name} {case.frames / window.wall:6.1f}/s{mark}")
        log(f"   round {rounds}: " + ", ".join(line))
    result: dict = {"case": case.name, "title": case.title, "model": case.model, "threads": case.threads,
                    "size": list(case.size), "frames": case.frames, "rounds": rounds, "methods": {}}
    for name, windows in samples.items():
        wall, cpu, quiet = median_of(windows)
        result["methods"][name] = {
            "fps": case.frames / wall, "cpu_ms_per_frame": cpu / case.frames * 1e3, "quiet_reps": quiet,
            "other_load_cores": statistics.median(w.foreign_cores for w in windows),
            "fps_all": [round(case.frames / w.wall, 2) for w in windows],
        }
    if per_thread:
        result["thread_cpu_ms_per_frame"] = thread_cpu(case, clip, model)
    tracemalloc.start()
    try:
        result["bytes_per_frame"] = {
            "tutorial": run_tutorial(case, clip, model, memory=True),
            "pipeline": run_pipeline(case, clip, model, memory=True),
        }
    finally:
        tracemalloc.stop()
    return result


GOALS = {
    "accelerator": (("pipeline / slower(invoke, decode)", 0.95), ("pipeline / tutorial", 1.6)),
    "decode": (("pipeline / decode", 0.95), ("pipeline / tutorial", 1.15)),
    "cpu": (("pipeline / tutorial", 1.0), ("pipeline / invoke", 0.90)),
}


def ratios(result: dict) -> dict[str, float]:
    fps = {name: m["fps"] for name, m in result["methods"].items()}
    decode = max(fps["decode_cv2"], fps["decode_source"])
    return {
        "pipeline / tutorial": fps["pipeline"] / fps["tutorial"],
        "pipeline / invoke": fps["pipeline"] / fps["invoke"],
        "pipeline / decode": fps["pipeline"] / decode,
        "pipeline / slower(invoke, decode)": fps["pipeline"] / min(fps["invoke"], decode),
    }


def report(results: list[dict], log) -> None:
    log("\n== summary (medians over the quiet repetitions — those where the rest of the machine used < "
        f"{QUIET_CORES} cores; * above marks the others; CPU = process CPU time per frame, all threads)")
    for result in results:
        m = result["methods"]
        log(f"\n{result['title']}  ({result['rounds']} rounds)")
        log(f"   {'method':<20}{'fps':>9}{'CPU ms/frame':>14}{'quiet reps':>12}")
        for name in METHODS:
            log(f"   {name:<20}{m[name]['fps']:>9.1f}{m[name]['cpu_ms_per_frame']:>14.2f}{m[name]['quiet_reps']:>12}")
        r = ratios(result)
        result["ratios"] = r
        for label, goal in GOALS[result["case"]]:
            verdict = "meets" if r[label] >= goal else "MISSES"
            log(f"   {label:<36} {r[label]:5.2f}x  (goal >= {goal:.2f}x: {verdict})")
        cpu_ok = m["pipeline"]["cpu_ms_per_frame"] <= m["tutorial"]["cpu_ms_per_frame"]
        log(f"   CPU per frame, pipeline vs tutorial: {m['pipeline']['cpu_ms_per_frame']:.2f} vs "
            f"{m['tutorial']['cpu_ms_per_frame']:.2f} ms ({'meets' if cpu_ok else 'MISSES'} goal <=)")
        b = result["bytes_per_frame"]
        log(f"   allocated per frame (tracemalloc): pipeline {b['pipeline']:,.0f} B, tutorial {b['tutorial']:,.0f} B"
            f" ({'meets' if b['pipeline'] < 1024 else 'MISSES'} goal < 1 KiB)")
        if "thread_cpu_ms_per_frame" in result:  # 10 ms jiffies: read these over a few hundred frames
            split = ", ".join(f"{name} {ms:.2f}" for name, ms in sorted(result["thread_cpu_ms_per_frame"].items()))
            log(f"   pipeline CPU ms per frame by thread (one extra run): {split}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=5,
                        help="quiet repetitions wanted per method (each round runs every method once)")
    parser.add_argument("--max-rounds", type=int, help="give up waiting for quiet rounds after this many (3 x reps)")
    parser.add_argument("--cases", default="accelerator,decode,cpu")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="'all cores' thread count")
    parser.add_argument("--frames", type=float, default=1.0, help="scale the measured frame counts")
    parser.add_argument("--cache", type=Path, help="where the generated clips go (default ~/.cache/edgeinfer)")
    parser.add_argument("--json", type=Path, help="write the results here")
    parser.add_argument("--per-thread", action="store_true",
                        help="one extra pipeline run per case: CPU per frame of each thread (/proc/self/task)")
    parser.add_argument("--wait-quiet", type=float, default=20.0, metavar="S",
                        help="before each measurement wait up to S seconds for other processes to calm down")
    args = parser.parse_args()
    table = cases(args.threads)
    chosen = [table[name.strip()] for name in args.cases.split(",") if name.strip()]
    if args.frames != 1.0:
        chosen = [Case(c.name, c.title, c.model, c.threads, c.size, max(20, int(c.frames * args.frames)))
                  for c in chosen]

    def log(text: str) -> None:
        print(text, flush=True)

    log(f"edgeinfer pipeline benchmark — {os.cpu_count()} cores, OpenCV {cv2.__version__}, numpy {np.__version__}")
    log(f"load average at start: {os.getloadavg()}")
    results = [bench_case(case, args.reps, args.cache, log, args.wait_quiet, args.max_rounds, args.per_thread)
               for case in chosen]
    report(results, log)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())

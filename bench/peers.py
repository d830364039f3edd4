"""edgeinfer against the loop users write and against Ultralytics' own predict, on the same ONNX file.

Five programs, each a process of its own, on every frame of a 1280x720 clip (H.264 in MP4, MJPEG in AVI),
at the same intra-op thread count; all but "chosen" on ONNX Runtime:

* **plain** — the ~40-line OpenCV + ONNX Runtime loop a user writes (bench/peer_programs.py ``plain_loop``);
* **edgeinfer** — ``edgeinfer run MODEL --source CLIP --json --threads N --delegate onnxruntime`` at
  Ultralytics' thresholds (``--score-threshold 0.25 --iou 0.7 --max-detections 300``): the same runtime;
* **chosen** — the same ``edgeinfer run`` without ``--delegate``, as a new user runs it: on the runtime the
  delegate probe chose by measurement on this machine (cached per model, runtime versions and threads; its
  first run measures), the one it ran on kept from its summary line;
* **ultralytics** — ``YOLO(MODEL, task=...).predict(CLIP, stream=True, conf=0.25, iou=0.7, max_det=300)`` in
  a bench-only environment (``--setup-ultralytics`` makes it; bench/peer_programs.py says how its threads
  are set). Left out, and said so, when that environment is missing;
* **runtime** — the ceiling: the plain loop's session invoked as many times as the clip has frames on its first
  frame, preprocessed once; no decoding, preprocessing or output decoding. No program on this runtime and thread
  count can run faster, so "the runtime alone ÷ plain" is the most any program could lead the plain loop by.

Each program prints one JSON line per frame as it finishes it; this process times the lines as they come.
Per run: **steady fps** (frames after the warm-up over the time from the warm-up's last result to the
last one), **CPU ms per frame** over the same span (the child's user + system time, all its threads, from
/proc/PID/stat), **peak RSS** (the child's rusage at exit), the time from start to the first result, and how
many cores the rest of the machine used meanwhile. Rounds alternate the programs (the order rotating); the
table gives medians over the rounds and, for the ratios, the median and min-max of the per-round ratios
(each round's edgeinfer run over the same round's peer run; the chosen runtime's over Ultralytics', goal
2x). **Box agreement**: edgeinfer's boxes (both runs, and the plain loop's) against Ultralytics' on every
frame, matched by class at IoU >= 0.5 (tools/optimize's
``box_agreement``): recall = Ultralytics' boxes found, precision = boxes found that Ultralytics has too.
Without Ultralytics, the plain loop's boxes are the reference.

    PYTHONPATH=. python bench/peers.py [--models pose,fall] [--threads 1,2] [--codecs h264,mjpeg]
                                       [--rounds 5] [--frames 150] [--warmup 15] [--json out.json]
                                       [--programs plain,edgeinfer,ultralytics,chosen,runtime] [--ultralytics-python PY]
    PYTHONPATH=. python bench/peers.py --setup-ultralytics   # make the bench-only Ultralytics environment
    PYTHONPATH=. python bench/peers.py --report a.json b.json  # one table from earlier runs
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import cv2
import numpy as np

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
sys.path.insert(0, str(REPO))

from edgeinfer.capture.images import read_image  # noqa: E402
from edgeinfer.pipeline.agreement import Box, box_agreement  # noqa: E402


def _bench_module(name: str):
    """A sibling benchmark as a module, by its path (bench/ is no package, and on sys.path its names would
    shadow others)."""
    spec = importlib.util.spec_from_file_location(f"bench_{name}", BENCH / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


#: bench/pipeline.py's measuring window (wall, CPU, the rest of the machine's load) and its wait for quiet
_pipeline_bench = _bench_module("pipeline")
Window, wait_quiet = _pipeline_bench.Window, _pipeline_bench.wait_quiet

ASSETS = Path(os.environ.get("EDGEINFER_ASSETS", REPO.parent / "shared" / "assets")).resolve()
CACHE = Path(os.environ.get("EDGEINFER_CACHE") or Path.home() / ".cache" / "edgeinfer")
PROGRAMS_FILE = BENCH / "peer_programs.py"
#: the models: short name -> (file in the shared assets, Ultralytics task)
MODELS = {"pose": ("yolo11n-pose.onnx", "pose"), "fall": ("yolo_fall_detection.onnx", "detect")}
CODECS = ("h264", "mjpeg")
PROGRAMS = ("plain", "edgeinfer", "ultralytics", "chosen", "runtime")
#: the programs that are edgeinfer runs (their result lines read alike)
EDGEINFER_PROGRAMS = ("edgeinfer", "chosen")
#: Ultralytics' predict defaults, given to all three programs
THRESHOLDS = {"conf": 0.25, "iou": 0.7, "max_det": 300}
SIZE = (1280, 720)
FPS = 30
#: the goals of issue 37 (ratios of steady fps; agreement as recall and precision)
GOAL_RATIO = 1.1
GOAL_CHOSEN_RATIO = 2.0  # the runtime chosen by measurement over Ultralytics
GOAL_AGREEMENT = 0.99

# ---------------------------------------------------------------------------------------------- the clips
#: a street scene with people (kites) as the background, panned; over it, in turn, one of these photos walks
#: across the frame, so every frame differs (an H.264 encoder gets motion to code, as from a camera)
BACKGROUND = "kite_and_cold.jpg"
WALKERS = ("grace_hopper.bmp", "squat.bmp", "face.jpg", "pets.jpg", "parrot.jpg")
SEGMENT = 12  # frames per walker


def render_frames(count: int, size: tuple[int, int] = SIZE) -> Iterator[np.ndarray]:
    """``count`` BGR frames of ``size`` made from the shared photos (see WALKERS)."""
    width, height = size
    pan = width // 8
    background = read_image(ASSETS / "images" / BACKGROUND)
    scale = max((width + pan) / background.shape[1], height / background.shape[0])
    background = cv2.resize(background, None, fx=scale, fy=scale, interpolation=cv2.INTER_AREA)
    walkers = []
    for name in WALKERS:
        photo = read_image(ASSETS / "images" / name)
        factor = 0.6 * height / photo.shape[0]
        walkers.append(cv2.resize(photo, None, fx=factor, fy=factor, interpolation=cv2.INTER_AREA))
    for index in range(count):
        segment, step = divmod(index, SEGMENT)
        x0 = abs(index % (2 * pan) - pan)  # the background pans to and fro
        frame = background[:height, x0:x0 + width].copy()
        walker = walkers[segment % len(walkers)]
        h, w = walker.shape[:2]
        x = round((width - w) * step / (SEGMENT - 1)) if SEGMENT > 1 else 0
        y = height - h - height // 20
        frame[y:y + h, x:x + w] = walker
        yield frame


def _write_mjpeg(path: Path, frames: Iterator[np.ndarray], size: tuple[int, int]) -> None:
    """MJPEG in AVI at quality 90 (as capture.clips.make_test_clip writes its clips)."""
    writer = cv2.VideoWriter(str(path), cv2.CAP_OPENCV_MJPEG, cv2.VideoWriter_fourcc(*"MJPG"), float(FPS), size)
    if not writer.isOpened():
        raise RuntimeError(f"cannot write an MJPEG clip to {path}")
    writer.set(cv2.VIDEOWRITER_PROP_QUALITY, 90)
    for frame in frames:
        writer.write(frame)
    writer.release()


def _write_h264(path: Path, frames: Iterator[np.ndarray], size: tuple[int, int]) -> None:
    """H.264 in MP4 as a camera records it: yuv420p, a key frame every 2 s, no B-frames (PyAV's libx264)."""
    import av

    with av.open(str(path), "w", format="mp4") as container:
        stream = container.add_stream("libx264", rate=FPS)
        stream.width, stream.height, stream.pix_fmt = size[0], size[1], "yuv420p"
        stream.options = {"preset": "veryfast", "crf": "23", "g": str(2 * FPS), "bf": "0"}
        for frame in frames:
            for packet in stream.encode(av.VideoFrame.from_ndarray(frame, format="bgr24")):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)


def bench_clip(codec: str, count: int, size: tuple[int, int] = SIZE, cache: Path = CACHE) -> Path:
    """The clip of ``count`` frames in ``codec`` (h264 or mjpeg), made once into the cache folder."""
    inputs = [ASSETS / "images" / name for name in (BACKGROUND, *WALKERS)]
    key = "|".join([*(f"{p.name}:{p.stat().st_size}" for p in inputs), f"{size[0]}x{size[1]}", str(count),
                    str(SEGMENT), codec, "peers-1"])
    suffix = {"h264": ".mp4", "mjpeg": ".avi"}[codec]
    digest = hashlib.sha256(key.encode()).hexdigest()[:10]
    target = cache / "clips" / f"peers-{codec}-{size[0]}x{size[1]}-{count}-{digest}{suffix}"
    if target.is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(f".{target.stem}.partial{suffix}")  # the suffix picks the container
    (_write_h264 if codec == "h264" else _write_mjpeg)(partial, render_frames(count, size), size)
    partial.replace(target)
    return target


# ------------------------------------------------------------------------------------------- the programs
def program_command(program: str, model: Path, task: str, clip: Path, threads: int,
                    ultralytics_python: Path, limit: int | None = None) -> list[str]:
    """The command line that runs ``program`` over ``clip`` (``runtime``: ``limit`` invokes, the clip's length)."""
    conf, iou, max_det = (str(THRESHOLDS[k]) for k in ("conf", "iou", "max_det"))
    if program in EDGEINFER_PROGRAMS:
        same_runtime = ["--delegate", "onnxruntime"] if program == "edgeinfer" else []
        return [sys.executable, "-m", "edgeinfer", "run", str(model), "--source", str(clip), "--json",
                "--threads", str(threads), "--score-threshold", conf, "--iou", iou, "--max-detections", max_det,
                *same_runtime]
    python = str(ultralytics_python) if program == "ultralytics" else sys.executable
    invokes = ["--limit", str(limit)] if program == "runtime" and limit else []
    return [python, str(PROGRAMS_FILE), program, str(model), str(clip), "--threads", str(threads), "--task", task,
            "--conf", conf, "--iou", iou, "--max-det", max_det, *invokes]


def program_env(program: str) -> dict[str, str]:
    env = dict(os.environ, PYTHONUNBUFFERED="1")  # each result line leaves the child when it is written
    if program == "ultralytics":
        env.pop("PYTHONPATH", None)  # its own environment only
        env["YOLO_OFFLINE"] = "1"  # no online checks (this machine reaches no such host anyway)
    else:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    return env


@dataclass
class Run:
    """One program's run over one clip."""

    program: str
    frames: int
    fps: float
    cpu_ms_per_frame: float
    rss_mib: float
    first_result_s: float
    other_load_cores: float
    boxes: list[list[Box]] = field(repr=False)
    delegate: str | None = None  # what an edgeinfer run ran on (its summary line)


class ProgramFailed(RuntimeError):
    pass


def _boxes(program: str, line: dict) -> list[Box]:
    if program in EDGEINFER_PROGRAMS:
        return [Box(tuple(d["box"]), d["score"], d["class_id"]) for d in line["result"]]
    return [Box(tuple(b[:4]), b[4], int(b[5])) for b in line["boxes"]]


def run_program(program: str, command: list[str], warmup: int) -> Run:
    """Run ``command``; time its result lines; CPU and load over the steady span, peak RSS at its exit."""
    with tempfile.TemporaryFile() as errors:
        started = time.perf_counter()
        process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=errors, env=program_env(program))
        window = Window(pid=process.pid)
        lines, first, delegate = [], None, None
        assert process.stdout is not None
        for raw in process.stdout:
            if raw.startswith(b'{"type": "summary"'):
                delegate = json.loads(raw).get("delegate")
                continue
            if not raw.startswith((b'{"frame"', b'{"type": "result"')):
                continue
            lines.append(raw)
            if first is None:
                first = time.perf_counter() - started
            if len(lines) == warmup:
                window.begin()
            elif len(lines) > warmup:
                window.end()  # again at each line: the span ends with the last result
        _, status, usage = os.wait4(process.pid, 0)
        process.returncode = os.waitstatus_to_exitcode(status)
        if process.returncode != 0 or len(lines) <= warmup:
            errors.seek(0)
            tail = errors.read().decode(errors="replace")[-3000:]
            raise ProgramFailed(f"{program} exited {process.returncode} after {len(lines)} result(s):\n{tail}")
    steady = len(lines) - warmup
    parsed = [json.loads(raw) for raw in lines]
    return Run(program, len(lines), steady / window.wall, window.cpu / steady * 1e3, usage.ru_maxrss / 1024,
               first or 0.0, window.foreign_cores, [_boxes(program, line) for line in parsed], delegate)


# ----------------------------------------------------------------------------------------------- the bench
@dataclass(frozen=True)
class Case:
    model: str  # a key of MODELS
    threads: int
    codec: str

    @property
    def title(self) -> str:
        return f"{MODELS[self.model][0]}, {self.threads} thread{'s' if self.threads > 1 else ''}, {self.codec}"


def agreement(reference: list[list[Box]], candidate: list[list[Box]]) -> dict:
    """The candidate's boxes against the reference's, frame by frame, at Ultralytics' score threshold."""
    frames = min(len(reference), len(candidate))
    found = box_agreement([f"frame {i}" for i in range(frames)], reference[:frames], candidate[:frames],
                          score_threshold=THRESHOLDS["conf"])
    return {"frames": frames, "reference_boxes": found.reference_boxes, "candidate_boxes": found.candidate_boxes,
            "recall": found.recall, "precision": found.precision, "mean_iou": found.mean_iou,
            "frames_differing": sum(not row.agrees for row in found.per_image)}


def _spread(values: list[float]) -> dict:
    return {"median": statistics.median(values), "min": min(values), "max": max(values),
            "all": [round(v, 4) for v in values]}


def bench_case(case: Case, programs: list[str], rounds: int, frames: int, warmup: int,
               ultralytics_python: Path, log, quiet_wait: float = 0.0, cache: Path = CACHE) -> dict:
    """``rounds`` rounds of every program over the case's clip, the order rotating from round to round."""
    model_file, task = MODELS[case.model]
    model = ASSETS / "models" / model_file
    clip = bench_clip(case.codec, warmup + frames, cache=cache)
    log(f"\n== {case.title}  (clip {clip.name}: {warmup} + {frames} frames)")
    runs: dict[str, list[Run]] = {name: [] for name in programs}
    failed: dict[str, str] = {}
    for index in range(rounds):
        order = programs[index % len(programs):] + programs[:index % len(programs)]
        line = []
        for name in order:
            if name in failed:
                continue
            if quiet_wait:
                wait_quiet(quiet_wait)
            command = program_command(name, model, task, clip, case.threads, ultralytics_python, warmup + frames)
            try:
                run = run_program(name, command, warmup)
            except ProgramFailed as exc:
                if name != "ultralytics":
                    raise
                failed[name] = str(exc)
                log(f"   {exc}")
                continue
            runs[name].append(run)
            line.append(f"{name} {run.fps:5.2f}/s {run.cpu_ms_per_frame:6.1f} ms CPU "
                        f"(other load {run.other_load_cores:.1f})")
        log(f"   round {index + 1}: " + ", ".join(line))
    result: dict = {"case": case.title, "model": model_file, "task": task, "threads": case.threads,
                    "codec": case.codec, "clip": clip.name, "frames": frames, "warmup": warmup, "rounds": rounds,
                    "programs": {}, "ratios": {}, "agreement": {}, "failed": failed}
    for name, done in runs.items():
        if not done:
            continue
        result["programs"][name] = {
            key: statistics.median(getattr(r, key) for r in done)
            for key in ("fps", "cpu_ms_per_frame", "rss_mib", "first_result_s", "other_load_cores")}
        result["programs"][name]["fps_all"] = [round(r.fps, 3) for r in done]
        result["programs"][name]["cpu_ms_per_frame_all"] = [round(r.cpu_ms_per_frame, 1) for r in done]
        delegates = sorted({r.delegate for r in done if r.delegate})
        if delegates:
            result["programs"][name]["delegates"] = delegates
    for edge_name, peers in (("edgeinfer", ("plain", "ultralytics", "runtime")), ("chosen", ("ultralytics", "plain")),
                             ("runtime", ("plain", "ultralytics"))):
        for peer in peers:
            pairs = list(zip(runs.get(edge_name, []), runs.get(peer, [])))  # the same rounds
            if pairs:
                result["ratios"][f"{edge_name} / {peer}"] = _spread([e.fps / p.fps for e, p in pairs])
    reference = "ultralytics" if runs.get("ultralytics") else "plain"
    for name in ("edgeinfer", "chosen", "plain"):
        if name != reference and runs.get(name) and runs.get(reference):
            result["agreement"][f"{name} vs {reference}"] = agreement(runs[reference][0].boxes, runs[name][0].boxes)
    return result


# ----------------------------------------------------------------------------------------------- the report
def _fmt(value: float | None, spec: str) -> str:
    return "—" if value is None else format(value, spec)


def _figures(result: dict, key: str, spec: str) -> str:
    return " / ".join(_fmt(result["programs"].get(p, {}).get(key), spec) for p in PROGRAMS)


def _ratio(result: dict, peer: str, program: str = "edgeinfer", goal: float | None = GOAL_RATIO) -> str:
    """A ratio's median (min–max) over the rounds, and its verdict against ``goal`` (None: a figure, no goal)."""
    spread = result["ratios"].get(f"{program} / {peer}")
    if spread is None:
        return "—"
    figures = f"{spread['median']:.2f}x ({spread['min']:.2f}–{spread['max']:.2f})"
    return figures if goal is None else f"{figures} {verdict(spread, goal)}"


def verdict(spread: dict, goal: float = GOAL_RATIO) -> str:
    """Against ``goal``: met by every round, missed by every round, or not settled (the rounds straddle it: the
    median says which way it leans)."""
    if spread["min"] >= goal:
        return "met"
    if spread["max"] < goal:
        return "**missed**"
    return f"**not settled** (median {'above' if spread['median'] >= goal else 'below'})"


def _chosen(result: dict) -> str:
    """The runtime the probe chose and its ratio over Ultralytics (goal GOAL_CHOSEN_RATIO)."""
    runs = result["programs"].get("chosen")
    if not runs:
        return "—"
    return (f"{', '.join(runs.get('delegates', ['?']))}: "
            f"{_ratio(result, 'ultralytics', 'chosen', GOAL_CHOSEN_RATIO)}")


def _cpu_ratio(result: dict) -> str:
    """edgeinfer's CPU per frame over each peer's, median (min–max) of the rounds (below 1: edgeinfer spends
    less): steadier than fps on a shared machine, where the others' load moves wall time more than CPU time."""
    parts = []
    edge = result["programs"].get("edgeinfer", {}).get("cpu_ms_per_frame_all", [])
    for peer, short in (("plain", "p"), ("ultralytics", "U")):
        other = result["programs"].get(peer, {}).get("cpu_ms_per_frame_all", [])
        ratios = [e / o for e, o in zip(edge, other) if o]
        if ratios:
            parts.append(f"÷ {short} {statistics.median(ratios):.2f} ({min(ratios):.2f}–{max(ratios):.2f})")
    return ", ".join(parts) or "—"


def _agreement(result: dict) -> str:
    parts = []
    for label, found in result["agreement"].items():
        if found["recall"] is None or found["precision"] is None:
            parts.append(f"{label}: no boxes")
            continue
        verdict = "met" if min(found["recall"], found["precision"]) >= GOAL_AGREEMENT else "**missed**"
        figures = f"{label}: {found['recall']:.1%} / {found['precision']:.1%}"
        parts.append(f"{figures} {verdict}" if label.startswith(EDGEINFER_PROGRAMS) else figures)
    return "; ".join(parts) or "—"


def report(results: list[dict], log) -> None:
    """The table (Markdown, as docs/benchmarks.md has it)."""
    log("\n== summary: medians over the rounds; ratios of steady fps, median (min–max) of the rounds, goal "
        f">= {GOAL_RATIO}x met when every round meets it; boxes: recall / precision against the reference, goal "
        f">= {GOAL_AGREEMENT:.0%}\n")
    log("| model, threads, codec | steady fps p / e / U / c / r | edgeinfer ÷ plain | "
        "edgeinfer ÷ Ultralytics | the chosen runtime ÷ Ultralytics (goal 2x) | "
        "the ceiling: the runtime alone ÷ plain, ÷ Ultralytics | edgeinfer ÷ the runtime alone | "
        "CPU ms/frame p / e / U / c / r | edgeinfer's CPU/frame | peak RSS MiB p / e / U / c / r | "
        "first result s p / e / U / c / r | boxes (recall / precision) | other load, cores |")
    log("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for result in results:
        load = statistics.median(p["other_load_cores"] for p in result["programs"].values())
        log(f"| {result['case']} | {_figures(result, 'fps', '.2f')} | {_ratio(result, 'plain')} | "
            f"{_ratio(result, 'ultralytics')} | {_chosen(result)} | "
            f"{_ratio(result, 'plain', 'runtime', None)}, {_ratio(result, 'ultralytics', 'runtime', None)} | "
            f"{_ratio(result, 'runtime', 'edgeinfer', None)} | {_figures(result, 'cpu_ms_per_frame', '.0f')} | "
            f"{_cpu_ratio(result)} | "
            f"{_figures(result, 'rss_mib', '.0f')} | {_figures(result, 'first_result_s', '.1f')} | "
            f"{_agreement(result)} | {load:.1f} |")
    for result in results:
        for name, reason in result["failed"].items():
            log(f"\n{result['case']}: {name} failed: {reason.splitlines()[0]}")


# ------------------------------------------------------------------------------ the Ultralytics environment
ULTRALYTICS_VERSION = "8.4.190"  # the release the shared assets' references were made with
#: PyTorch for Ultralytics' pre- and postprocessing and NMS (torchvision's): on x86_64 PyPI has these as a
#: CUDA build (about 5.5 GB installed; it runs on the CPU)
TORCH = ("torch==2.14.1", "torchvision==0.29.1")
#: what Ultralytics imports besides torch, onnxruntime, numpy and OpenCV (installed with --no-deps after these)
ULTRALYTICS_DEPS = ("matplotlib", "pyyaml", "requests", "psutil", "polars", "ultralytics-thop")
#: where --setup-ultralytics puts it and the bench looks for it unless told
DEFAULT_ULTRALYTICS_PYTHON = Path(os.environ.get("EDGEINFER_ULTRALYTICS_PYTHON")
                                  or CACHE / "ultralytics-venv" / "bin" / "python")


def setup_ultralytics(venv: Path, log) -> int:
    """Make the bench-only environment: torch, then the project's own ONNX Runtime, numpy and OpenCV releases
    (the same runtime as edgeinfer and the plain loop), then Ultralytics without its dependencies (it would ask
    for opencv-python beside the headless build)."""
    from importlib.metadata import version

    same = [f"{name}=={version(name)}" for name in ("onnxruntime", "onnx", "numpy", "opencv-python-headless")]
    python = str(venv / "bin" / "python")
    steps = [[sys.executable, "-m", "venv", str(venv)],
             [python, "-m", "pip", "install", "-q", *TORCH],
             [python, "-m", "pip", "install", "-q", *same, *ULTRALYTICS_DEPS],
             [python, "-m", "pip", "install", "-q", "--no-deps", f"ultralytics=={ULTRALYTICS_VERSION}"]]
    for step in steps:
        log("$ " + " ".join(step))
        if subprocess.call(step) != 0:
            log("failed: the bench runs without Ultralytics (it says so) until this works")
            return 1
    log(f"done: {python} (run the bench with --ultralytics-python {python} if it is not the default)")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="pose,fall", help=f"of {', '.join(MODELS)}")
    parser.add_argument("--threads", default="1,2", help="intra-op thread counts, e.g. 1,2")
    parser.add_argument("--codecs", default="h264,mjpeg", help=f"of {', '.join(CODECS)}")
    parser.add_argument("--programs", default=",".join(PROGRAMS), help=f"of {', '.join(PROGRAMS)}")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--frames", default="150",
                        help="measured frames per run (after the warm-up); per model as pose=150,fall=60")
    parser.add_argument("--warmup", type=int, default=15, help="results before the measured span")
    parser.add_argument("--ultralytics-python", type=Path, default=DEFAULT_ULTRALYTICS_PYTHON,
                        help="the bench-only environment's python (default: $EDGEINFER_ULTRALYTICS_PYTHON, else "
                             "%(default)s)")
    parser.add_argument("--setup-ultralytics", action="store_true",
                        help="make the environment --ultralytics-python names (its venv), then exit")
    parser.add_argument("--wait-quiet", type=float, default=0.0, metavar="S",
                        help="before each run wait up to S seconds for the rest of the machine to calm down")
    parser.add_argument("--cache", type=Path, default=CACHE, help="the clips go to CACHE/clips (%(default)s)")
    parser.add_argument("--json", type=Path, help="write the results here")
    parser.add_argument("--report", type=Path, nargs="+", metavar="JSON",
                        help="print the table of earlier runs' --json files (one table), run nothing")
    args = parser.parse_args()

    def log(text: str) -> None:
        print(text, flush=True)

    if args.setup_ultralytics:
        return setup_ultralytics(args.ultralytics_python.parent.parent, log)
    if args.report:
        report([case for path in args.report for case in json.loads(path.read_text())], log)
        return 0
    programs = [p for p in PROGRAMS if p in args.programs.split(",")]
    if "ultralytics" in programs and not args.ultralytics_python.exists():
        log(f"Ultralytics left out: no {args.ultralytics_python} (make it with --setup-ultralytics); "
            "box agreement is then against the plain loop")
        programs.remove("ultralytics")
    frames = {m: int(n) for m, n in (part.split("=") for part in args.frames.split(",") if "=" in part)}
    default_frames = next((int(part) for part in args.frames.split(",") if "=" not in part), 150)
    cases = [Case(m, int(t), c) for m in args.models.split(",") for t in args.threads.split(",")
             for c in args.codecs.split(",")]
    for case in cases:
        if case.model not in MODELS or case.codec not in CODECS or case.threads < 1:
            parser.error(f"unknown model, codec or thread count in {case}")
    log(f"edgeinfer peers benchmark — {os.cpu_count()} cores, load average {os.getloadavg()}, "
        f"OpenCV {cv2.__version__}, numpy {np.__version__}; programs {', '.join(programs)}")
    results = []
    for case in cases:
        results.append(bench_case(case, programs, args.rounds, frames.get(case.model, default_frames), args.warmup,
                                  args.ultralytics_python, log, args.wait_quiet, args.cache))
        if args.json:  # after each case: a long run stopped early keeps what it measured
            args.json.write_text(json.dumps(results, indent=2))
    report(results, log)
    return 0


if __name__ == "__main__":
    sys.exit(main())

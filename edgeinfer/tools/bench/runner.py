"""``edgeinfer bench``: every delegate side by side, in one run.

Each (model, delegate) target gets its own worker process (:mod:`edgeinfer._bench_worker`):

- **cold start**: the worker is fresh, so its load is engine creation (runtime import, model
  parse, compile) to the first result; also measured from process spawn. For OpenVINO the cold
  start is measured again in two more fresh processes with a model cache dir, first empty (it is
  filled) and then warm — what a device sees on its second boot.
- **latency / throughput / CPU time**: the workers are driven in rounds; in each round every
  target runs for the same wall time, in an order that rotates, so a burst of load from elsewhere
  on the machine hits all targets alike. Each timed iteration is what an application does per
  frame: write the input view, ``invoke()``, copy the outputs out.
- **peak RSS** is the worker's own high-water mark: runtime + model + Python, per delegate.

The same number of threads is given to every delegate.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import platform
import select
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import IO, Any

from ...errors import BenchmarkError, EdgeInferError, MissingDependency, NoDelegateAvailable, OutputError
from ...runtime.model import ModelInfo, inspect_model
from ..timing import summarize

DEFAULT_SECONDS = 5.0
DEFAULT_ROUNDS = 5
#: worker start + model load may take this long before we call the worker hung
LOAD_TIMEOUT_S = 180.0
WORKER_MODULE = "edgeinfer.tools.bench.worker"

Progress = Callable[[str], None]


@dataclass(frozen=True)
class BenchResult:
    """The figures of one (model, delegate) target."""

    model: str
    format: str
    delegate: str
    description: str
    threads: int
    cold_start_ms: float
    process_start_ms: float
    cold_start_empty_cache_ms: float | None
    cold_start_warm_cache_ms: float | None
    load_ms: float
    first_inference_ms: float
    latency_ms: dict[str, float]
    throughput_ips: float
    cpu_ms_per_inference: float
    cpu_utilization: float
    peak_rss_mb: float
    runtime_rss_mb: float
    inferences: int

    @property
    def label(self) -> str:
        return f"{Path(self.model).name} · {self.delegate}"


@dataclass(frozen=True)
class BenchReport:
    """Every target's figures, what was skipped and why, and how it was measured."""

    results: tuple[BenchResult, ...]
    skipped: tuple[dict[str, str], ...]
    seconds: float
    rounds: int
    threads: int
    machine: dict[str, Any]
    pipeline: tuple[dict[str, Any], ...] | None = None
    notes: tuple[str, ...] = field(default=())

    def to_dict(self) -> dict:
        """JSON-ready form (schema version 1)."""
        data = asdict(self)
        data["version"] = 1
        return data


def machine_info() -> dict[str, Any]:
    """What ran the benchmark: CPU, core count, OS, Python."""
    model_name = platform.processor() or platform.machine()
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as fh:
        for line in fh:
            if line.startswith("model name"):
                model_name = line.split(":", 1)[1].strip()
                break
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    return {"cpu": model_name, "cpu_count": os.cpu_count(), "system": f"{platform.system()} {platform.release()}",
            "machine": platform.machine(), "python": platform.python_version(),
            "load_average_1m": round(load, 2) if load is not None else None}


# ------------------------------------------------------------------------------------ targets

@dataclass(frozen=True)
class Target:
    """One model on one delegate (``name`` or ``name:device``)."""

    model: ModelInfo
    delegate: str


def plan_targets(models: Sequence[str | os.PathLike], delegates: Sequence[str] | None = None
                 ) -> tuple[list[Target], list[dict[str, str]]]:
    """Pair every model with every delegate that can read it here; the rest are skipped with a reason.

    ``delegates`` None means every registered delegate. A delegate name that is not registered is
    a ValueError (a typo, not a machine property).
    """
    from ...runtime.delegates.registry import delegate_names, get_delegate, split_delegate

    infos = [inspect_model(m) for m in models]
    names = list(delegates) if delegates else delegate_names()
    targets: list[Target] = []
    skipped: list[dict[str, str]] = []
    for spec in names:
        name, device = split_delegate(spec)
        delegate = get_delegate(name)  # ValueError for an unknown name
        unavailable: list[str | None] = []  # asked once per delegate, only if some model fits it
        for info in infos:
            reason = delegate.unsupported_reason(info)
            if reason is None:
                if not unavailable:
                    unavailable.append(delegate.unavailable_reason(device))
                reason = unavailable[0]
            if reason:
                skipped.append({"model": info.path, "delegate": spec, "reason": reason})
            else:
                targets.append(Target(info, spec))
    return targets, skipped


# ------------------------------------------------------------------------------------ workers

class Worker:
    """A ``_bench_worker`` subprocess speaking JSON lines. Idempotent close(); a context manager."""

    def __init__(self, *, env: dict[str, str] | None = None) -> None:
        self._stderr: IO[bytes] = tempfile.TemporaryFile()  # noqa: SIM115 - closed in close()
        #: wall-clock time of the spawn; the worker reports its first result in the same clock
        self.spawned_at = time.time()
        self._proc = subprocess.Popen(
            [sys.executable, "-m", WORKER_MODULE], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=self._stderr, env=env, text=True, bufsize=1,
        )
        self._closed = False

    def request(self, command: dict, timeout: float) -> dict:
        """Send one command, wait for its reply; BenchmarkError if the worker dies or hangs."""
        if self._closed:
            raise BenchmarkError("benchmark worker already closed")
        proc = self._proc
        try:
            proc.stdin.write(json.dumps(command) + "\n")
            proc.stdin.flush()
        except (BrokenPipeError, OSError):
            raise BenchmarkError(f"benchmark worker died: {self.stderr_tail()}") from None
        ready, _, _ = select.select([proc.stdout], [], [], timeout)
        if not ready:
            self.close()
            raise BenchmarkError(f"benchmark worker did not answer {command['op']!r} within {timeout:.0f} s")
        line = proc.stdout.readline()
        if not line:
            proc.wait(timeout=5)
            raise BenchmarkError(f"benchmark worker exited ({proc.returncode}): {self.stderr_tail()}")
        return json.loads(line)

    def stderr_tail(self) -> str:
        """The last line the worker wrote to stderr (for error messages)."""
        with contextlib.suppress(OSError, ValueError):
            self._stderr.seek(0)
            lines = [ln.strip() for ln in self._stderr.read().decode("utf-8", "replace").splitlines() if ln.strip()]
            return lines[-1] if lines else "(no output)"
        return "(no output)"

    def close(self) -> None:
        """Ask the worker to quit; kill it if it does not. Idempotent."""
        if self._closed:
            return
        self._closed = True
        proc = self._proc
        with contextlib.suppress(OSError, ValueError):
            proc.stdin.write(json.dumps({"op": "quit"}) + "\n")
            proc.stdin.flush()
        with contextlib.suppress(OSError, ValueError):
            proc.stdin.close()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
        with contextlib.suppress(OSError, ValueError):
            proc.stdout.close()
        self._stderr.close()

    def __enter__(self) -> Worker:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def _raise_remote(reply: dict, target: Target) -> None:
    """Re-raise a worker's failure as the edgeinfer error of the same name (BenchmarkError otherwise)."""
    from ... import errors

    if reply.get("ok"):
        return
    message = f"{Path(target.model.path).name} on {target.delegate}: {reply.get('message', '')}"
    kind = getattr(errors, str(reply.get("error")), None)
    if isinstance(kind, type) and issubclass(kind, EdgeInferError):
        try:
            error = kind(message)
        except TypeError:  # an error class that takes structured arguments
            error = BenchmarkError(message)
        raise error
    raise BenchmarkError(message)


def _cold_start(target: Target, threads: int, cache_dir: str | None) -> float:
    """Engine creation to first result in a fresh process (ms)."""
    with Worker() as worker:
        reply = worker.request({"op": "load", "model": target.model.path, "delegate": target.delegate,
                                "threads": threads, "cache_dir": cache_dir, "warmup_s": 0.0}, LOAD_TIMEOUT_S)
        _raise_remote(reply, target)
        return float(reply["cold_ms"])


# ------------------------------------------------------------------------------------ main

def run_benchmark(
    models: Sequence[str | os.PathLike],
    delegates: Sequence[str] | None = None,
    *,
    seconds: float = DEFAULT_SECONDS,
    threads: int | None = None,
    rounds: int = DEFAULT_ROUNDS,
    progress: Progress | None = None,
    source: str | int | None = None,
    task: str = "classify",
) -> BenchReport:
    """Benchmark every (model, delegate) pair that can run here, side by side, in one run.

    ``seconds`` is the measured time per target, split over ``rounds`` interleaved rounds. With
    ``source``, each target's engine then also runs inside a whole :class:`~edgeinfer.pipeline.Pipeline`
    (``task``) on that source for as long, and per-stage timings are reported.
    Raises NoDelegateAvailable when nothing can run, BenchmarkError when a worker fails.
    """
    if seconds <= 0:
        raise ValueError("seconds must be > 0")
    if rounds < 1:
        raise ValueError("rounds must be >= 1")
    say = progress or (lambda _message: None)
    threads = threads or os.cpu_count() or 1
    if source is not None:
        _check_source(source)
    targets, skipped = plan_targets(models, delegates)
    if not targets:
        raise NoDelegateAvailable(", ".join(Path(m).name for m in models),
                                  {f"{s['delegate']} ({Path(s['model']).name})": s["reason"] for s in skipped}
                                  or {"(none)": "no delegate given"})
    workers: list[Worker] = []
    loads: list[dict] = []
    process_ms: list[float] = []
    try:
        for number, target in enumerate(targets, 1):
            say(f"cold start {number}/{len(targets)}: {Path(target.model.path).name} on {target.delegate}")
            worker = Worker()
            workers.append(worker)
            reply = worker.request({"op": "load", "model": target.model.path, "delegate": target.delegate,
                                    "threads": threads, "cache_dir": None,
                                    "warmup_s": min(1.0, max(0.1, seconds / 10))}, LOAD_TIMEOUT_S)
            if not reply.get("ok"):
                worker.close()
                workers.pop()
                skipped.append({"model": target.model.path, "delegate": target.delegate,
                                "reason": f"failed to load: {reply.get('message')}"})
                continue
            process_ms.append((reply["first_at"] - worker.spawned_at) * 1000)  # spawn -> first result
            loads.append({"target": target, **reply})
        if not loads:
            raise NoDelegateAvailable(", ".join(Path(m).name for m in models),
                                      {f"{s['delegate']} ({Path(s['model']).name})": s["reason"] for s in skipped})
        cached: dict[int, tuple[float, float]] = {}
        for index, entry in enumerate(loads):
            target = entry["target"]
            if target.delegate.split(":")[0] != "openvino":
                continue
            say(f"cold start with a model cache: {Path(target.model.path).name} on {target.delegate}")
            with tempfile.TemporaryDirectory(prefix="edgeinfer-ov-cache-") as cache_dir:
                empty = _cold_start(target, threads, cache_dir)
                warm = _cold_start(target, threads, cache_dir)
            cached[index] = (empty, warm)
        latencies: list[list[float]] = [[] for _ in loads]
        wall = [0.0 for _ in loads]
        cpu = [0.0 for _ in loads]
        block = seconds / rounds
        for round_index in range(rounds):
            shift = round_index % len(loads)
            order = list(range(len(loads)))[shift:] + list(range(len(loads)))[:shift]
            for index in order:
                reply = workers[index].request({"op": "run", "seconds": block}, block * 20 + 60)
                _raise_remote(reply, loads[index]["target"])
                latencies[index].extend(reply["latencies_ms"])
                wall[index] += reply["wall_s"]
                cpu[index] += reply["cpu_s"]
            say(f"measuring: round {round_index + 1}/{rounds}")
        peaks = []  # before any pipeline run, whose frame buffers would count too
        for index, entry in enumerate(loads):
            stats = workers[index].request({"op": "stats"}, 30)
            _raise_remote(stats, entry["target"])
            peaks.append(stats)
        pipeline = None
        if source is not None:
            pipeline = _pipeline_rounds(workers, [entry["target"] for entry in loads], source, task, seconds, rounds,
                                        say)
        results = []
        for index, entry in enumerate(loads):
            stats = peaks[index]
            target: Target = entry["target"]
            count = len(latencies[index])
            empty, warm = cached.get(index, (None, None))
            results.append(BenchResult(
                model=target.model.path, format=target.model.format.value, delegate=target.delegate,
                description=entry["description"], threads=threads,
                cold_start_ms=round(entry["cold_ms"], 2), process_start_ms=round(process_ms[index], 1),
                cold_start_empty_cache_ms=None if empty is None else round(empty, 2),
                cold_start_warm_cache_ms=None if warm is None else round(warm, 2),
                load_ms=round(entry["load_ms"], 2), first_inference_ms=round(entry["first_ms"], 3),
                latency_ms=summarize(latencies[index]),
                throughput_ips=round(count / wall[index], 2) if wall[index] else 0.0,
                cpu_ms_per_inference=round(cpu[index] * 1000 / count, 3) if count else 0.0,
                cpu_utilization=round(cpu[index] / wall[index], 2) if wall[index] else 0.0,
                peak_rss_mb=stats["peak_rss_mb"],
                runtime_rss_mb=round(stats["peak_rss_mb"] - entry["rss_before_mb"], 2),
                inferences=count,
            ))
    finally:
        for worker in workers:
            worker.close()
    notes = []
    if any(r.delegate.startswith("openvino") for r in results) and _cpu_has_bf16():
        notes.append("this CPU has bfloat16 instructions: OpenVINO runs float layers in bf16 by default "
                     "(faster, slightly different scores)")
    return BenchReport(results=tuple(results), skipped=tuple(skipped), seconds=seconds, rounds=rounds,
                       threads=threads, machine=machine_info(), pipeline=pipeline, notes=tuple(notes))


#: per-frame stages of ``--source`` runs (edgeinfer.pipeline.StageTimings)
PIPELINE_STAGES = ("capture", "preprocess", "infer", "postprocess", "latency")


def _pipeline_rounds(workers: Sequence[Worker], targets: Sequence[Target], source: str | int, task: str,
                     seconds: float, rounds: int, say: Progress) -> tuple[dict[str, Any], ...]:
    """Each target's engine inside a whole Pipeline on ``source``, interleaved in rounds like the engines."""
    stages: list[dict[str, list[float]]] = [{stage: [] for stage in PIPELINE_STAGES} for _ in targets]
    frames = [0] * len(targets)
    dropped = [0] * len(targets)
    elapsed = [0.0] * len(targets)
    cpu = [0.0] * len(targets)
    block = seconds / rounds
    for round_index in range(rounds):
        shift = round_index % len(targets)
        order = list(range(len(targets)))[shift:] + list(range(len(targets)))[:shift]
        for index in order:
            reply = workers[index].request({"op": "pipeline", "source": source, "task": task, "seconds": block},
                                           block * 20 + 120)
            _raise_remote(reply, targets[index])
            for stage in PIPELINE_STAGES:
                stages[index][stage].extend(reply["stages"].get(stage, ()))
            frames[index] += reply["frames"]
            dropped[index] += reply["dropped"]
            elapsed[index] += reply["elapsed_s"]
            cpu[index] += reply["cpu_s"]
        say(f"pipeline: round {round_index + 1}/{rounds}")
    rows = []
    for index, target in enumerate(targets):
        rows.append({
            "label": f"{Path(target.model.path).name} · {target.delegate}", "model": target.model.path,
            "delegate": target.delegate, "source": str(source), "task": task, "frames": frames[index],
            "dropped": dropped[index], "fps": round(frames[index] / elapsed[index], 2) if elapsed[index] else 0.0,
            "cpu_utilization": round(cpu[index] / elapsed[index], 2) if elapsed[index] else 0.0,
            "stages": {stage: summarize(values) for stage, values in stages[index].items()},
        })
    return tuple(rows)


def _cpu_has_bf16() -> bool:
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as fh:
        for line in fh:
            if line.startswith("flags"):
                flags = set(line.split(":", 1)[1].split())
                return bool(flags & {"avx512_bf16", "amx_bf16"})
    return False


def _check_source(source: str | int) -> None:
    """Fail before the run if the source cannot be opened (CaptureError now, not in a worker later)."""
    from ...capture import open_source

    open_source(source, loop=True).close()


# ------------------------------------------------------------------------------------ output

def check_plot_path(path: str | os.PathLike) -> Path:
    """Fail before a long run if matplotlib is missing or the chart cannot be written."""
    target = Path(path)
    try:
        import matplotlib  # noqa: F401
    except ImportError as exc:
        raise MissingDependency(
            f"--plot needs matplotlib ({exc}) — pip install 'edgeinfer[plot]'"
        ) from exc
    if target.is_dir():
        raise OutputError(f"cannot write the chart to {target}: it is a folder — give a file name ending in .png")
    if target.suffix.lower() != ".png":
        raise ValueError(f"--plot writes a PNG; give a file name ending in .png, not {target.name!r}")
    if not target.parent.is_dir():
        raise OutputError(f"cannot write the chart to {target}: folder {target.parent} does not exist")
    if not os.access(target.parent, os.W_OK):
        raise OutputError(f"cannot write the chart to {target}: folder {target.parent} is not writable")
    return target


def plot_report(report: BenchReport, path: str | os.PathLike) -> Path:
    """Write a PNG chart of ``report``: latency percentiles, throughput, CPU time, cold start, peak RSS."""
    target = check_plot_path(path)
    import matplotlib

    matplotlib.use("Agg")
    import textwrap

    import matplotlib.pyplot as plt

    results = report.results
    labels = [f"{r.description}\n" + textwrap.fill(Path(r.model).name, 20) for r in results]
    x = list(range(len(results)))
    fig, axes = plt.subplots(2, 3, figsize=(max(12.0, 3.2 * len(results) + 4), 8.5))
    (lat, thr, cpu), (cold, mem, text) = axes
    width = 0.27
    for offset, key in ((-width, "p50"), (0.0, "p95"), (width, "p99")):
        lat.bar([i + offset for i in x], [r.latency_ms[key] for r in results], width, label=key)
    lat.set_title("latency per inference (ms)")
    lat.legend(fontsize=8)
    thr.bar(x, [r.throughput_ips for r in results], 0.6, color="tab:green")
    thr.set_title("throughput, one stream (inferences/s)")
    cpu.bar(x, [r.cpu_ms_per_inference for r in results], 0.6, color="tab:purple", label="CPU time")
    cpu.scatter(x, [r.latency_ms["p50"] for r in results], color="black", marker="_", s=600, zorder=3,
                label="p50 wall time")
    cpu.set_title("CPU time per inference (ms, all threads)")
    cpu.legend(fontsize=8)
    cold.bar([i - width / 2 for i in x], [r.cold_start_ms for r in results], width, label="fresh process")
    cold.bar([i + width / 2 for i in x], [r.cold_start_warm_cache_ms or 0.0 for r in results], width,
             label="warm model cache (OpenVINO)")
    cold.set_title("cold start: engine load to first result (ms)")
    cold.legend(fontsize=8)
    mem.bar(x, [r.peak_rss_mb for r in results], 0.6, color="tab:red")
    mem.set_title("peak RSS of the process (MB)")
    for ax in (lat, thr, cpu, cold, mem):
        ax.set_xticks(x)
        ax.set_xticklabels(labels, fontsize=7)
        ax.grid(axis="y", alpha=0.3)
    lines = [f"{report.threads} threads per delegate, {report.seconds:g} s per target, "
             f"{report.rounds} interleaved rounds"]
    lines += [textwrap.fill(f"note: {note}", 70) for note in report.notes]
    lines += [f"skipped {item['delegate']} / {Path(item['model']).name}" for item in report.skipped]
    if report.pipeline:
        rows = report.pipeline
        px = list(range(len(rows)))
        bottom = [0.0] * len(rows)
        for stage in PIPELINE_STAGES[:-1]:
            values = [row["stages"][stage]["p50"] for row in rows]
            text.bar(px, values, 0.6, bottom=bottom, label=stage)
            bottom = [b + v for b, v in zip(bottom, values)]
        for i, row in enumerate(rows):
            text.annotate(f"{row['fps']:.0f} fps", (i, bottom[i]), ha="center", va="bottom", fontsize=7)
        text.set_title(f"pipeline on {textwrap.shorten(str(rows[0]['source']), 30)}: stage p50 (ms)")
        text.set_xticks(px)
        text.set_xticklabels([f"{row['delegate']}\n" + textwrap.fill(Path(row["model"]).name, 20) for row in rows],
                             fontsize=7)
        text.set_ylim(0, max(bottom) * 1.4 if max(bottom) > 0 else 1)
        text.legend(fontsize=7, ncol=2, loc="upper left")
        text.grid(axis="y", alpha=0.3)
        fig.text(0.01, 0.005, "  |  ".join(line.replace("\n", " ") for line in lines[:2]), fontsize=7,
                 family="monospace", va="bottom")
    else:
        text.axis("off")
        text.text(0.0, 1.0, "\n".join(lines), va="top", ha="left", fontsize=7, family="monospace",
                  transform=text.transAxes)
    machine = report.machine
    fig.suptitle(f"edgeinfer bench — {machine.get('cpu')} ({machine.get('cpu_count')} cores), "
                 f"{report.threads} threads, {report.seconds:g} s per target in {report.rounds} rounds", fontsize=10)
    fig.tight_layout(rect=(0, 0.025, 1, 1))
    temp = target.with_name(f".{target.stem}.{os.getpid()}.tmp.png")
    try:
        fig.savefig(temp, format="png", dpi=110)
        os.replace(temp, target)
    except OSError as exc:
        raise OutputError(f"cannot write the chart to {target}: {exc}") from exc
    finally:
        plt.close(fig)
        with contextlib.suppress(OSError):
            temp.unlink()
    return target


def format_table(report: BenchReport) -> str:
    """The table for people."""
    head = (f"{'model':<34} {'delegate':<14} {'cold ms':>8} {'cached':>8} {'p50 ms':>8} {'p95 ms':>8} "
            f"{'p99 ms':>8} {'inf/s':>8} {'cpu ms/inf':>10} {'peak MB':>8}")
    lines = [head, "-" * len(head)]
    for r in report.results:
        cached = f"{r.cold_start_warm_cache_ms:.1f}" if r.cold_start_warm_cache_ms is not None else "-"
        lat = r.latency_ms
        lines.append(
            f"{Path(r.model).name[:34]:<34} {r.description[:14]:<14} {r.cold_start_ms:>8.1f} {cached:>8} "
            f"{lat['p50']:>8.3f} {lat['p95']:>8.3f} {lat['p99']:>8.3f} {r.throughput_ips:>8.1f} "
            f"{r.cpu_ms_per_inference:>10.3f} {r.peak_rss_mb:>8.1f}"
        )
    lines.append("")
    lines.append(f"{report.threads} threads per delegate; {report.seconds:g} s measured per target in "
                 f"{report.rounds} interleaved rounds; cold = engine load to first result in a fresh process, "
                 "cached = the same with a warm OpenVINO model cache")
    grouped: dict[tuple[str, str], list[str]] = {}
    for item in report.skipped:
        grouped.setdefault((item["delegate"], item["reason"]), []).append(Path(item["model"]).name)
    for (delegate, reason), names in grouped.items():
        lines.append(f"skipped {delegate} for {', '.join(names)}: {reason}")
    for note in report.notes:
        lines.append(f"note: {note}")
    return "\n".join(lines)


def format_pipeline_table(report: BenchReport) -> str:
    """Per-stage pipeline timings (ms) for each target, when ``--source`` was given."""
    stages = PIPELINE_STAGES
    head = f"{'pipeline (ms p50/p95)':<48} {'fps':>7} " + " ".join(f"{s:>20}" for s in stages)
    lines = [head, "-" * len(head)]
    for row in report.pipeline or ():
        cells = " ".join(
            f"{row['stages'].get(s, {}).get('p50', math.nan):.2f}/{row['stages'].get(s, {}).get('p95', math.nan):.2f}"
            .rjust(20)
            for s in stages
        )
        lines.append(f"{row['label'][:48]:<48} {row['fps']:>7.1f} {cells}")
    return "\n".join(lines)

"""``edgeinfer bench``: every delegate side by side, in one run.

Each (model, delegate) target gets its own worker process (:mod:`.worker`):

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
import os
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ...errors import NoDelegateAvailable
from ...pipeline.stats import STAGES
from ...runtime.timing import summarize
from .client import LOAD_TIMEOUT_S, Worker, cold_start, load_command, raise_remote
from .report import BenchReport, BenchResult, cpu_has_bf16, machine_info
from .targets import Target, plan_targets

DEFAULT_SECONDS = 5.0
DEFAULT_ROUNDS = 5

Progress = Callable[[str], None]


@dataclass
class _Measured:
    """One target whose worker has loaded it: the load figures, then what the timed rounds add up to."""

    target: Target
    worker: Worker
    load: dict[str, Any]  # the worker's reply to "load"
    process_start_ms: float
    latencies_ms: list[float] = field(default_factory=list)
    wall_s: float = 0.0
    cpu_s: float = 0.0


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
    task: str | None = None,
    decoder: str | None = None,
) -> BenchReport:
    """Benchmark every (model, delegate) pair that can run here, side by side, in one run.

    ``seconds`` is the measured time per target, split over ``rounds`` interleaved rounds. With
    ``source``, each target's engine then also runs inside a whole :class:`~edgeinfer.pipeline.Pipeline`
    (``task``; None: the task each model is read for; ``decoder``: the layout its outputs are read as, a built-in's
    or an installed plug-in's; None: chosen) on that source for as long, and per-stage timings are
    reported.
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
        raise _nothing_to_run(models, skipped)
    with contextlib.ExitStack() as workers:  # every worker is closed however the run ends
        measured = _load_targets(targets, threads, seconds, skipped, workers, say)
        if not measured:
            raise _nothing_to_run(models, skipped)
        cached = _cached_cold_starts(measured, threads, say)
        _measure_rounds(measured, seconds, rounds, say)
        peaks = [_peak_rss(entry) for entry in measured]  # before any pipeline run, whose frame buffers would count
        pipeline = None
        if source is not None:
            pipeline = _pipeline_rounds(measured, source, task, seconds, rounds, say, decoder)
    results = [_result(entry, threads, peaks[index], cached.get(index, (None, None)))
               for index, entry in enumerate(measured)]
    notes = []
    if any(r.delegate.startswith("openvino") for r in results) and cpu_has_bf16():
        notes.append("this CPU has bfloat16 instructions: OpenVINO runs float layers in bf16 by default "
                     "(faster, slightly different scores)")
    return BenchReport(results=tuple(results), skipped=tuple(skipped), seconds=seconds, rounds=rounds,
                       threads=threads, machine=machine_info(), pipeline=pipeline, notes=tuple(notes))


def _nothing_to_run(models: Sequence[str | os.PathLike], skipped: Sequence[dict[str, str]]) -> NoDelegateAvailable:
    """The error for a run where no target could be planned or loaded, with every reason."""
    return NoDelegateAvailable(", ".join(Path(m).name for m in models),
                               {f"{s['delegate']} ({Path(s['model']).name})": s["reason"] for s in skipped}
                               or {"(none)": "no delegate given"})


def _load_targets(targets: Sequence[Target], threads: int, seconds: float, skipped: list[dict[str, str]],
                  workers: contextlib.ExitStack, say: Progress) -> list[_Measured]:
    """One fresh worker per target, each loading its target (its cold start); failures go to ``skipped``."""
    measured = []
    for number, target in enumerate(targets, 1):
        say(f"cold start {number}/{len(targets)}: {Path(target.model.path).name} on {target.delegate}")
        worker = workers.enter_context(Worker())
        reply = worker.request(load_command(target, threads, None, min(1.0, max(0.1, seconds / 10))),
                               LOAD_TIMEOUT_S)
        if not reply.get("ok"):
            worker.close()
            skipped.append({"model": target.model.path, "delegate": target.delegate,
                            "reason": f"failed to load: {reply.get('message')}"})
            continue
        process_start_ms = (reply["first_at"] - worker.spawned_at) * 1000  # spawn -> first result
        measured.append(_Measured(target, worker, reply, process_start_ms))
    return measured


def _cached_cold_starts(measured: Sequence[_Measured], threads: int, say: Progress) -> dict[int, tuple[float, float]]:
    """OpenVINO targets: cold start in two more fresh processes with a model cache, empty then warm."""
    cached: dict[int, tuple[float, float]] = {}
    for index, entry in enumerate(measured):
        target = entry.target
        if target.delegate.split(":")[0] != "openvino":
            continue
        say(f"cold start with a model cache: {Path(target.model.path).name} on {target.delegate}")
        with tempfile.TemporaryDirectory(prefix="edgeinfer-ov-cache-") as cache_dir:
            empty = cold_start(target, threads, cache_dir)
            warm = cold_start(target, threads, cache_dir)
        cached[index] = (empty, warm)
    return cached


def _rotated(count: int, round_index: int) -> list[int]:
    """0..count-1 starting at ``round_index % count``: who goes first changes every round."""
    shift = round_index % count
    return list(range(count))[shift:] + list(range(count))[:shift]


def _measure_rounds(measured: Sequence[_Measured], seconds: float, rounds: int, say: Progress) -> None:
    """Every target runs ``seconds / rounds`` per round, in an order that rotates; the figures add up."""
    block = seconds / rounds
    for round_index in range(rounds):
        for index in _rotated(len(measured), round_index):
            entry = measured[index]
            reply = entry.worker.request({"op": "run", "seconds": block}, block * 20 + 60)
            raise_remote(reply, entry.target)
            entry.latencies_ms.extend(reply["latencies_ms"])
            entry.wall_s += reply["wall_s"]
            entry.cpu_s += reply["cpu_s"]
        say(f"measuring: round {round_index + 1}/{rounds}")


def _peak_rss(entry: _Measured) -> dict[str, Any]:
    """The worker's ``stats`` reply: its peak RSS so far."""
    stats = entry.worker.request({"op": "stats"}, 30)
    raise_remote(stats, entry.target)
    return stats


def _result(entry: _Measured, threads: int, stats: dict[str, Any],
            cached: tuple[float | None, float | None]) -> BenchResult:
    """One target's figures, rounded for the report."""
    target, load = entry.target, entry.load
    count = len(entry.latencies_ms)
    empty, warm = cached
    wall, cpu = entry.wall_s, entry.cpu_s
    return BenchResult(
        model=target.model.path, format=target.model.format.value, delegate=target.delegate,
        description=load["description"], threads=threads,
        cold_start_ms=round(load["cold_ms"], 2), process_start_ms=round(entry.process_start_ms, 1),
        cold_start_empty_cache_ms=None if empty is None else round(empty, 2),
        cold_start_warm_cache_ms=None if warm is None else round(warm, 2),
        load_ms=round(load["load_ms"], 2), first_inference_ms=round(load["first_ms"], 3),
        latency_ms=summarize(entry.latencies_ms),
        throughput_ips=round(count / wall, 2) if wall else 0.0,
        cpu_ms_per_inference=round(cpu * 1000 / count, 3) if count else 0.0,
        cpu_utilization=round(cpu / wall, 2) if wall else 0.0,
        peak_rss_mb=stats["peak_rss_mb"],
        runtime_rss_mb=round(stats["peak_rss_mb"] - load["rss_before_mb"], 2),
        inferences=count,
    )


# ------------------------------------------------------------------------------------ pipeline


def _pipeline_rounds(measured: Sequence[_Measured], source: str | int, task: str | None, seconds: float, rounds: int,
                     say: Progress, decoder: str | None = None) -> tuple[dict[str, Any], ...]:
    """Each target's engine inside a whole Pipeline on ``source``, interleaved in rounds like the engines."""
    targets = [entry.target for entry in measured]
    stages: list[dict[str, list[float]]] = [{stage: [] for stage in STAGES} for _ in targets]
    frames = [0] * len(targets)
    dropped = [0] * len(targets)
    elapsed = [0.0] * len(targets)
    cpu = [0.0] * len(targets)
    tasks: list[str | None] = [task] * len(targets)
    layouts: list[str | None] = [decoder] * len(targets)
    block = seconds / rounds
    for round_index in range(rounds):
        for index in _rotated(len(targets), round_index):
            command = {"op": "pipeline", "source": source, "task": task, "decoder": decoder, "seconds": block}
            reply = measured[index].worker.request(command, block * 20 + 120)
            raise_remote(reply, targets[index])
            for stage in STAGES:
                stages[index][stage].extend(reply["stages"].get(stage, ()))
            frames[index] += reply["frames"]
            dropped[index] += reply["dropped"]
            elapsed[index] += reply["elapsed_s"]
            cpu[index] += reply["cpu_s"]
            tasks[index] = reply.get("task", task)
            layouts[index] = reply.get("layout", decoder)
        say(f"pipeline: round {round_index + 1}/{rounds}")
    rows = []
    for index, target in enumerate(targets):
        rows.append({
            "label": f"{Path(target.model.path).name} · {target.delegate}", "model": target.model.path,
            "delegate": target.delegate, "source": str(source), "task": tasks[index], "layout": layouts[index],
            "frames": frames[index],
            "timed_frames": len(stages[index][STAGES[0]]),
            "dropped": dropped[index], "fps": round(frames[index] / elapsed[index], 2) if elapsed[index] else 0.0,
            "cpu_utilization": round(cpu[index] / elapsed[index], 2) if elapsed[index] else 0.0,
            "stages": {stage: _stage_summary(values) for stage, values in stages[index].items()},
        })
    return tuple(rows)


def _stage_summary(values: Sequence[float]) -> dict[str, float | None]:
    """A stage's p50/p95/... in ms; None for each when no frame was timed (a run that ended in its settle
    frames): JSON has no NaN."""
    summary = summarize(values)
    return {key: value if values else None for key, value in summary.items()}


def _check_source(source: str | int) -> None:
    """Fail before the run if the source cannot be opened (CaptureError now, not in a worker later)."""
    from ...capture import open_source

    open_source(source, loop=True).close()

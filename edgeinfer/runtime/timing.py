"""Small timing helpers shared by ``edgeinfer bench``, ``edgeinfer optimize`` and the delegate probe.

Latency comparisons are only meaningful side by side: engines are timed in alternating blocks
(the order rotates every round) so that a burst of load from another process hits all of them
alike, and medians are compared, never means.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..runtime.engine import Engine

#: rounds of interleaved blocks when the caller does not say
DEFAULT_ROUNDS = 7
#: untimed invokes at the start of every block: thread pools (ONNX Runtime's especially) keep
#: spinning for a moment after a run and would slow whichever engine comes next
SETTLE = 2


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0-100) of ``values`` with linear interpolation; NaN when empty."""
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100.0
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def summarize(values_ms: Sequence[float]) -> dict[str, float]:
    """p50 / p95 / p99 / mean / min / max of a list of milliseconds, rounded to the microsecond."""
    if not values_ms:
        return {key: math.nan for key in ("p50", "p95", "p99", "mean", "min", "max")}
    return {
        "p50": round(percentile(values_ms, 50), 3),
        "p95": round(percentile(values_ms, 95), 3),
        "p99": round(percentile(values_ms, 99), 3),
        "mean": round(sum(values_ms) / len(values_ms), 3),
        "min": round(min(values_ms), 3),
        "max": round(max(values_ms), 3),
    }


def interleaved_latency(
    engines: Sequence[Engine],
    *,
    seconds: float,
    rounds: int = DEFAULT_ROUNDS,
    warmup: int = 3,
    progress: Callable[[str], None] | None = None,
    settle: int = SETTLE,
) -> list[list[float]]:
    """Per-engine ``invoke()`` latencies in ms, measured in alternating blocks of about equal time.

    Each engine runs on whatever is already in its input views. ``seconds`` is the total budget
    for all engines together; every engine gets ``seconds / (rounds * len(engines))`` per block
    and at least one invoke per block, after ``settle`` untimed ones.
    """
    if not engines:
        return []
    if seconds <= 0 or rounds < 1:
        raise ValueError("seconds must be > 0 and rounds >= 1")
    for engine in engines:
        for _ in range(warmup):
            engine.invoke()
    block = seconds / (rounds * len(engines))
    samples: list[list[float]] = [[] for _ in engines]
    clock = time.perf_counter
    for round_index in range(rounds):
        order = list(range(len(engines)))
        shift = round_index % len(engines)
        order = order[shift:] + order[:shift]
        for index in order:
            invoke = engines[index].invoke
            out = samples[index]
            for _ in range(settle):  # untimed: the previous engine's worker threads may still be spinning
                invoke()
            deadline = clock() + block
            while True:
                start = clock()
                invoke()
                end = clock()
                out.append((end - start) * 1000.0)
                if end >= deadline:
                    break
        if progress:
            progress(f"timing: round {round_index + 1}/{rounds}")
    return samples

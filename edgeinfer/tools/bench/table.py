"""``edgeinfer bench``'s tables for people: one row per target, then per-stage pipeline timings."""

from __future__ import annotations

import math
from pathlib import Path

from ...pipeline.stats import STAGES
from .report import BenchReport


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
    stages = STAGES
    head = f"{'pipeline (ms p50/p95)':<48} {'fps':>7} " + " ".join(f"{s:>20}" for s in stages)
    lines = [head, "-" * len(head)]
    for row in report.pipeline or ():
        cells = " ".join(_p50_p95(row["stages"].get(stage, {})).rjust(20) for stage in stages)
        lines.append(f"{row['label'][:48]:<48} {row['fps']:>7.1f} {cells}")
    return "\n".join(lines)


def _p50_p95(figures: dict[str, float | None]) -> str:
    """``p50/p95`` of one stage's summary, ``-`` where there is none (no frame was timed)."""
    p50, p95 = figures.get("p50"), figures.get("p95")
    if p50 is None or p95 is None or math.isnan(p50) or math.isnan(p95):
        return "-"
    return f"{p50:.2f}/{p95:.2f}"

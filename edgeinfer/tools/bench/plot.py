"""``edgeinfer bench --plot``: the report as a PNG chart (matplotlib, the optional ``plot`` extra)."""

from __future__ import annotations

import os
import textwrap
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ...errors import OutputError
from ...pipeline.stats import STAGES
from ...util.fs import atomic_path
from ...util.optional import import_optional
from .report import BenchReport, BenchResult

#: width of one bar when several stand side by side at one tick
BAR = 0.27


def check_plot_path(path: str | os.PathLike) -> Path:
    """Fail before a long run if matplotlib is missing or the chart cannot be written."""
    target = Path(path)
    import_optional("matplotlib", "plot", "--plot")
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
    import matplotlib.pyplot as plt

    results = report.results
    fig, axes = plt.subplots(2, 3, figsize=(max(12.0, 3.2 * len(results) + 4), 8.5))
    (lat, thr, cpu), (cold, mem, text) = axes
    _draw_engine_charts(results, lat, thr, cpu, cold, mem)
    lines = [f"{report.threads} threads per delegate, {report.seconds:g} s per target, "
             f"{report.rounds} interleaved rounds"]
    lines += [textwrap.fill(f"note: {note}", 70) for note in report.notes]
    lines += [f"skipped {item['delegate']} / {Path(item['model']).name}" for item in report.skipped]
    if report.pipeline:
        _draw_pipeline_stages(report.pipeline, text)
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
    try:
        with atomic_path(target) as temp:
            fig.savefig(temp, format="png", dpi=110)
    except OSError as exc:
        raise OutputError(f"cannot write the chart to {target}: {exc}") from exc
    finally:
        plt.close(fig)
    return target


def _draw_engine_charts(results: Sequence[BenchResult], lat: Any, thr: Any, cpu: Any, cold: Any, mem: Any) -> None:
    """One bar group per target on each of the five engine charts (matplotlib Axes)."""
    labels = [f"{r.description}\n" + textwrap.fill(Path(r.model).name, 20) for r in results]
    x = list(range(len(results)))
    for offset, key in ((-BAR, "p50"), (0.0, "p95"), (BAR, "p99")):
        lat.bar([i + offset for i in x], [r.latency_ms[key] for r in results], BAR, label=key)
    lat.set_title("latency per inference (ms)")
    lat.legend(fontsize=8)
    thr.bar(x, [r.throughput_ips for r in results], 0.6, color="tab:green")
    thr.set_title("throughput, one stream (inferences/s)")
    cpu.bar(x, [r.cpu_ms_per_inference for r in results], 0.6, color="tab:purple", label="CPU time")
    cpu.scatter(x, [r.latency_ms["p50"] for r in results], color="black", marker="_", s=600, zorder=3,
                label="p50 wall time")
    cpu.set_title("CPU time per inference (ms, all threads)")
    cpu.legend(fontsize=8)
    cold.bar([i - BAR / 2 for i in x], [r.cold_start_ms for r in results], BAR, label="fresh process")
    cold.bar([i + BAR / 2 for i in x], [r.cold_start_warm_cache_ms or 0.0 for r in results], BAR,
             label="warm model cache (OpenVINO)")
    cold.set_title("cold start: engine load to first result (ms)")
    cold.legend(fontsize=8)
    mem.bar(x, [r.peak_rss_mb for r in results], 0.6, color="tab:red")
    mem.set_title("peak RSS of the process (MB)")
    for ax in (lat, thr, cpu, cold, mem):
        ax.set_xticks(x)
        ax.set_xticklabels(labels, fontsize=7)
        ax.grid(axis="y", alpha=0.3)


def _draw_pipeline_stages(rows: Sequence[dict[str, Any]], ax: Any) -> None:
    """Stacked stage p50s per target, with its frame rate on top (``--source`` runs)."""
    px = list(range(len(rows)))
    bottom = [0.0] * len(rows)
    for stage in STAGES[:-1]:  # the last, latency, is end to end, not a stage
        values = [row["stages"][stage]["p50"] or 0.0 for row in rows]  # None: no frame timed
        ax.bar(px, values, 0.6, bottom=bottom, label=stage)
        bottom = [b + v for b, v in zip(bottom, values)]
    for i, row in enumerate(rows):
        ax.annotate(f"{row['fps']:.0f} fps", (i, bottom[i]), ha="center", va="bottom", fontsize=7)
    ax.set_title(f"pipeline on {textwrap.shorten(str(rows[0]['source']), 30)}: stage p50 (ms)")
    ax.set_xticks(px)
    ax.set_xticklabels([f"{row['delegate']}\n" + textwrap.fill(Path(row["model"]).name, 20) for row in rows],
                       fontsize=7)
    ax.set_ylim(0, max(bottom) * 1.4 if max(bottom) > 0 else 1)
    ax.legend(fontsize=7, ncol=2, loc="upper left")
    ax.grid(axis="y", alpha=0.3)

"""What ``edgeinfer bench`` measured: one record per (model, delegate) target, and the machine it ran on."""

from __future__ import annotations

import contextlib
import os
import platform
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any


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
        """``model file · delegate``, for tables and charts."""
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


def cpu_has_bf16() -> bool:
    """The CPU has bfloat16 instructions (OpenVINO then runs float layers in bf16 by default)."""
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as fh:
        for line in fh:
            if line.startswith("flags"):
                flags = set(line.split(":", 1)[1].split())
                return bool(flags & {"avx512_bf16", "amx_bf16"})
    return False

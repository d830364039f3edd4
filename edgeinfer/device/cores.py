"""The CPU cores this process may use, and how many threads a runtime should get of them.

A runtime left to itself sizes its thread pool from the machine: ONNX Runtime one thread per physical
core of the host, OpenVINO and XNNPACK the same. In a container limited to two CPUs on a 16-core host
(``docker run --cpus 2``, a Kubernetes limit), or under ``taskset`` / a systemd ``CPUAffinity=``, that
is several threads per core the process may use — each invoke's parallel sections then wait on threads
the kernel does not run. :func:`usable_cores` counts what this process may really use:

- its CPU affinity (``sched_getaffinity``: taskset, cpusets, ``CPUAffinity=``);
- its cgroup's CPU quota (``cpu.max`` in cgroup v2, ``cpu.cfs_quota_us`` / ``cpu.cfs_period_us`` in v1),
  rounded up to whole cores;
- one per physical core among the allowed CPUs (SMT siblings share one core's arithmetic units).

:func:`runtime_threads` decides the runtime's threads from it — the **thread plan**: ``--threads`` (or a
pipeline's ``threads``), else the device profile's ``threads``, else the usable cores less the pipeline's own
busy threads. A run's busy threads beside the runtime are its capture threads, one per source, each decoding
and staging the next frame while the model runs; the inference thread is not one of them (it is the runtime's
first thread: it invokes, and decodes the outputs between invokes), and the others (watchdog, evidence,
sampling, live view) sleep until an event. So a run of one camera on a 4-core Pi gives the runtime 3 threads
and the capture a core of its own. The runtime never gets fewer than :data:`MIN_SHARED_RUNTIME_THREADS`
where that many cores are usable: on 2 cores a run shares them (halving every parallel section of an invoke
costs more than sharing a core with a decoder, and ONNX Runtime's idle workers sleep rather than spin, so the
kernel can run the capture thread in their place — ``docs/benchmarks.md``). ``edgeinfer device`` says how the
cores are shared, and why.

``root`` is ``/`` on the device and a small fake tree in tests, as for :mod:`.host`.
"""

from __future__ import annotations

import math
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Cores:
    """What limits the cores this process may use: each figure, and the least of them."""

    online: int  # CPUs of the machine (logical)
    allowed: int  # CPUs in this process's affinity (logical)
    physical: int | None  # physical cores among them (None: the topology is not readable)
    quota: float | None  # the cgroup's CPU quota in cores (None: no quota)

    @property
    def usable(self) -> int:
        """Cores a runtime may keep busy at once: the least of the affinity, its physical cores and the quota."""
        limits = [self.allowed]
        if self.physical:
            limits.append(self.physical)
        if self.quota is not None:
            limits.append(max(1, math.ceil(self.quota)))
        return max(1, min(limits))

    def limit(self) -> str:
        """What the usable count comes from, in words."""
        usable = self.usable
        if self.quota is not None and max(1, math.ceil(self.quota)) == usable and usable < self.allowed:
            return f"the cgroup's CPU quota of {self.quota:g} cores"
        if self.physical and self.physical == usable and usable < self.allowed:
            return f"{self.physical} physical cores of the {self.allowed} CPUs allowed (SMT siblings share one)"
        if self.allowed < self.online:
            return f"the CPU affinity ({self.allowed} of {self.online} CPUs)"
        return f"all {self.online} CPUs"

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "usable": self.usable, "limit": self.limit()}


MIN_SHARED_RUNTIME_THREADS = 2  # the runtime keeps this many where they are usable, sharing them with capture


@dataclass(frozen=True)
class RuntimeThreads:
    """The runtime's intra-op threads, where that number came from, and the pipeline threads beside it."""

    threads: int
    source: str  # "threads option", "profile", "usable cores", "thread plan"
    cores: Cores
    capture_threads: int = 0  # the run's capture threads, busy while the runtime invokes

    def describe(self) -> str:
        limit = self.cores.limit()
        if self.source == "thread plan":
            capture = _count(self.capture_threads, "capture thread")
            share = (f"less {capture}" if self.threads == self.cores.usable - self.capture_threads else
                     f"the least the runtime keeps, beside {capture}")
            return f"{self.threads} threads ({self.cores.usable} usable cores: {limit}; {share})"
        if self.source == "usable cores":
            shared = (f"; shared with {_count(self.capture_threads, 'capture thread')}, as fewer than "
                      f"{MIN_SHARED_RUNTIME_THREADS} would be left" if self.capture_threads else "")
            return f"{self.threads} threads (every usable core: {limit}{shared})"
        return f"{self.threads} threads (the {self.source}; {self.cores.usable} cores usable: {limit})"

    def sharing(self) -> str:
        """How a run's threads share the usable cores, in words."""
        usable, capture = self.cores.usable, self.capture_threads
        if not capture:
            return f"the runtime's {_count(self.threads, 'thread')} on {_count(usable, 'usable core')}"
        beside = self.threads + capture
        verdict = ("each capture thread has a core of its own" if beside <= usable else
                   f"{_count(beside, 'busy thread')} on {_count(usable, 'core')}: the capture threads take turns "
                   "with the runtime's")
        return (f"{_count(capture, 'capture thread')} (decode and preprocess the next frame) beside the runtime's "
                f"{_count(self.threads, 'thread')}, the first of them the inference thread; {verdict}")

    def to_dict(self) -> dict[str, Any]:
        return {"threads": self.threads, "source": self.source, "capture_threads": self.capture_threads,
                "sharing": self.sharing(), "cores": self.cores.to_dict()}


def runtime_threads(requested: int | None = None, profile: int | None = None, *,
                    root: str | os.PathLike = "/", capture_threads: int = 0) -> RuntimeThreads:
    """The threads a runtime gets beside ``capture_threads`` busy pipeline threads: ``requested`` (``--threads``),
    else the profile's, else the usable cores less the capture threads, never fewer than
    :data:`MIN_SHARED_RUNTIME_THREADS` where that many are usable (the module docstring says why)."""
    cores = usable_cores(root)
    if requested:
        return RuntimeThreads(requested, "threads option", cores, capture_threads)
    if profile:
        return RuntimeThreads(profile, "profile", cores, capture_threads)
    left = cores.usable - capture_threads
    if capture_threads and left >= MIN_SHARED_RUNTIME_THREADS:
        return RuntimeThreads(left, "thread plan", cores, capture_threads)
    floor = min(MIN_SHARED_RUNTIME_THREADS, cores.usable)
    if left < floor and floor < cores.usable:  # several sources on few cores: keep the floor, share the rest
        return RuntimeThreads(floor, "thread plan", cores, capture_threads)
    return RuntimeThreads(cores.usable, "usable cores", cores, capture_threads)


def _count(n: int, thing: str) -> str:
    return f"{n} {thing}{'' if n == 1 else 's'}"


def usable_cores(root: str | os.PathLike = "/") -> Cores:
    """The cores this process may use (see the module docstring); never raises."""
    base = Path(root)
    online = _count_cpus(_read(base / "sys/devices/system/cpu/online")) or os.cpu_count() or 1
    allowed_ids = _affinity() if str(root) == "/" else None
    allowed = len(allowed_ids) if allowed_ids else online
    return Cores(online, allowed, _physical_cores(base, allowed_ids), _quota(base))


def _affinity() -> set[int] | None:
    try:
        return set(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not on Linux
        return None


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except (OSError, UnicodeDecodeError):
        return None


def _cpu_ids(text: str | None) -> set[int]:
    """``0-3,6`` -> {0, 1, 2, 3, 6} (the kernel's CPU list format); empty when unreadable."""
    ids: set[int] = set()
    for part in (text or "").split(","):
        low, _, high = part.strip().partition("-")
        try:
            ids.update(range(int(low), int(high or low) + 1))
        except ValueError:
            return set()
    return ids


def _count_cpus(text: str | None) -> int | None:
    return len(_cpu_ids(text)) or None


def _physical_cores(base: Path, allowed: set[int] | None) -> int | None:
    """Distinct (package, core) pairs among the allowed CPUs' topology; None when it is not readable."""
    cores = set()
    for cpu in sorted(base.glob("sys/devices/system/cpu/cpu[0-9]*")):
        number = int(cpu.name[3:])
        if allowed is not None and number not in allowed:
            continue
        package, core = _read(cpu / "topology/physical_package_id"), _read(cpu / "topology/core_id")
        if package is None or core is None:
            continue
        cores.add((package, core))
    return len(cores) or None


def _quota(base: Path) -> float | None:
    """The CPU quota of this process's cgroup in cores (v2 ``cpu.max``, else v1 CFS), None when unlimited."""
    for folder in _cgroup_folders(base):
        limit = _read(folder / "cpu.max")
        if limit:
            quota, _, period = limit.partition(" ")
            if quota != "max":
                try:
                    return int(quota) / int(period or 100_000)
                except ValueError:
                    return None
            continue
        quota_us, period_us = _read(folder / "cpu.cfs_quota_us"), _read(folder / "cpu.cfs_period_us")
        if quota_us and period_us and quota_us.lstrip("-").isdigit() and int(quota_us) > 0 and period_us.isdigit():
            return int(quota_us) / int(period_us)
    return None


def _cgroup_folders(base: Path) -> list[Path]:
    """This process's own cgroup folders (from /proc/self/cgroup), then the hierarchy's roots (a container sees
    its own cgroup there)."""
    folders: list[Path] = []
    for line in (_read(base / "proc/self/cgroup") or "").splitlines():
        _, controllers, path = [*line.split(":", 2), "", ""][:3]
        relative = path.lstrip("/")
        if controllers == "":  # cgroup v2
            folders.append(base / "sys/fs/cgroup" / relative)
        elif "cpu" in controllers.split(","):
            folders += [base / "sys/fs/cgroup/cpu" / relative, base / "sys/fs/cgroup/cpu,cpuacct" / relative]
    folders += [base / "sys/fs/cgroup", base / "sys/fs/cgroup/cpu", base / "sys/fs/cgroup/cpu,cpuacct"]
    return folders

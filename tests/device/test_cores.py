"""The cores a runtime gets: the affinity, the cgroup's CPU quota and the physical cores decide, not the host's
CPU count — a container limited to 2 CPUs on a 16-core host gets 2 threads, not 16. Fake roots stand in for the
sysfs and cgroup trees of such machines."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from support.profiles import FakeRoot

from edgeinfer.device.cores import runtime_threads, usable_cores


def machine(path, cpus: int, *, smt: bool = False) -> FakeRoot:
    """``cpus`` logical CPUs online; with ``smt``, two of them per physical core."""
    root = FakeRoot(path).file("/sys/devices/system/cpu/online", f"0-{cpus - 1}\n")
    for cpu in range(cpus):
        core = cpu // 2 if smt else cpu
        root.file(f"/sys/devices/system/cpu/cpu{cpu}/topology/physical_package_id", "0\n")
        root.file(f"/sys/devices/system/cpu/cpu{cpu}/topology/core_id", f"{core}\n")
    return root


def test_a_cgroup_v2_quota_of_one_and_a_half_cores_on_16_gives_2(tmp_path):
    root = machine(tmp_path, 16).file("/proc/self/cgroup", "0::/docker/abc\n")
    root.file("/sys/fs/cgroup/docker/abc/cpu.max", "150000 100000\n")
    cores = usable_cores(root)
    assert (cores.online, cores.allowed, cores.physical, cores.quota, cores.usable) == (16, 16, 16, 1.5, 2)
    assert cores.limit() == "the cgroup's CPU quota of 1.5 cores"
    assert runtime_threads(root=root).threads == 2


def test_a_cgroup_v1_quota_and_no_quota(tmp_path):
    v1 = machine(tmp_path / "v1", 8).file("/proc/self/cgroup", "4:cpu,cpuacct:/kubepods/pod1\n")
    v1.file("/sys/fs/cgroup/cpu,cpuacct/kubepods/pod1/cpu.cfs_quota_us", "300000\n")
    v1.file("/sys/fs/cgroup/cpu,cpuacct/kubepods/pod1/cpu.cfs_period_us", "100000\n")
    assert usable_cores(v1).usable == 3
    unlimited = machine(tmp_path / "v2", 8).file("/proc/self/cgroup", "0::/\n").file("/sys/fs/cgroup/cpu.max",
                                                                                   "max 100000\n")
    assert usable_cores(unlimited).quota is None and usable_cores(unlimited).usable == 8
    v1_unlimited = machine(tmp_path / "v1u", 4).file("/sys/fs/cgroup/cpu/cpu.cfs_quota_us", "-1\n")
    v1_unlimited.file("/sys/fs/cgroup/cpu/cpu.cfs_period_us", "100000\n")
    assert usable_cores(v1_unlimited).usable == 4


def test_smt_siblings_count_once(tmp_path):
    cores = usable_cores(machine(tmp_path, 8, smt=True))
    assert (cores.allowed, cores.physical, cores.usable) == (8, 4, 4)
    assert "4 physical cores of the 8 CPUs allowed" in cores.limit()


def test_unreadable_trees_fall_back_to_the_cpu_count(tmp_path):
    cores = usable_cores(FakeRoot(tmp_path).file("/sys/fs/cgroup/cpu.max", "garbage\n"))
    assert cores.usable >= 1 and cores.quota is None and cores.physical is None


def test_the_threads_option_then_the_profile_then_every_usable_core(tmp_path):
    root = machine(tmp_path, 4)
    assert (runtime_threads(3, 2, root=root).threads, runtime_threads(3, 2, root=root).source) == (3, "threads option")
    assert (runtime_threads(None, 2, root=root).threads, runtime_threads(None, 2, root=root).source) == (2, "profile")
    every = runtime_threads(None, None, root=root)
    assert (every.threads, every.source) == (4, "usable cores")
    assert every.describe() == "4 threads (every usable core: all 4 CPUs)"


def test_this_process_affinity_counts(tmp_path):
    import os

    cores = usable_cores("/")
    assert cores.allowed == len(os.sched_getaffinity(0)) and 1 <= cores.usable <= cores.allowed


@pytest.mark.parametrize("as_json", [True, False])
def test_edgeinfer_device_says_how_many_threads_the_runtime_gets_and_why(tmp_path, as_json):
    root = machine(tmp_path, 16).file("/proc/self/cgroup", "0::/\n").file("/sys/fs/cgroup/cpu.max", "200000 100000\n")
    done = subprocess.run([sys.executable, "-m", "edgeinfer", "device", "--root", str(root),
                           *(["--json"] if as_json else [])], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    if as_json:
        threads = json.loads(done.stdout)["runtime_threads"]
        assert threads["threads"] == 2 and threads["source"] == "usable cores"
        assert threads["cores"]["online"] == 16 and threads["cores"]["quota"] == 2.0
    else:
        assert "runtime   2 threads (every usable core: the cgroup's CPU quota of 2 cores)" in done.stdout


def test_a_loaded_engine_gets_every_usable_core_by_default():
    from support.assets import MOBILENET_TINY

    from edgeinfer.runtime.selection import load

    engine = load(MOBILENET_TINY, "xnnpack")
    try:
        assert engine.threads == usable_cores().usable
    finally:
        engine.close()

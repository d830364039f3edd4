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
        assert ("runtime   2 threads (every usable core: the cgroup's CPU quota of 2 cores; shared with 1 capture "
                "thread, as fewer than 2 would be left)\n") in done.stdout


def test_a_loaded_engine_gets_every_usable_core_by_default():
    from support.assets import MOBILENET_TINY

    from edgeinfer.runtime.selection import load

    engine = load(MOBILENET_TINY, "xnnpack")
    try:
        assert engine.threads == usable_cores().usable
    finally:
        engine.close()


@pytest.mark.parametrize(("cpus", "capture", "threads", "source"), [
    (4, 1, 3, "thread plan"),  # a Pi with one camera: the capture thread gets a core of its own
    (8, 2, 6, "thread plan"),
    (2, 1, 2, "usable cores"),  # two cores: shared, as one runtime thread would halve every parallel section
    (4, 3, 2, "thread plan"),  # three cameras on four cores: the runtime keeps two
    (1, 1, 1, "usable cores"),
])
def test_the_thread_plan_gives_the_runtime_what_the_capture_threads_leave(tmp_path, cpus, capture, threads, source):
    plan = runtime_threads(root=machine(tmp_path, cpus), capture_threads=capture)
    assert (plan.threads, plan.source, plan.capture_threads) == (threads, source, capture)
    assert f"{capture} capture thread" in plan.sharing() and f"{threads} thread" in plan.sharing()


def test_the_thread_plan_says_how_the_cores_are_shared(tmp_path):
    own = runtime_threads(root=machine(tmp_path / "pi", 4), capture_threads=1)
    assert own.describe() == "3 threads (4 usable cores: all 4 CPUs; less 1 capture thread)"
    assert own.sharing().endswith("each capture thread has a core of its own")
    shared = runtime_threads(root=machine(tmp_path / "two", 2), capture_threads=1)
    assert shared.describe() == ("2 threads (every usable core: all 2 CPUs; shared with 1 capture thread, as fewer "
                                 "than 2 would be left)")
    assert "3 busy threads on 2 cores" in shared.sharing()
    kept = runtime_threads(root=machine(tmp_path / "three", 4), capture_threads=3)
    assert kept.describe() == ("2 threads (4 usable cores: all 4 CPUs; the least the runtime keeps, beside 3 capture "
                               "threads)")
    # --threads and the profile still decide when given
    assert runtime_threads(4, root=machine(tmp_path / "opt", 4), capture_threads=1).threads == 4
    assert runtime_threads(None, 4, root=machine(tmp_path / "prof", 4), capture_threads=1).threads == 4


@pytest.mark.parametrize("as_json", [True, False])
def test_edgeinfer_device_shares_the_cores_as_a_run_of_n_sources_would(tmp_path, as_json):
    root = machine(tmp_path, 8)
    done = subprocess.run([sys.executable, "-m", "edgeinfer", "device", "--root", str(root), "--sources", "2",
                           *(["--json"] if as_json else [])], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    if as_json:
        threads = json.loads(done.stdout)["runtime_threads"]
        assert (threads["threads"], threads["source"], threads["capture_threads"]) == (6, "thread plan", 2)
        assert "each capture thread has a core of its own" in threads["sharing"]
    else:
        assert "runtime   6 threads (8 usable cores: all 8 CPUs; less 2 capture threads)\n" in done.stdout
        assert ("cores     2 capture threads (decode and preprocess the next frame) beside the runtime's 6"
                in done.stdout)


def test_a_pipeline_gives_its_engine_the_thread_plan_for_its_sources(monkeypatch):
    """On four usable cores (this machine has two: the count is faked), a run of one source gives the runtime 3
    threads and two sources 2; a plain load, with no capture beside it, all 4."""
    from support.assets import MOBILENET_TINY

    from edgeinfer import Pipeline
    from edgeinfer.capture import SyntheticSource
    from edgeinfer.device import cores
    from edgeinfer.pipeline.multi import MultiPipeline
    from edgeinfer.runtime.selection import load

    monkeypatch.setattr(cores, "usable_cores", lambda root="/": cores.Cores(4, 4, 4, None))
    with Pipeline(MOBILENET_TINY, SyntheticSource((64, 64)), delegate="xnnpack") as one:
        assert one.engine.threads == 3
    two = MultiPipeline(MOBILENET_TINY, [SyntheticSource((64, 64)), SyntheticSource((64, 64))], delegate="xnnpack")
    with two:
        assert two.engine.threads == 2
    engine = load(MOBILENET_TINY, "xnnpack")
    try:
        assert engine.threads == 4
    finally:
        engine.close()

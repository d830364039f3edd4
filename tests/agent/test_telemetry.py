"""System probes (against a fake sysfs for the sensors this machine lacks), sequences, messages."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

import pytest
from support.agent import fake_sysfs

from edgeinfer.agent.telemetry import BootSequence, SystemProbe, pipeline_entry, telemetry_message, throttle_sensor
from edgeinfer.errors import ProtocolError
from edgeinfer.link.protocol import MAX_COUNTERS, Topics, validate

PI_THROTTLE = "/sys/devices/platform/soc/soc:firmware/get_throttled"


def test_boot_sequences_are_per_stream_from_one_and_thread_safe():
    boot = BootSequence()
    other = BootSequence()
    assert len(boot.boot_id) == 32 and boot.boot_id != other.boot_id
    got: list[int] = []
    threads = [threading.Thread(target=lambda: got.extend(boot.next("telemetry") for _ in range(500)))
               for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(got) == list(range(1, 2001))
    assert boot.next("events") == 1 and boot.last("telemetry") == 2000


def test_temperatures_and_pi_throttling_from_a_fake_sysfs(tmp_path):
    root = fake_sysfs(tmp_path, {"cpu-thermal": 61.5, "gpu-thermal": 48.0}, throttled=0x50005)
    probe = SystemProbe(root=root, thermal_zones=["cpu-thermal", "thermal_zone1", "missing-zone"],
                        throttle=[throttle_sensor(PI_THROTTLE)])
    sample = probe.sample()
    assert sample["temperature_c"] == {"cpu-thermal": 61.5, "thermal_zone1": 48.0}
    assert sample["throttled"] is True  # bits 0 and 2 (under-voltage, throttled) are set now
    assert sample["throttle_flags"] == {"get_throttled": 0x50005}
    (root / PI_THROTTLE.lstrip("/")).write_text("50000\n")  # only the "has happened" bits
    (root / "sys/class/thermal/thermal_zone0/temp").write_text("70250\n")
    sample = probe.sample()
    assert sample["throttled"] is False and sample["temperature_c"]["cpu-thermal"] == 70.25


def test_no_sensors_means_null_throttling_not_false(tmp_path):
    sample = SystemProbe(root=tmp_path).sample()
    assert sample["throttled"] is None and sample["temperature_c"] == {}
    assert "throttle_flags" not in sample


def test_cpu_and_memory_figures_follow_real_work():
    probe = SystemProbe()
    first = probe.sample()
    assert first["cpu_percent"] is None and first["process_cpu_percent"] is None  # no window yet
    assert first["rss_bytes"] > 10 * 1024 * 1024 and first["mem_available_bytes"] > 0
    wall, cpu = time.monotonic(), time.process_time()  # taken just after the probe's first sample
    while time.process_time() < cpu + 0.3:  # keep one core busy
        pass
    busy = probe.sample()
    # what this process had of the window: ~100 % on a quiet machine, less when others share the cores —
    # so the probe's figure is checked against the test's own clocks, not against how busy the machine is
    expected = 100 * (time.process_time() - cpu) / (time.monotonic() - wall)
    assert abs(busy["process_cpu_percent"] - expected) < 10 + 0.1 * expected, (busy, expected)
    assert 0 < busy["cpu_percent"] <= 100
    time.sleep(0.3)
    assert probe.sample()["process_cpu_percent"] < 15  # sleeping costs nothing


@dataclass(frozen=True)
class _Window:  # the fields of edgeinfer.pipeline.PipelineStats that telemetry reads
    frames: int
    dropped: int
    fps: float
    delegate: str
    stages: dict = field(default_factory=dict)
    analytics: dict | None = None


def test_telemetry_message_matches_its_schema():
    stats = _Window(frames=30, dropped=2, fps=29.97, delegate="xnnpack", stages={
        "infer": {"p50": 10.0, "p95": 12.5, "p99": 14.0, "mean": 10.4},
        "latency": {"p50": 20.0, "p95": float("nan"), "p99": 30.0}})  # an incomplete stage is left out
    boot = BootSequence()
    entries = [pipeline_entry("main", "running", stats, restarts=1), pipeline_entry("side", "failed", None)]
    message = telemetry_message(Topics("default", "cam-01"), boot, interval_s=1.0, pipelines=entries,
                                system=SystemProbe().sample(), spool={"pending": 0, "dropped": 0})
    assert validate("telemetry", message) is message
    assert message["seq"] == 1 and message["boot_id"] == boot.boot_id
    main, side = message["pipelines"]
    assert main["stages"] == {"infer": {"p50": 10.0, "p95": 12.5, "p99": 14.0, "mean": 10.4}}
    assert main["fps"] == 29.97 and main["delegate"] == "xnnpack"
    assert side == {"name": "side", "status": "failed", "delegate": None, "frames": 0, "dropped": 0,
                    "fps": 0.0, "restarts": 0, "stages": {}}
    assert telemetry_message(Topics("default", "cam-01"), boot, interval_s=1.0, pipelines=[], system={
        "cpu_percent": None, "rss_bytes": None}, spool={"pending": 0, "dropped": 0})["seq"] == 2


def test_profile_names_the_zones_and_power_rails_telemetry_reads(tmp_path):
    from edgeinfer.device.profiles import load_profiles

    orin = load_profiles()["jetson-orin-nano"]
    root = fake_sysfs(tmp_path, {"CPU-therm": 48.25, "GPU-therm": 45.0, "tj-therm": 50.5})  # JetPack 5 names
    hwmon = tmp_path / "sys/bus/i2c/drivers/ina3221/1-0040/hwmon/hwmon3"
    hwmon.mkdir(parents=True)
    for channel, (millivolts, milliamps) in enumerate([(5000, 1200), (5000, 400)], start=1):
        (hwmon / f"in{channel}_input").write_text(f"{millivolts}\n")
        (hwmon / f"curr{channel}_input").write_text(f"{milliamps}\n")
    sample = SystemProbe(root=root, profile=orin).sample()
    assert sample["temperature_c"] == {"cpu": 48.25, "gpu": 45.0, "junction": 50.5}
    assert sample["power_mw"] == {"VDD_IN": 6000.0, "VDD_CPU_GPU_CV": 2000.0}  # VDD_SOC is not there: left out
    assert sample["throttled"] is None


def test_line_and_zone_counts_travel_in_telemetry_bounded_and_hostile_ones_are_refused():
    counts = {"frame_id": 99, "frames": 100, "tracks": {"confirmed": 3, "active": 2},
              "lines": {f"door{i}": {"in": i, "out": 1} for i in range(40)},
              "zones": {"shop": {"inside": 1, "entries": 2, "dwell_s": {"4": 1.5}, "mean_visit_s": 1.83}}}
    stats = _Window(frames=30, dropped=0, fps=30.0, delegate="xnnpack", stages={}, analytics=counts)
    entry = pipeline_entry("main", "running", stats)
    message = telemetry_message(Topics("default", "cam-01"), BootSequence(), interval_s=1.0, pipelines=[entry],
                                system={"cpu_percent": None, "rss_bytes": None}, spool={"pending": 0, "dropped": 0})
    assert validate("telemetry", message) is message
    analytics = message["pipelines"][0]["analytics"]
    assert analytics["tracks"] == {"confirmed": 3, "active": 2} and len(analytics["lines"]) == MAX_COUNTERS
    assert analytics["lines"][1] == {"name": "door1", "in": 1, "out": 1}
    assert analytics["zones"] == [{"name": "shop", "inside": 1, "entries": 2, "mean_visit_s": 1.83}]  # no dwell map
    for hostile in ({"lines": [{"name": "x", "in": -1, "out": 0}]}, {"lines": [{"name": "", "in": 1, "out": 0}]},
                    {"zones": [{"name": "z", "inside": "many", "entries": 1}]},
                    {"lines": [{"name": "x", "in": 1, "out": 0}] * (MAX_COUNTERS + 1)}):
        message["pipelines"][0]["analytics"] = hostile
        with pytest.raises(ProtocolError):
            validate("telemetry", message)

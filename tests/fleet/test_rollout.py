"""Wave planning and the abort rule (the end-to-end rollout over MQTT is in test_deploy.py)."""

from __future__ import annotations

import threading

import pytest

from edgeinfer.fleet.rollout import Rollout, plan_waves


def test_plan_waves_canary_then_fixed_waves():
    devices = [f"cam-{i:02d}" for i in range(20)]
    waves = plan_waves(devices, canary_pct=10, wave_size=5)
    assert [len(w) for w in waves] == [2, 5, 5, 5, 3]
    assert sorted(d for w in waves for d in w) == devices
    assert plan_waves(["a"], canary_pct=10) == [["a"]]
    assert plan_waves(devices, canary_pct=0, wave_size=None) == [devices]
    assert [len(w) for w in plan_waves(devices, canary_pct=50)] == [10, 10]
    with pytest.raises(ValueError):
        plan_waves(devices, canary_pct=150)


def drive(rollout: Rollout, outcome) -> tuple[list[str], object]:
    """Answer every notification from another thread, as devices do."""
    notified: list[str] = []

    def notify(device: str) -> None:
        notified.append(device)
        state, detail = outcome(device)
        threading.Timer(0.01, rollout.on_progress, args=(device, "downloading")).start()
        threading.Timer(0.03, rollout.on_progress, args=(device, state, detail)).start()

    rollout._notify = notify
    return notified, rollout.run()


def test_all_waves_succeed():
    waves = plan_waves([f"d{i}" for i in range(6)], canary_pct=20, wave_size=2)
    notified, result = drive(Rollout(waves, lambda d: None), lambda d: ("active", None))
    assert result.status == "succeeded" and result.all_active and len(notified) == 6
    assert result.notified_waves == len(waves)


def test_failing_canary_stops_the_rollout():
    waves = plan_waves([f"d{i}" for i in range(10)], canary_pct=10, wave_size=3)
    canary = set(waves[0])
    notified, result = drive(Rollout(waves, lambda d: None, abort_failure_rate=20),
                             lambda d: ("failed", "validation_failed"))
    assert result.status == "aborted" and set(notified) == canary
    assert all(result.states[d] == "pending" for d in result.states if d not in canary)
    assert result.details[next(iter(canary))] == "validation_failed"


def test_silent_device_times_out():
    rollout = Rollout([["quiet"]], lambda d: None, device_timeout_s=0.2)
    result = rollout.run()
    assert result.states == {"quiet": "timeout"} and result.status == "aborted"


def test_states_never_go_backwards():
    rollout = Rollout([["d"]], lambda d: None)
    rollout.states["d"] = "validating"
    rollout.on_progress("d", "downloading")
    assert rollout.states["d"] == "validating"
    rollout.on_progress("d", "active")
    rollout.on_progress("d", "failed")
    assert rollout.states["d"] == "active"
    rollout.on_progress("stranger", "active")
    assert "stranger" not in rollout.states

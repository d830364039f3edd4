"""Wave planning and the rollout rule, driven from a real database (SQLite here; the lease race runs on
PostgreSQL in test_fleet_db.py). The end-to-end rollout over MQTT is in test_deploy.py and
test_fleet_manager.py."""

from __future__ import annotations

import pytest

from edgeinfer.fleet.db import FleetDB
from edgeinfer.fleet.rollout import RolloutDriver, plan_waves, step


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


@pytest.fixture
def db(tmp_path):
    database = FleetDB(f"sqlite:///{tmp_path / 'fleet.db'}")
    yield database
    database.close()


def deployment(db: FleetDB, devices: list[str], *, canary_pct=20, wave_size=2, abort=0.0, timeout=600.0) -> dict:
    waves = plan_waves(devices, canary_pct=canary_pct, wave_size=wave_size)
    deployment_id = f"dep-{len(db.list_deployments())}"
    manifest = {"deployment_id": deployment_id, "model_name": "m.tflite", "version": 2, "sha256": "a" * 64,
                "size": 1, "target": "all"}
    db.create_deployment(manifest, "sig", {"abort_failure_rate": abort, "device_timeout_s": timeout}, waves)
    (running,) = [d for d in db.running_deployments() if d["deployment_id"] == deployment_id]
    return running


def answer(db: FleetDB, deployment_id: str, devices, state: str, detail: str | None = None) -> None:
    for device in devices:
        db.advance_target(deployment_id, device, "downloading")
        db.advance_target(deployment_id, device, state, detail)


def states(db: FleetDB, deployment_id: str) -> dict[str, str]:
    return {t["device_id"]: t["state"] for t in db.deployment_targets(deployment_id)}


def test_waves_are_notified_one_after_another_and_the_rollout_succeeds(db):
    devices = [f"d{i}" for i in range(6)]
    dep = deployment(db, devices)
    notified: list[str] = []
    while (ended := step(db, dep, notified.append)) is None:
        waiting = [d for d, s in states(db, dep["deployment_id"]).items() if s == "notified"]
        assert waiting, "a step that does not end must leave devices to answer"
        answer(db, dep["deployment_id"], waiting, "active")
    assert ended == "succeeded" and sorted(notified) == devices and len(notified) == len(set(notified))
    assert db.get_deployment(dep["deployment_id"])["status"] == "succeeded"


def test_a_failing_canary_aborts_and_nobody_else_is_notified(db):
    devices = [f"d{i}" for i in range(10)]
    dep = deployment(db, devices, canary_pct=10, wave_size=3, abort=0.2)
    notified: list[str] = []
    assert step(db, dep, notified.append) is None
    (canary,) = notified
    answer(db, dep["deployment_id"], [canary], "failed", "validation_failed")
    assert step(db, dep, notified.append) == "aborted"
    assert notified == [canary]
    final = db.get_deployment(dep["deployment_id"])
    assert final["status"] == "aborted" and "later waves not notified" in final["detail"]
    assert final["counts"] == {"failed": 1, "pending": 9}


def test_a_silent_device_times_out(db):
    dep = deployment(db, ["quiet"], timeout=5)
    assert step(db, dep, lambda d: None, now=1000.0) is None
    assert step(db, dep, lambda d: None, now=1004.0) is None
    assert step(db, dep, lambda d: None, now=1006.0) == "aborted"
    assert states(db, dep["deployment_id"]) == {"quiet": "timeout"}


def test_states_never_go_backwards(db):
    dep = deployment(db, ["d"], canary_pct=100)
    step(db, dep, lambda d: None)
    deployment_id = dep["deployment_id"]
    assert db.advance_target(deployment_id, "d", "validating")
    assert not db.advance_target(deployment_id, "d", "downloading")
    assert db.advance_target(deployment_id, "d", "active")
    assert not db.advance_target(deployment_id, "d", "failed")
    assert not db.advance_target(deployment_id, "stranger", "active")
    assert states(db, deployment_id) == {"d": "active"}


def test_a_second_driver_takes_over_when_the_lease_runs_out_and_resends(db):
    devices = [f"d{i}" for i in range(4)]
    dep = deployment(db, devices, canary_pct=50, wave_size=2)
    sent_a: list[str] = []
    sent_b: list[str] = []
    a = RolloutDriver(db, lambda d, device: sent_a.append(device), owner="a", lease_ttl_s=5)
    b = RolloutDriver(db, lambda d, device: sent_b.append(device), owner="b", lease_ttl_s=5)
    a.tick(now=100.0)
    assert sorted(sent_a) == ["d0", "d1"] and a.held == {dep["deployment_id"]}
    b.tick(now=102.0)  # a's lease holds: b leaves the rollout alone
    assert sent_b == [] and not b.held
    answer(db, dep["deployment_id"], ["d0"], "active")
    b.tick(now=106.0)  # a died at 100 and its lease ran out at 105: b takes over, re-sends to d1
    assert b.takeovers == 1 and sent_b == ["d1"]
    answer(db, dep["deployment_id"], ["d1"], "active")
    b.tick(now=107.0)
    assert sorted(sent_b) == ["d1", "d2", "d3"]
    a.tick(now=107.5)  # a comes back: b holds the lease now
    assert sorted(sent_a) == ["d0", "d1"]
    answer(db, dep["deployment_id"], ["d2", "d3"], "active")
    b.tick(now=108.0)
    assert db.get_deployment(dep["deployment_id"])["status"] == "succeeded" and not b.held


def test_a_state_reporting_the_new_model_completes_a_device_whose_events_went_elsewhere(db):
    from edgeinfer.fleet.deployments import follow_state

    dep = deployment(db, ["d0", "d1"], canary_pct=100)
    step(db, dep, lambda d: None)
    running = db.running_deployments()
    new_model = {"online": True, "pipelines": [{"name": "main", "model": {"path": "m", "sha256": "a" * 64}}]}
    old_model = {"online": True, "pipelines": [{"name": "main", "model": {"path": "m", "sha256": "b" * 64}}]}
    assert not follow_state(db, running, "d1", old_model)
    assert not follow_state(db, running, "d0", new_model | {"online": False})
    assert follow_state(db, running, "d0", new_model)
    assert states(db, dep["deployment_id"]) == {"d0": "active", "d1": "notified"}


def test_the_abort_rate_has_one_meaning_per_key():
    """The CLI and the dashboard send a percent (abort_failure_pct), the stored rule is a fraction; a bare
    abort_failure_rate is a fraction only — "1" used to mean 100 % when the CLI meant 1 %."""
    from pydantic import ValidationError

    from edgeinfer.fleet.api.schemas import DeploymentSpec, describe_error
    from edgeinfer.fleet.rollout import RolloutRules

    def abort_fraction(**given) -> float:
        return DeploymentSpec(sha256="0" * 64, version=1, all=True, **given).abort_fraction()

    assert abort_fraction(abort_failure_pct=1) == 0.01
    assert abort_fraction(abort_failure_pct=20) == 0.2
    assert abort_fraction(abort_failure_rate=0.2) == 0.2 and abort_fraction() == 0.0
    for given, words in (({"abort_failure_rate": 20}, "abort_failure_rate: Input should be less than or equal to 1"),
                         ({"abort_failure_pct": 150}, "abort_failure_pct: Input should be less than or equal to 100")):
        with pytest.raises(ValidationError) as info:
            abort_fraction(**given)
        assert words in describe_error(info.value)
    assert RolloutRules.from_options({"abort_failure_rate": abort_fraction(abort_failure_pct=1)}) \
        .abort_failure_rate == 0.01

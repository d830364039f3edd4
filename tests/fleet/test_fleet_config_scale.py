"""A configuration rolled out to 1,000 simulated devices (``fleet simulate`` answers configuration deployments, a
share of them refusing) behind a real manager and its managed Mosquitto: a group edit goes out in waves, each wave
notified only once the one before has finished; with an abort rate the refusals trip it after the canary, and no
device of a later wave is ever sent the document."""

from __future__ import annotations

import itertools
import math
import time

import pytest
from support.fleet import simulated_fleet
from support.processes import wait_until

from edgeinfer.fleet.rollout import plan_waves

DEVICES = 1000
REFUSE_RATE = 0.3
CANARY_PCT = 5
WAVE_SIZE = 200
pytestmark = pytest.mark.timeout(900)


def save(admin, document: dict, revision: int, **rollout) -> dict:
    return admin._post("/api/config/layers/group/lobby", {"document": document, "revision": revision,
                                                          "message": "test", "rollout": rollout}, method="PUT")


def finished(admin, deployment_id: str, timeout: float) -> dict:
    assert wait_until(lambda: admin.deployment(deployment_id)["status"] != "running", timeout, 0.5), \
        admin.deployment(deployment_id)["counts"]
    return admin.deployment(deployment_id)


def test_a_configuration_goes_to_1000_devices_in_waves_and_their_refusals_trip_the_abort_rate(tmp_path):
    with simulated_fleet(tmp_path / "fleet", devices=DEVICES, groups=("lobby",), interval_s=10.0, ramp_s=10.0,
                         online_timeout=300.0, config_refuse_rate=REFUSE_RATE, seed=7,
                         update_delay_s=(0.01, 0.05)) as fleet:
        admin, simulation = fleet.admin, fleet.simulation
        refusing = {d.device_id for d in simulation.devices if d.config_refuses}
        assert 0.2 * DEVICES < len(refusing) < 0.4 * DEVICES
        waves = plan_waves(fleet.ids, canary_pct=CANARY_PCT, wave_size=WAVE_SIZE)
        assert len(waves) == 1 + math.ceil((DEVICES - len(waves[0])) / WAVE_SIZE)

        # a threshold raised: every wave goes out, each after the one before has finished
        first = {"pipelines": [{"name": "main", "model": "/m/a.tflite", "source": "rtsp://cam/1", "max_fps": 10}]}
        started = time.monotonic()
        saved = save(admin, first, 0, canary_pct=CANARY_PCT, wave_size=WAVE_SIZE, abort_failure_pct=100,
                     canary_analysis=False, device_timeout_s=120)
        done = finished(admin, saved["deployment"]["deployment_id"], 600)
        elapsed = time.monotonic() - started
        targets = {t["device_id"]: t for t in done["devices"]}
        assert done["kind"] == "config" and done["status"] == "failed", done["detail"]
        assert {d for d, t in targets.items() if t["state"] == "failed"} == refusing
        assert all("config_refused" in targets[d]["detail"] for d in refusing)
        assert {d for d, t in targets.items() if t["state"] == "active"} == set(fleet.ids) - refusing
        deployment_id = done["deployment_id"]
        timeline = {d.device_id: d.timeline[deployment_id] for d in simulation.devices}
        for earlier, later in itertools.pairwise(waves):  # as the devices saw it: the last answer, then the next wave
            assert max(timeline[d][1] for d in earlier) < min(timeline[d][0] for d in later)
        statuses = admin._request("GET", "/api/config/devices?group=lobby")
        assert statuses["counts"]["in_step"] == DEVICES - len(refusing)
        assert statuses["counts"]["refused"] == len(refusing) == statuses["out_of_step"]
        refused = next(s for s in statuses["devices"] if s["status"] == "refused")
        assert refused["refused"]["reason"].startswith("config_refused")

        # an abort rate of 10 %: the canary's refusals (about 30 % of it) stop the rollout; no later wave is sent
        second = {"pipelines": [{**first["pipelines"][0], "max_fps": 5}]}
        seen = {d.device_id: set(d.deployments) for d in simulation.devices}
        saved = save(admin, second, 1, canary_pct=CANARY_PCT, wave_size=WAVE_SIZE, abort_failure_pct=10,
                     canary_analysis=False, device_timeout_s=120)
        deployment_id = saved["deployment"]["deployment_id"]
        done = finished(admin, deployment_id, 300)
        canary = set(waves[0])
        assert done["status"] == "aborted" and "failure rate" in done["detail"], done
        assert len(canary & refusing) / len(canary) > 0.10
        targets = {t["device_id"]: t for t in done["devices"]}
        assert {d for d, t in targets.items() if t["state"] != "pending"} == canary
        sent = {d.device_id for d in simulation.devices if set(d.deployments) - seen[d.device_id]}
        assert sent == canary  # the devices of later waves never got the document
        statuses = admin._request("GET", "/api/config/devices?group=lobby")["counts"]
        assert statuses["halted"] == DEVICES - len(canary)
        assert statuses["refused"] == len(canary & refusing) and statuses["in_step"] == len(canary - refusing)
        print(f"\n1,000 devices: a configuration rollout in {len(waves)} waves took {elapsed:.1f} s")

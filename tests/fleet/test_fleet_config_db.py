"""The configuration layers' rows on SQLite and on a real PostgreSQL (edgeinfer/fleet/db/configs.py): a save on a
stale revision stores nothing, two managers saving the same revision at once store one, the newest revision
released to the devices is the one their documents are made of, and what configuration deployments gave."""

from __future__ import annotations

import threading

from support.fleet import state_message

from edgeinfer.fleet.db import FleetDB
from edgeinfer.link.vocabulary import TargetState


def save(db: FleetDB, base: int, document: dict, *, applied: bool = True) -> int | None:
    return db.configs.save("group", "lobby", base=base, document=document, sha256="0" * 64, message="m",
                           author="ops", role="operator", applied=applied)


def test_a_save_on_a_stale_revision_stores_nothing_and_one_of_two_at_once_wins(db_url):
    db = FleetDB(db_url)
    try:
        assert save(db, 0, {"telemetry_interval_s": 2}) == 1
        assert save(db, 0, {"telemetry_interval_s": 3}) is None  # read at 0, the layer is at 1
        assert db.configs.current("group", "lobby")["document"] == {"telemetry_interval_s": 2}
        results: list[int | None] = []
        barrier = threading.Barrier(8)

        def race(value: int) -> None:
            barrier.wait()
            results.append(save(db, 1, {"telemetry_interval_s": value}))

        threads = [threading.Thread(target=race, args=(value,)) for value in range(4, 12)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(30)
        assert sorted(results, key=str) == [2] + [None] * 7, results
        assert [r["revision"] for r in db.configs.history("group", "lobby", 10)] == [2, 1]
    finally:
        db.close()


def test_the_newest_released_revision_is_the_layer_devices_get(db_url):
    db = FleetDB(db_url)
    try:
        save(db, 0, {"telemetry_interval_s": 2})
        save(db, 1, {"telemetry_interval_s": 3}, applied=False)  # a draft
        assert db.configs.current("group", "lobby")["revision"] == 2
        assert [(r["name"], r["revision"]) for r in db.configs.layers(applied=True)] == [("lobby", 1)]
        assert [(r["name"], r["revision"]) for r in db.configs.layers()] == [("lobby", 2)]
        assert db.configs.mark_applied("group", "lobby", 2, "lead") is True
        assert db.configs.mark_applied("group", "lobby", 2, "lead") is False  # once
        assert [(r["revision"], r["applied_by"]) for r in db.configs.layers(applied=True)] == [(2, "lead")]
    finally:
        db.close()


def test_what_configuration_deployments_gave_each_device(db_url):
    db = FleetDB(db_url)
    try:
        for device in ("cam-1", "cam-2"):
            db.record_state("f", device, state_message(device, "b" * 32))
        manifest = {"deployment_id": "d1", "kind": "config", "model_name": "config group:lobby r1", "version": 7,
                    "sha256": "f" * 64, "size": 10, "target": "config:group:lobby r1"}
        db.configs.add_targets([{"deployment_id": "d1", "device_id": d, "sha256": sha, "size": 5,
                                 "layers": [["group:lobby", 1]]} for d, sha in (("cam-1", "a" * 64),
                                                                                ("cam-2", "b" * 64))])
        db.create_deployment(manifest, "sig", {"config": "group:lobby r1"}, [["cam-1"], ["cam-2"]])
        assert db.configs.holds("a" * 64) and db.configs.holds("a" * 64, "cam-1")
        assert not db.configs.holds("a" * 64, "cam-2") and not db.configs.holds("c" * 64)
        db.advance_target("d1", "cam-1", TargetState.NOTIFIED)
        db.advance_target("d1", "cam-1", TargetState.FAILED, "config_refused")
        given = {g["device_id"]: g for g in db.configs.given(["cam-1", "cam-2"])}
        assert given["cam-1"]["state"] == "failed" and given["cam-1"]["detail"] == "config_refused"
        assert given["cam-2"]["state"] == "pending" and given["cam-2"]["version"] == 7
        assert given["cam-1"]["layers"] == [["group:lobby", 1]]
        assert db.configs.newest_version() == 7 and db.configs.halted() == set()
        db.abort_deployment("d1", "failure rate")
        assert db.configs.halted() == {"group:lobby r1"}
    finally:
        db.close()

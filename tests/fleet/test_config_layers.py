"""How the fleet's configuration layers merge (fleet → groups in the device's order → device), where each key of a
device's document comes from, what a layer may hold (the device's own check, without what only a whole document
must have), the diff between revisions, and secrets masked and kept (edgeinfer/fleet/config_layers.py)."""

from __future__ import annotations

import pytest

from edgeinfer.fleet.config_layers import (
    LAYER_SCHEMA,
    LayerKey,
    Scope,
    diff,
    layer_problems,
    layers_of,
    merge,
    redacted,
    restore_secrets,
)
from edgeinfer.fleet.config_rollout import ConfigStatus, Desired, device_status
from edgeinfer.link.config_document import CONFIG_SCHEMA, document_problems

FLEET, LOBBY, DOOR, CAM = (LayerKey(Scope.FLEET, "yard"), LayerKey(Scope.GROUP, "lobby"),
                           LayerKey(Scope.GROUP, "door"), LayerKey(Scope.DEVICE, "cam-1"))
BASE = {"telemetry_interval_s": 2, "pipelines": [
    {"name": "main", "model": "/m/a.tflite", "source": "rtsp://cam/1", "max_fps": 10,
     "probe_backoff": {"initial_s": 1, "max_s": 20}, "lines": ["door=0,0,1,1"]}]}


def test_a_later_layer_replaces_a_key_objects_merge_key_by_key_and_lists_are_replaced_whole():
    group = {"pipelines": [{"name": "main", "max_fps": 5, "probe_backoff": {"max_s": 9}, "lines": ["gate=1,1,2,2"]}]}
    merged = merge([(FLEET, 1, BASE), (LOBBY, 3, group)])
    main = merged.document["pipelines"][0]
    assert main["max_fps"] == 5 and main["model"] == "/m/a.tflite"
    assert main["probe_backoff"] == {"initial_s": 1, "max_s": 9}
    assert main["lines"] == ["gate=1,1,2,2"]  # not door and gate: a list is one value
    assert merged.origins == {"telemetry_interval_s": "fleet:yard", "pipelines[main].name": "fleet:yard",
                              "pipelines[main].model": "fleet:yard", "pipelines[main].source": "fleet:yard",
                              "pipelines[main].max_fps": "group:lobby",
                              "pipelines[main].probe_backoff.initial_s": "fleet:yard",
                              "pipelines[main].probe_backoff.max_s": "group:lobby",
                              "pipelines[main].lines": "group:lobby"}
    assert merged.layers == [(FLEET, 1), (LOBBY, 3)]
    assert document_problems(merged.document) == []


def test_pipelines_merge_by_name_a_new_one_comes_after_and_an_unnamed_one_is_named_by_its_place():
    group = {"pipelines": [{"name": "entrance", "model": "/m/b.tflite", "source": "0"}, {"score_threshold": 0.7}]}
    merged = merge([(FLEET, 1, BASE), (LOBBY, 1, group)])
    assert [p["name"] for p in merged.document["pipelines"]] == ["main", "entrance", "pipeline1"]
    unnamed = merge([(FLEET, 1, BASE), (LOBBY, 1, {"pipelines": [{"score_threshold": 0.7}]})])
    assert [p["name"] for p in unnamed.document["pipelines"]] == ["main"]  # first in its layer: main
    assert unnamed.document["pipelines"][0]["score_threshold"] == 0.7


def test_null_removes_what_the_layers_before_set_and_patch_delete_removes_a_pipeline():
    group = {"pipelines": [{"name": "entrance", "model": "/m/b.tflite", "source": "0"}]}
    device = {"telemetry_interval_s": None,
              "pipelines": [{"name": "main", "max_fps": None, "probe_backoff": {"max_s": None}},
                            {"name": "entrance", "$patch": "delete"}]}
    merged = merge([(FLEET, 1, BASE), (LOBBY, 1, group), (CAM, 1, device)])
    assert "telemetry_interval_s" not in merged.document  # agent.yaml says it again
    assert [p["name"] for p in merged.document["pipelines"]] == ["main"]
    main = merged.document["pipelines"][0]
    assert "max_fps" not in main and main["probe_backoff"] == {"initial_s": 1}
    assert not any(path.startswith("pipelines[entrance]") for path in merged.origins)
    assert merge([(FLEET, 1, BASE), (CAM, 1, {"pipelines": None})]).document == {"telemetry_interval_s": 2}


def test_groups_merge_in_the_order_the_device_lists_them_and_the_device_layer_wins():
    lobby = {"pipelines": [{"name": "main", "max_fps": 5}]}
    door = {"pipelines": [{"name": "main", "max_fps": 7}]}
    keys = layers_of("yard", ["door", "lobby", "door"], "cam-1")
    assert keys == [FLEET, DOOR, LOBBY, CAM]
    stored = {FLEET: BASE, LOBBY: lobby, DOOR: door}
    assert merge([(k, 1, stored[k]) for k in keys if k in stored]).document["pipelines"][0]["max_fps"] == 5
    stored[CAM] = {"pipelines": [{"name": "main", "max_fps": 1}]}
    merged = merge([(k, 1, stored[k]) for k in keys])
    assert merged.document["pipelines"][0]["max_fps"] == 1 and merged.origins["pipelines[main].max_fps"] == \
        "device:cam-1"
    assert merge([]).empty and merge([(FLEET, 1, {})]).layers == []


@pytest.mark.parametrize(("layer", "problem"), [
    ({"pipelines": [{"max_fps": -1}]}, "pipelines[0].max_fps: must be a number > 0, got -1"),
    ({"pipelines": [{"name": "a", "$patch": "delete"}, {"policy": "sometimes"}]},
     "pipelines[1].policy: must be one of every, latest, got 'sometimes'"),
    ({"pipelines": [{"name": "a", "$patch": "remove"}]},
     "pipelines[0].$patch: must be 'delete', beside the pipeline's name and nothing else"),
    ({"pipelines": [{"name": "a"}, {"name": "a"}]}, "pipelines: two pipelines are named 'a'; names must be unique"),
    ({"telemetry_interval_s": 0}, "telemetry_interval_s: must be a number >= 0.01, got 0"),
    ({"update_public_key": "x"}, "update_public_key: set only in the device's agent.yaml (it is the device's "
                                 "bootstrap), not by the fleet"),
    ([], "(top level): must be an object, got list"),
])
def test_a_layer_is_checked_by_the_devices_own_check_in_its_words(layer, problem):
    assert layer_problems(layer)[0] == problem


def test_a_layer_need_not_hold_what_only_a_whole_document_must():
    layer = {"pipelines": [{"name": "main", "score_threshold": 0.6}]}
    assert layer_problems(layer) == [] and layer_problems({}) == []
    assert document_problems(layer) != []  # as a whole document it lacks a model and a source
    assert "required" not in LAYER_SCHEMA["properties"]["pipelines"]["items"]
    assert CONFIG_SCHEMA["properties"]["pipelines"]["items"]["required"] == ["model"]


def test_the_diff_names_each_key_masks_values_and_says_when_only_a_secret_changed():
    before = {"pipelines": [{"name": "main", "source": "rtsp://admin:one@cam/1", "max_fps": 10}]}
    after = {"pipelines": [{"name": "main", "source": "rtsp://admin:two@cam/1", "score_threshold": 0.5}]}
    assert diff(before, after) == [
        {"path": "pipelines[main].max_fps", "op": "remove", "before": 10},
        {"path": "pipelines[main].score_threshold", "op": "add", "after": 0.5},
        {"path": "pipelines[main].source", "op": "change", "before": "rtsp://admin:***@cam/1",
         "after": "rtsp://admin:***@cam/1", "secret": True}]
    assert diff(before, before) == []


def test_secrets_are_masked_and_a_masked_text_sent_back_keeps_the_stored_one():
    stored = {"pipelines": [{"name": "main", "source": "rtsp://admin:pw1@cam-1/x"},
                            {"name": "gst", "source": "rtspsrc location=rtsp://cam-2/y user-pw=pw2 ! fakesink"},
                            {"name": "moved", "source": "rtsp://viewer:pw3@cam-3/z"}]}
    shown = redacted(stored)
    assert "pw1" not in str(shown) and "pw3" not in str(shown)
    assert shown["pipelines"][0]["source"] == "rtsp://admin:***@cam-1/x"
    assert restore_secrets(shown, stored) == stored
    moved = {"pipelines": [shown["pipelines"][2], shown["pipelines"][0]]}  # by its masked text, wherever it went
    assert restore_secrets(moved, stored) == {"pipelines": [stored["pipelines"][2], stored["pipelines"][0]]}
    with pytest.raises(ValueError, match=r"^pipelines\[0\]\.source: holds a masked secret \(\*\*\*\) that matches no "):
        restore_secrets({"pipelines": [{"source": "rtsp://admin:***@cam-9/x"}]}, stored)
    assert restore_secrets({"pipelines": [{"source": "rtsp://admin:new@cam-9/x"}]}, stored) == \
        {"pipelines": [{"source": "rtsp://admin:new@cam-9/x"}]}


def test_a_device_with_no_layer_is_left_alone_whatever_it_runs_unless_the_fleet_gave_it_a_document():
    """No layer sets anything for a device: what it runs is the fleet's to take back to its agent.yaml only when the
    fleet gave it (its layers were emptied since), never a document it got otherwise (by hand, another manager)."""
    nothing = Desired.of(merge([]))
    device = {"device_id": "cam-1", "online": True, "state": {"config": {"sha256": "a" * 64, "revision": 3}}}
    given = [{"deployment_id": "d" * 32, "device_id": "cam-1", "sha256": "a" * 64, "state": "active", "version": 3,
              "status": "succeeded", "detail": None}]
    assert device_status(device, nothing, [])["status"] == ConfigStatus.UNMANAGED
    assert device_status(device, nothing, given)["status"] == ConfigStatus.OUT_OF_STEP
    assert device_status({**device, "state": {"config": {}}}, nothing, given)["status"] == ConfigStatus.UNMANAGED

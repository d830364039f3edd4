"""How a device's answer reads (``fleet/verdicts.py``), on the answers the agent really sends (``agent/commands.py``):
its verdict, its reason and words, a command's summary without secrets, a record in words."""

from __future__ import annotations

from edgeinfer.fleet.verdicts import CommandState, answer_of, record, summary_of


def _event(kind: str, data: dict, message: str = "", cmd_id: str | None = "c1") -> dict:
    return {"event": kind, "cmd_id": cmd_id, "message": message, "data": data}


def test_each_answer_the_agent_sends_reads_as_its_verdict():
    applied = answer_of(_event("cmd_result", {"cmd": "capture", "ok": True, "result": {"frames": 3}}))
    assert (applied.state, applied.result, applied.reason) == (CommandState.APPLIED, {"frames": 3}, None)
    # refused by the router before it ran: the words are in the message, after the command's id
    refused = answer_of(_event("cmd_rejected", {"cmd": "deploy", "reason": "bad_signature"},
                               "command c1 (deploy): the command is not signed by the pinned fleet key"))
    assert (refused.state, refused.reason, refused.message) == (
        CommandState.REFUSED, "bad_signature", "the command is not signed by the pinned fleet key")
    # refused by its handler: the words are the error's, without "command rejected (reason): "
    handler = answer_of(_event("cmd_rejected", {"cmd": "set_analytics", "ok": False, "reason": "outside_frame",
                                                "error": "command rejected (outside_frame): line 'l': point (9, 9) is "
                                                         "outside stream ''s 8x8 frame"},
                               "command c1 (set_analytics) failed: command rejected (outside_frame): …"))
    assert handler.message == "line 'l': point (9, 9) is outside stream ''s 8x8 frame"
    # a repeat answered from the device's log: the first outcome is the verdict, whichever it was
    again = answer_of(_event("cmd_result", {"duplicate": True, "outcome": {"ok": False, "reason": "failed",
                                                                            "error": "no pipeline named 'x'"}}))
    assert (again.state, again.reason, again.message) == (CommandState.REFUSED, "failed", "no pipeline named 'x'")
    assert answer_of(_event("cmd_result", {"duplicate": True, "outcome": None})) is None  # still running then
    assert answer_of(_event("cmd_rejected", {"reason": "busy"}, cmd_id=None)) is None  # names no command
    assert answer_of(_event("pipeline_started", {})) is None
    nul = answer_of(_event("cmd_rejected", {"reason": "bad\x00" + "x" * 200}, "command c1 (ping): a\x00b"))
    assert nul.reason == "bad" + "x" * 61 and nul.message == "ab"  # what a column keeps


def test_a_summary_keeps_no_secret_and_little_of_anything():
    manifest = {"deployment_id": "d1", "model_name": "m.tflite", "version": 2, "sha256": "a" * 64, "url": "http://x"}
    summary = summary_of({"manifest": manifest, "signature": "c2ln", "grant": "secret-grant", "pipeline": "door",
                          "lines": {"b": [0, 0, 1, 1], "a": [1, 1, 2, 2]}, "zones": {}, "revision": 3,
                          "admin_password": "hunter2", "url": "u" * 1000, "points": [[0, 0], [1, 1]]})
    assert summary == {"manifest": {"deployment_id": "d1", "model_name": "m.tflite", "version": 2},
                       "pipeline": "door", "lines": ["a", "b"], "zones": [], "revision": 3, "url": "u" * 256,
                       "points": 2}


def test_a_record_says_its_verdict_in_words():
    row = {"command_id": "c1", "cmd": "set_analytics", "summary": {"revision": 3}, "state": "sent",
           "expires_at": 100.0, "reason": None, "message": None, "result": None, "samples_stored": None,
           "samples_duplicates": None}
    assert (record(row, 50.0)["text"], record(row, 50.0)["settled"]) == ("waiting for the device", False)
    assert record(row, 150.0)["state"] == "expired" and record(row, 150.0)["settled"]
    assert record({**row, "state": "applied"}, 150.0)["text"] == "applied (revision 3)"  # answered: never expired
    refused = record({**row, "state": "refused", "reason": "outside_frame", "message": "line 'l': …"}, 50.0)
    assert refused["text"] == "refused by the device: outside_frame — line 'l': …"
    deploy = {**row, "cmd": "deploy", "summary": {}, "state": "applied",
              "result": {"state": "failed", "reason": "sha256_mismatch"}}
    assert record(deploy, 50.0)["text"] == "applied: failed (sha256_mismatch)"
    capture = {**row, "cmd": "capture", "summary": {"frames": 5}, "state": "applied",
               "result": {"pipeline": "yard", "streams": ["north", "south"], "frames": 5},
               "samples_stored": 1, "samples_duplicates": 2}
    found = record(capture, 50.0)
    assert found["samples"] == {"requested": 10, "stored": 1, "duplicates": 2} and not found["settled"]
    assert found["text"] == "3 of 10 frames captured so far: 1 stored, 2 near-duplicates of stored samples"
    done = record({**capture, "samples_stored": 0, "samples_duplicates": 10}, 50.0)
    assert done["text"] == "10 frames captured: 0 stored, 10 near-duplicates of stored samples" and done["settled"]
    assert "samples_stored" not in done

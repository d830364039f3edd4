"""Signed commands on a real agent through a real Mosquitto, and the command log that refuses replays.

A state-changing command (rollback, restart_pipeline, deploy) runs only when signed by the pinned
fleet key, for this device, before its expiry; anything else is a ``cmd_rejected`` with its reason
and changes nothing. A signed command that ran is never run again: not after a restart, not after
more than 1000 other commands.
"""

from __future__ import annotations

import json
import sqlite3
import time
from pathlib import Path

from support.agent import (
    AgentProcess,
    active_model,
    fleet_key,
    seed_update_history,
    signed_command,
    write_config,
)
from support.assets import IMAGES, MOBILENET_TINY, MOBILENET_TINY_ONNX
from support.broker import Collector

from edgeinfer.agent.commands import COMMAND_LOG_SIZE, UNVERIFIED_PREFIX, CommandLog
from edgeinfer.link.protocol import encode, make_command
from edgeinfer.updates.signing import MAX_COMMAND_TTL_S, SigningKey, canonical_json

CMD = "edgeinfer/v1/test/cam-01/cmd"



def agent_config(tmp_path: Path, broker_url: str, *, key: bool = True, pipeline: bool = True, **values) -> Path:
    base = {"device_id": "cam-01", "fleet": "test", "broker": broker_url, "data_dir": str(tmp_path / "data"),
            "telemetry_interval_s": 0.2, "reconnect_min_s": 0.1, "reconnect_max_s": 1.0, "profile": "none"}
    if key:
        base["update_public_key"] = fleet_key().public_key_b64()
    if pipeline:  # configured: the tiny TFLite model (v1); the slots may say an update (v2) is active
        base["pipelines"] = [{"name": "main", "model": str(MOBILENET_TINY), "source": str(IMAGES / "parrot.jpg"),
                              "loop": True, "max_fps": 5, "threads": 1, "version": "1"}]
    base.update(values)
    return write_config(tmp_path / "agent.yaml", **base)


def events(collector: Collector, name: str) -> list[dict]:
    return [e for e in collector.of_kind("events") if e["event"] == name]


def answers(collector: Collector) -> list[dict]:
    return [e for e in collector.of_kind("events") if e["event"] in ("cmd_result", "cmd_rejected")]


def answer(collector: Collector, command_id: str, timeout: float = 10) -> dict:
    """The one answer to ``command_id`` (fails when none comes)."""
    assert collector.wait_until(lambda c: any(e["cmd_id"] == command_id for e in answers(c)), timeout), \
        f"no answer to {command_id}"
    (found,) = [e for e in answers(collector) if e["cmd_id"] == command_id]
    return found


def pings(collector: Collector) -> list[dict]:
    return [e for e in answers(collector) if (e["cmd_id"] or "").startswith("p-")]


def starts(collector: Collector, boot_id: str | None = None) -> int:
    return len([e for e in events(collector, "pipeline_started")
                if e["pipeline"] == "main" and (boot_id is None or e["boot_id"] == boot_id)])


def unsigned_forged_payload(command_id: str, cmd: str, args: dict | None = None, **fields) -> bytes:
    """A message signed by hand (no expiry, or other fields sign_command would never produce)."""
    message = {**make_command(command_id, cmd, args), **fields}
    message["sig"] = fleet_key().sign_bytes(canonical_json(message))
    return encode(message)


# ------------------------------------------------------------------------------ the command log

def test_command_log_keeps_signed_ids_until_they_expire_and_caps_the_rest(tmp_path):
    log = CommandLog(tmp_path / "commands.sqlite3", size=10)
    now = time.time()
    log.begin("signed-valid", "rollback", expires=now + 3600)
    log.begin("signed-expired", "rollback", expires=now - 1)
    log.begin("ping-1", "ping", verified=False, expires=now + 3600)  # an unverified expiry is not trusted
    for index in range(30):
        log.begin(f"other-{index}", "ping", verified=False)
    assert log.outcome("signed-valid") == (True, None)
    assert not log.outcome("signed-expired")[0]  # past its expiry: capped with the rest, and gone
    assert not log.outcome("ping-1", verified=False)[0]
    assert len(log) == 11  # 10 capped + the one still valid
    # an unverified id lives apart: it can neither answer for, nor be answered by, a signed one
    log.begin("shared", "ping", verified=False)
    log.finish("shared", {"ok": True}, verified=False)
    assert log.outcome("shared", verified=False) == (True, {"ok": True})
    assert log.outcome("shared") == (False, None)
    log.close()


def test_command_log_written_before_signing_is_migrated(tmp_path):
    path = tmp_path / "commands.sqlite3"
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE commands (id TEXT PRIMARY KEY, cmd TEXT NOT NULL, received REAL NOT NULL, "
                 "outcome TEXT)")
    conn.execute("INSERT INTO commands VALUES ('old-1', 'rollback', 1.0, '{\"ok\": true}')")
    conn.commit()
    conn.close()
    log = CommandLog(path)
    assert log.outcome("old-1") == (True, {"ok": True})
    log.begin("new-1", "rollback", expires=time.time() + 60)
    log.close()
    conn = sqlite3.connect(path)
    assert [row[1] for row in conn.execute("PRAGMA table_info(commands)")][-1] == "expires"
    assert conn.execute("SELECT expires IS NULL FROM commands WHERE id = 'old-1'").fetchone() == (1,)
    conn.close()
    CommandLog(path).close()  # opening a migrated log again changes nothing


# ---------------------------------------------------------------------------- a real agent

def test_unsigned_and_forged_state_changing_commands_are_rejected_and_change_nothing(tmp_path, broker):
    data = tmp_path / "data"
    seed_update_history(data, MOBILENET_TINY, MOBILENET_TINY_ONNX)  # v2 active, v1 to roll back to
    config = agent_config(tmp_path, broker.url)
    now = time.time()
    tampered = json.loads(signed_command("c-tampered", "restart_pipeline", {"pipeline": "main"}))
    tampered["args"]["pipeline"] = "other"
    hostile = {  # id -> (payload, the reason expected)
        "c-unsigned-rollback": (encode(make_command("c-unsigned-rollback", "rollback")), "unsigned"),
        "c-unsigned-restart": (encode(make_command("c-unsigned-restart", "restart_pipeline", {"pipeline": "main"})),
                               "unsigned"),
        "c-forged": (signed_command("c-forged", "rollback", key=SigningKey.generate()), "bad_signature"),
        "c-tampered": (encode(tampered), "bad_signature"),
        "c-other-device": (signed_command("c-other-device", "rollback", device="cam-02"), "wrong_device"),
        "c-expired": (signed_command("c-expired", "rollback", expires=now - 5), "expired"),
        "c-too-far": (signed_command("c-too-far", "rollback", expires=now + MAX_COMMAND_TTL_S + 3600),
                      "expiry_too_far"),
        "c-no-expiry": (unsigned_forged_payload("c-no-expiry", "rollback", device="cam-01"), "no_expiry"),
    }
    with Collector(broker.port) as collector, AgentProcess(config, tmp_path / "agent.log") as agent:
        assert collector.wait_subscribed()
        assert collector.wait_until(lambda c: starts(c) == 1 and len(c.of_kind("telemetry")) >= 2, 30), \
            agent.output()
        before = active_model(data)
        assert before["version"] == 2 and before["path"].endswith(".onnx")
        for payload, _reason in hostile.values():
            collector.publish(CMD, payload)
        for command_id, (_payload, expected) in hostile.items():
            rejected = answer(collector, command_id)
            assert (rejected["event"], rejected["data"]["reason"]) == ("cmd_rejected", expected), rejected
        time.sleep(1.0)  # a restart or swap would show by now
        assert active_model(data) == before and starts(collector) == 1
        telemetry = collector.of_kind("telemetry")[-1]["pipelines"][0]
        assert telemetry["restarts"] == 0 and telemetry["status"] == "running"
        assert collector.of_kind("state")[-1]["pipelines"][0]["model"]["version"] == "2"
        log = sqlite3.connect(f"file:{data / 'commands.sqlite3'}?mode=ro", uri=True)
        assert log.execute("SELECT COUNT(*) FROM commands").fetchone() == (0,)  # refused: no trace
        log.close()

        # the same commands, signed by the fleet for this device, do run
        collector.publish(CMD, signed_command("c-rollback", "rollback"))
        assert answer(collector, "c-rollback", 30)["data"]["result"] == {"state": "active", "version": 1}
        assert active_model(data)["version"] == 1
        collector.publish(CMD, signed_command("c-restart", "restart_pipeline", {"pipeline": "main"}))
        assert answer(collector, "c-restart")["data"]["ok"] is True
        assert collector.wait_until(lambda c: starts(c) == 2, 20), agent.output()
        # a replay of the signed rollback is answered from the log and not run (it would roll forward to v2)
        collector.publish(CMD, signed_command("c-rollback", "rollback"))
        assert collector.wait_until(lambda c: len([e for e in answers(c) if e["cmd_id"] == "c-rollback"]) == 2, 10)
        replay = [e for e in answers(collector) if e["cmd_id"] == "c-rollback"][1]
        assert replay["event"] == "cmd_result" and replay["data"]["duplicate"] is True
        assert replay["data"]["outcome"]["result"]["version"] == 1
        time.sleep(0.5)
        assert active_model(data)["version"] == 1 and starts(collector) == 2
        assert agent.alive() and "Traceback" not in agent.output()


def test_an_agent_pinning_no_key_runs_no_state_changing_command(tmp_path, broker):
    config = agent_config(tmp_path, broker.url, key=False, pipeline=False)
    with Collector(broker.port) as collector, AgentProcess(config, tmp_path / "agent.log") as agent:
        assert collector.wait_subscribed()
        assert collector.wait_until(lambda c: len(c.of_kind("telemetry")) >= 1, 20), agent.output()
        collector.publish(CMD, signed_command("c-rollback", "rollback"))
        collector.publish(CMD, signed_command("c-restart", "restart_pipeline", {"pipeline": "main"}))
        collector.publish(CMD, signed_command("c-ping", "ping"))  # changes nothing: needs no key
        assert answer(collector, "c-rollback")["data"]["reason"] == "no_fleet_key"
        assert answer(collector, "c-restart")["data"]["reason"] == "no_fleet_key"
        assert answer(collector, "c-ping")["data"]["result"]["pong"] is True


def test_a_handled_signed_command_is_never_run_again(tmp_path, broker):
    """Not after the agent restarts, and not after 1,100 other commands (more than the log's cap)."""
    config = agent_config(tmp_path, broker.url)
    restart = signed_command("c-restart-once", "restart_pipeline", {"pipeline": "main"})
    with Collector(broker.port) as collector:
        assert collector.wait_subscribed()
        with AgentProcess(config, tmp_path / "agent1.log") as first:
            assert collector.wait_until(lambda c: starts(c) == 1, 30), first.output()
            collector.publish(CMD, restart)
            assert answer(collector, "c-restart-once")["data"]["ok"] is True
            assert collector.wait_until(lambda c: starts(c) == 2, 20), first.output()
            assert first.terminate() == 0

        with AgentProcess(config, tmp_path / "agent2.log") as second:
            assert collector.wait_until(lambda c: len({e["boot_id"] for e in events(c, "agent_started")}) == 2
                                        and starts(c) == 3, 30), second.output()
            boot = events(collector, "agent_started")[-1]["boot_id"]
            collector.publish(CMD, restart)  # after a restart
            assert collector.wait_until(lambda c: len([e for e in answers(c)
                                                       if e["cmd_id"] == "c-restart-once"]) == 2, 10)
            # anybody can send unsigned pings: 1,100 of them must not push the signed id out of the log
            other = COMMAND_LOG_SIZE + 100
            for index in range(other):
                collector.publish(CMD, encode(make_command(f"p-{index}", "ping")))
                if index % 200 == 199:  # in batches: the agent's command queue holds 256
                    assert collector.wait_until(lambda c, n=index + 1: len(pings(c)) >= n, 60), second.output()
            assert collector.wait_until(lambda c: len(pings(c)) == other, 60), second.output()
            assert all(e["event"] == "cmd_result" and e["data"]["ok"] for e in pings(collector))
            collector.publish(CMD, restart)  # after 1,100 others
            assert collector.wait_until(lambda c: len([e for e in answers(c)
                                                       if e["cmd_id"] == "c-restart-once"]) == 3, 10)
            replays = [e for e in answers(collector) if e["cmd_id"] == "c-restart-once"][1:]
            assert all(e["event"] == "cmd_result" and e["data"]["duplicate"] is True for e in replays), replays
            time.sleep(1.0)
            assert starts(collector, boot) == 1  # the pipeline's own start only: never restarted again
            log = sqlite3.connect(f"file:{tmp_path / 'data' / 'commands.sqlite3'}?mode=ro", uri=True)
            ids = [row[0] for row in log.execute("SELECT id FROM commands")]
            log.close()
            assert "c-restart-once" in ids
            assert len([i for i in ids if i.startswith(UNVERIFIED_PREFIX)]) == COMMAND_LOG_SIZE
            assert second.alive() and "Traceback" not in second.output()

"""The agent as a real subprocess against a real Mosquitto: reporting, faults, commands, shutdown.

The fault tests are as short as they can be while still proving the point; the broker outage is
the 10 s the issue asks for.
"""

from __future__ import annotations

import contextlib
import json
import re
import signal
import socket
import sqlite3
import time
import urllib.request
from pathlib import Path

from support.agent import AgentProcess, agent_config, fake_sysfs, fleet_key, signed_command
from support.assets import IMAGES, LABELS, MODELS
from support.broker import Broker, Collector, free_port, make_tls_files, seqs
from support.profiles import fake_root

from edgeinfer.link.protocol import make_command, validate
from edgeinfer.link.vocabulary import Command
from edgeinfer.runtime.model import inspect_model


def assert_all_valid(collector: Collector) -> None:
    """Every message the agent sent matches its schema."""
    for topic, body, _retained in list(collector.messages):
        if topic.endswith("/cmd"):  # what the test itself sent
            continue
        assert isinstance(body, dict), f"non-JSON payload on {topic}: {body!r}"
        validate(topic.rsplit("/", 1)[1], body)


@contextlib.contextmanager
def paused(agent: AgentProcess):
    """SIGSTOP the agent for a moment.

    A restarted broker (persistence off) has no sessions: the collecting "fleet" must be subscribed
    again before the agent reconnects, or the broker would rightly drop messages nobody subscribes
    to yet — that is MQTT's contract, not the agent's. Pausing the agent orders the two.
    """
    agent.signal(signal.SIGSTOP)
    try:
        yield
    finally:
        agent.signal(signal.SIGCONT)


def boots(collector: Collector) -> list[str]:
    out: list[str] = []
    for message in collector.of_kind("telemetry"):
        if message["boot_id"] not in out:
            out.append(message["boot_id"])
    return out


def assert_gapless_exactly_once(messages: list[dict], boot_id: str, upto: int) -> None:
    """Seqs 1..upto of the boot all arrived; every duplicate is the same message (a redelivery)."""
    by_seq: dict[int, dict] = {}
    for message in messages:
        if message["boot_id"] != boot_id or message["seq"] > upto:
            continue
        if message["seq"] in by_seq:
            assert by_seq[message["seq"]] == message, "a seq was reused for a different message"
        by_seq[message["seq"]] = message
    assert sorted(by_seq) == list(range(1, upto + 1)), f"missing: {sorted(set(range(1, upto + 1)) - set(by_seq))}"


def events(collector: Collector, name: str) -> list[dict]:
    return [e for e in collector.of_kind("events") if e["event"] == name]


def last_seq(collector: Collector, boot_id: str) -> int:
    return max(seqs(collector.of_kind("telemetry"), boot_id), default=0)


# --------------------------------------------------------------------------------- reporting

def test_agent_reports_birth_telemetry_metrics_and_shuts_down_cleanly(tmp_path, broker):
    # a Raspberry Pi 4 as far as the agent can tell: its profile is detected, its labelled thermal
    # zone and the firmware's throttling flags are read
    root = fake_sysfs(Path(fake_root(tmp_path / "root", "raspberry-pi-4")), {"cpu-thermal": 61.5}, throttled=0x0)
    notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    notify.bind(str(tmp_path / "notify.sock"))
    notify.settimeout(10)
    # port 0: the agent binds one the kernel picks and logs it (no free_port() another process could take first)
    config = agent_config(tmp_path, broker.url, metrics="127.0.0.1:0", sensors={"root": str(root)})
    systemd = {"NOTIFY_SOCKET": str(tmp_path / "notify.sock"), "WATCHDOG_USEC": "400000"}
    with Collector(broker.port) as collector, AgentProcess(config, tmp_path / "agent.log", env=systemd) as agent:
        assert notify.recv(64) == b"READY=1"
        assert notify.recv(64) == b"WATCHDOG=1" and notify.recv(64) == b"WATCHDOG=1"  # every 0.2 s
        assert collector.wait_subscribed()
        assert collector.wait_until(lambda c: len(c.of_kind("telemetry")) >= 5, 20), agent.output()
        birth = collector.of_kind("state")[0]
        assert birth["online"] is True and birth["device"] == "cam-01" and birth["fleet"] == "test"
        assert birth["profile"] == "raspberry-pi-4"
        delegates = {d["spec"]: d for d in birth["delegates"]}
        assert delegates["xnnpack"]["available"] is True and delegates["xnnpack"]["in_plan"] is True
        assert delegates["coral"]["available"] is False and "libedgetpu" in delegates["coral"]["reason"]
        assert birth["versions"]["paho-mqtt"] and birth["versions"]["edgeinfer"]
        assert events(collector, "agent_started")
        telemetry = collector.of_kind("telemetry")
        boot_id = birth["boot_id"]
        assert {m["boot_id"] for m in telemetry} == {boot_id}
        assert_gapless_exactly_once(telemetry, boot_id, last_seq(collector, boot_id))
        system = telemetry[-1]["system"]
        assert system["temperature_c"] == {"cpu": 61.5}  # the profile's label for cpu-thermal
        assert system["throttled"] is False and system["throttle_flags"] == {"get_throttled": 0}
        assert system["rss_bytes"] > 0 and telemetry[-1]["spool"]["dropped"] == 0
        assert 0.05 < telemetry[-1]["interval_s"] < 1.0

        served = re.search(r"serving /metrics at (http://127\.0\.0\.1:\d+/metrics)", agent.output())
        assert served, agent.output()
        body = urllib.request.urlopen(served.group(1), timeout=5).read().decode()
        assert 'edgeinfer_temperature_celsius{sensor="cpu"} 61.5' in body
        assert "edgeinfer_mqtt_connected 1.0" in body and "edgeinfer_throttled 0.0" in body
        seq_line = next(line for line in body.splitlines() if line.startswith("edgeinfer_telemetry_seq "))
        assert float(seq_line.split()[1]) >= 5

        assert agent.terminate() == 0, agent.output()
        while notify.recv(64) != b"STOPPING=1":  # watchdog pings until then; a timeout fails the test
            pass
        notify.close()
        assert "Traceback" not in agent.output()
        assert collector.wait_until(lambda c: c.of_kind("state")[-1]["online"] is False, 5)
        final = collector.of_kind("state")[-1]
        assert final["reason"] == "shutdown" and final["boot_id"] == boot_id
        assert events(collector, "agent_stopping")
        assert_all_valid(collector)
    # the offline state is retained: a fleet manager that subscribes later sees it
    with Collector(broker.port, "edgeinfer/v1/test/cam-01/state") as late:
        assert late.wait_until(lambda c: len(c.messages) == 1, 5)
        _topic, body, retained = late.messages[0]
        assert retained and body["online"] is False and body["reason"] == "shutdown"


# ------------------------------------------------------------------------------------ faults

def restart_broker_behind(agent: AgentProcess, broker, collector) -> float:
    """Start the killed broker again, the collector subscribed before the agent reconnects; when it
    restarted, once telemetry stamped after the restart has arrived."""
    with paused(agent):
        broker.start()
        assert collector.wait_subscribed(10)
    restarted = time.time()
    assert collector.wait_until(
        lambda c: any(m["ts"] > restarted + 1 for m in c.of_kind("telemetry")), 20), agent.output()
    return restarted


def test_broker_killed_for_10s_loses_no_telemetry(tmp_path, broker):
    config = agent_config(tmp_path, broker.url, pipelines=[  # a real, light pipeline keeps running meanwhile
        {"name": "main", "model": str(MODELS / "mobilenet_v1_0.25_128_quant.tflite"), "source": str(IMAGES / "*.jpg"),
         "loop": True, "max_fps": 10, "threads": 1}])
    with Collector(broker.port) as collector, AgentProcess(config, tmp_path / "agent.log") as agent:
        assert collector.wait_subscribed()
        assert collector.wait_until(lambda c: len(c.of_kind("telemetry")) >= 10, 20), agent.output()
        boot_id = boots(collector)[0]
        before = last_seq(collector, boot_id)

        broker.kill()  # SIGKILL: every session and in-flight message on the broker is gone
        killed = time.time()
        time.sleep(10)
        restarted = restart_broker_behind(agent, broker, collector)
        upto = last_seq(collector, boot_id)
        assert_gapless_exactly_once(collector.of_kind("telemetry"), boot_id, upto)
        during = [m for m in collector.of_kind("telemetry") if killed < m["ts"] < restarted]
        assert len({m["seq"] for m in during}) >= 70  # ~10 per second were spooled during the outage
        assert sum(m["pipelines"][0]["frames"] for m in during) >= 50  # the pipeline ran on, offline
        # the outage starts right after the last window stamped before the kill (a window stamped just
        # before the kill may itself have reached the collector only after the restart)
        stamped_before = [m["seq"] for m in collector.of_kind("telemetry") if m["boot_id"] == boot_id
                          and m["ts"] <= killed]
        assert max(stamped_before) >= before and min(m["seq"] for m in during) == max(stamped_before) + 1
        assert all(m["spool"]["dropped"] == 0 for m in collector.of_kind("telemetry"))
        assert boots(collector) == [boot_id] and agent.alive()
        assert collector.wait_until(lambda c: events(c, "mqtt_reconnected"), 5)
        assert events(collector, "mqtt_reconnected")[0]["data"]["offline_s"] >= 10
        assert_all_valid(collector)


def _spooled_telemetry(data_dir: Path) -> list[dict]:
    """What a dead agent left in its spool (read-only, the way an investigator would)."""
    conn = sqlite3.connect(f"file:{data_dir / 'spool.sqlite3'}?mode=ro", uri=True)
    try:
        rows = conn.execute("SELECT topic, payload FROM messages ORDER BY id").fetchall()
    finally:
        conn.close()
    return [json.loads(p) for t, p in rows if t.endswith("/telemetry")]


def test_agent_killed_during_outage_delivers_its_spool_after_restart(tmp_path, broker):
    config = agent_config(tmp_path, broker.url)
    with Collector(broker.port) as collector:
        assert collector.wait_subscribed()
        first = AgentProcess(config, tmp_path / "agent1.log").start()
        try:
            assert collector.wait_until(lambda c: len(c.of_kind("telemetry")) >= 5, 20), first.output()
            old_boot = boots(collector)[0]
            # the broker sees the agent's TCP connection die: its Last Will marks the device offline
            broker.kill()
            time.sleep(1.5)
        finally:
            first.kill()  # SIGKILL while the broker is down: whatever paho held in memory is gone
        spooled = [m for m in _spooled_telemetry(tmp_path / "data") if m["boot_id"] == old_boot]
        assert len(spooled) >= 10, "the outage should have left telemetry in the spool"
        old_last = max(m["seq"] for m in spooled)

        broker.start()
        assert collector.wait_subscribed(10)
        with AgentProcess(config, tmp_path / "agent2.log") as second:
            assert collector.wait_until(lambda c: len(boots(c)) == 2 and last_seq(c, boots(c)[1]) >= 5, 20), \
                second.output()
            assert collector.wait_until(lambda c: last_seq(c, old_boot) >= old_last, 10)
            new_boot = boots(collector)[1]
            assert new_boot != old_boot
            telemetry = collector.of_kind("telemetry")
            assert_gapless_exactly_once(telemetry, old_boot, old_last)  # nothing of the old boot is lost
            assert_gapless_exactly_once(telemetry, new_boot, last_seq(collector, new_boot))  # new seq from 1
            # the old boot's spool drained before the new boot's first window (order is kept)
            order = [(m["boot_id"], m["seq"]) for m in telemetry]
            assert order.index((old_boot, old_last)) < order.index((new_boot, 1))
            assert collector.of_kind("state")[-1]["online"] is True
            assert collector.of_kind("state")[-1]["boot_id"] == new_boot
            assert_all_valid(collector)


def test_last_will_marks_a_crashed_agent_offline(tmp_path, broker):
    config = agent_config(tmp_path, broker.url)
    with Collector(broker.port) as collector, AgentProcess(config, tmp_path / "agent.log") as agent:
        assert collector.wait_subscribed()
        assert collector.wait_until(lambda c: c.of_kind("state") and c.of_kind("state")[-1]["online"], 20)
        agent.kill()
        assert collector.wait_until(lambda c: c.of_kind("state")[-1]["online"] is False, 10)
        will = collector.of_kind("state")[-1]
        assert will["reason"] == "connection lost" and will["boot_id"] == collector.of_kind("state")[0]["boot_id"]
        validate("state", will)


def test_long_outage_with_small_spool_stays_in_bound_and_counts_drops(tmp_path, broker):
    bound = 256 * 1024
    config = agent_config(tmp_path, broker.url, spool_max_bytes=bound, telemetry_interval_s=0.02)
    spool_files = [tmp_path / "data" / f"spool.sqlite3{suffix}" for suffix in ("", "-wal", "-shm")]

    def disk() -> int:
        return sum(f.stat().st_size for f in spool_files if f.exists())

    with Collector(broker.port) as collector, AgentProcess(config, tmp_path / "agent.log") as agent:
        assert collector.wait_subscribed()
        assert collector.wait_until(lambda c: len(c.of_kind("telemetry")) >= 5, 20), agent.output()
        boot_id = boots(collector)[0]
        broker.kill()
        peak = 0
        end = time.monotonic() + 6  # ~300 windows of ~1 KiB into a spool that holds ~50
        while time.monotonic() < end:
            peak = max(peak, disk())
            time.sleep(0.02)
        restart_broker_behind(agent, broker, collector)
        peak = max(peak, disk())
        assert peak <= bound, f"spool reached {peak} bytes on disk, bound {bound}"
        telemetry = collector.of_kind("telemetry")
        last = max(telemetry, key=lambda m: m["seq"])
        dropped = last["spool"]["dropped"]
        received = {m["seq"] for m in telemetry if m["boot_id"] == boot_id}
        assert dropped > 50 and last["spool"]["dropped_events"] == 0  # telemetry goes first, events stay
        # every seq up to the last is either delivered or counted as dropped — never silently lost
        assert len(received) + dropped == last["seq"]
        assert received >= set(range(last["seq"] - 40, last["seq"] + 1))  # the newest windows survived
        assert agent.alive()


def test_unreachable_broker_at_start_is_no_crash_loop(tmp_path):
    port = free_port()
    config = agent_config(tmp_path, f"mqtt://127.0.0.1:{port}", reconnect_max_s=0.5)
    data = tmp_path / "data"  # and its state files were damaged (a disk error, a bad copy): not fatal either
    data.mkdir()
    (data / "spool.sqlite3").write_bytes(b"\x00garbage" * 1000)
    (data / "commands.sqlite3").write_bytes(b"not sqlite" * 1000)
    with AgentProcess(config, tmp_path / "agent.log") as agent:
        assert agent.wait_for_output(f"connection to 127.0.0.1:{port} refused — is the broker running", 20)
        assert "spool" in agent.output() and "is unreadable" in agent.output()
        assert len(list(data.glob("*.corrupt-*"))) == 2
        # ten windows measured while the broker is unreachable (waited for in its spool, not assumed from a sleep)
        deadline = time.monotonic() + 30
        while len(_spooled_telemetry(data)) < 10 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert len(_spooled_telemetry(data)) >= 10, agent.output()
        assert agent.alive()  # a daemon waits for its broker; it does not exit (and get restarted in a loop)
        b = Broker(tmp_path / "broker", port=port)
        with Collector(port) as collector:
            try:
                with paused(agent):
                    b.start()
                    assert collector.wait_subscribed(10)
                assert collector.wait_until(lambda c: len(c.of_kind("telemetry")) >= 3, 20), agent.output()
                boot_id = boots(collector)[0]
                # what was measured while the broker was unreachable arrives too, from seq 1 (the spool drains in
                # order: waited for, as a loaded machine drains it slower than the first three arrive)
                assert collector.wait_until(lambda c: last_seq(c, boot_id) >= 10, 20), agent.output()
                assert_gapless_exactly_once(collector.of_kind("telemetry"), boot_id, last_seq(collector, boot_id))
            finally:
                b.kill()


def test_agent_over_tls_with_client_certificate(tmp_path):
    tls = make_tls_files(tmp_path / "tls")
    b = Broker(tmp_path / "broker", tls=tls).start()
    try:
        config = agent_config(tmp_path, b.url, ca=str(tls.ca), cert=str(tls.client_cert), key=str(tls.client_key))
        with Collector(b.port, tls=tls) as collector, AgentProcess(config, tmp_path / "agent.log") as agent:
            assert collector.wait_subscribed()
            assert collector.wait_until(lambda c: len(c.of_kind("telemetry")) >= 3, 20), agent.output()
            assert collector.of_kind("telemetry")[-1]["mqtt"]["connected"] is True
    finally:
        b.kill()


# ---------------------------------------------------------------------------------- commands

def test_malformed_commands_get_error_events_and_change_nothing(tmp_path, broker):
    config = agent_config(tmp_path, broker.url, telemetry_interval_s=0.2,
                          update_public_key=fleet_key().public_key_b64())
    cmd_topic = "edgeinfer/v1/test/cam-01/cmd"
    bad = [
        b"\xff\xfe not utf-8",
        b"{not json",
        b'{"v": 1, "type": "cmd", "cmd": "ping"}',                                   # no id
        json.dumps({"v": 1, "type": "cmd", "id": "c-unknown", "cmd": "format_disk"}).encode(),
        # signed by the fleet (a state-changing command must be), and still wrong
        signed_command("c-args", "restart_pipeline", {"pipeline": "main", "now": True}),
        signed_command("c-nopipe", "restart_pipeline", {"pipeline": "nope"}),
        signed_command("c-nocapture", "sample", {"pipeline": "main", "frames": 3}),  # it has no pipeline
        signed_command("c-frames", "sample", {"pipeline": "main", "frames": 0}),
        signed_command("c-oldname", "capture", {"pipeline": "main", "frames": 3}),  # sample's old name, an alias
        json.dumps({"v": 1, "type": "cmd", "id": "c-old", "cmd": "ping", "expires": 1000.0}).encode(),
        json.dumps({"v": 1, "type": "cmd", "id": "c-extra", "cmd": "ping", "admin": True}).encode(),
    ]
    with Collector(broker.port) as collector, AgentProcess(config, tmp_path / "agent.log") as agent:
        assert collector.wait_subscribed()
        assert collector.wait_until(lambda c: len(c.of_kind("state")) >= 1 and len(c.of_kind("telemetry")) >= 2,
                                    20), agent.output()
        state_before = collector.of_kind("state")[-1]
        for payload in bad:
            collector.publish(cmd_topic, payload)
        assert collector.wait_until(lambda c: len(events(c, "cmd_rejected")) == len(bad), 10), \
            [e["message"] for e in collector.of_kind("events")]
        rejected = events(collector, "cmd_rejected")
        assert sorted((e["cmd_id"] or "", e["data"]["reason"]) for e in rejected) == [
            ("", "invalid"), ("", "invalid"), ("", "invalid"), ("c-args", "invalid_args"), ("c-extra", "invalid"),
            ("c-frames", "invalid_args"), ("c-nocapture", "failed"), ("c-nopipe", "failed"), ("c-old", "expired"),
            ("c-oldname", "failed"), ("c-unknown", "unknown_command")]
        assert all(e["level"] == "error" for e in rejected)
        by_id = {e["cmd_id"]: e for e in rejected}
        assert f"known: {', '.join(sorted(command.value for command in Command))})" in by_id["c-unknown"]["message"]
        assert "no pipeline named 'nope'" in by_id["c-nopipe"]["message"]
        assert "no pipeline named 'main'" in by_id["c-nocapture"]["message"]
        assert "no pipeline named 'main'" in by_id["c-oldname"]["message"]  # the old name runs the same handler
        assert ".admin: unknown key" in by_id["c-extra"]["message"]

        # a good command works, and a repeated id is not run twice
        ping = json.dumps(make_command("c-ping-1", "ping")).encode()
        collector.publish(cmd_topic, ping)
        collector.publish(cmd_topic, ping)
        assert collector.wait_until(lambda c: len(events(c, "cmd_result")) == 2, 10)
        first, second = events(collector, "cmd_result")
        assert first["cmd_id"] == "c-ping-1" and first["data"]["ok"] is True
        assert first["data"]["result"]["pong"] is True and "duplicate" not in first["data"]
        assert second["data"]["duplicate"] is True and second["data"]["outcome"]["ok"] is True

        time.sleep(0.5)
        assert agent.alive() and "Traceback" not in agent.output()
        assert collector.of_kind("state")[-1] == state_before  # nothing changed
        assert_all_valid(collector)

    with Collector(broker.port) as collector:
        # the device is away: the broker keeps its persistent session and queues this for it
        assert collector.wait_subscribed()
        collector.publish(cmd_topic, json.dumps(make_command("c-while-away", "ping")).encode())
        with AgentProcess(config, tmp_path / "agent2.log") as again:
            assert collector.wait_until(lambda c: len(events(c, "cmd_result")) == 1, 20), again.output()
            assert events(collector, "cmd_result")[0]["cmd_id"] == "c-while-away"
            # the command log outlives the process: the same id after a restart is still a duplicate
            collector.publish(cmd_topic, json.dumps(make_command("c-ping-1", "ping")).encode())
            assert collector.wait_until(lambda c: len(events(c, "cmd_result")) == 2, 10)
            assert events(collector, "cmd_result")[1]["data"]["duplicate"] is True



# --------------------------------------------------------------------------------- pipelines

def test_failing_pipeline_is_restarted_with_backoff_while_reporting_goes_on(tmp_path, broker):
    broken = MODELS / "model_invoking_error.tflite"  # its custom op is unresolved: loading fails
    config = agent_config(tmp_path, broker.url, restart_min_s=0.2, restart_max_s=0.8, pipelines=[
        {"name": "main", "model": str(broken), "source": str(IMAGES / "parrot.jpg"), "loop": True}])
    with Collector(broker.port) as collector, AgentProcess(config, tmp_path / "agent.log") as agent:
        assert collector.wait_subscribed()
        assert collector.wait_until(lambda c: len(events(c, "pipeline_restarting")) >= 4, 30), agent.output()
        failed = events(collector, "pipeline_failed")
        assert failed and failed[0]["pipeline"] == "main" and failed[0]["level"] == "error"
        assert "fake-op-double" in failed[0]["data"]["error"]  # the real reason, from the runtime
        delays = [e["data"]["delay_s"] for e in events(collector, "pipeline_restarting")]
        assert delays[0] <= 0.2 and max(delays) <= 0.8 and delays[3] > delays[0]  # exponential, capped
        assert agent.alive()
        assert collector.wait_until(lambda c: len(c.of_kind("telemetry")) >= 10, 10)  # reporting goes on
        telemetry = collector.of_kind("telemetry")
        entry = telemetry[-1]["pipelines"][0]
        assert entry["name"] == "main" and entry["status"] in ("starting", "failed", "restarting")
        assert entry["restarts"] >= 3 and entry["fps"] == 0
        state = collector.of_kind("state")[-1]
        assert state["pipelines"][0]["error"] or state["pipelines"][0]["status"] in ("starting", "restarting")
        assert_all_valid(collector)


def test_agent_runs_real_pipelines_and_reports_what_they_do(tmp_path, broker):
    model = MODELS / "mobilenet_v1_0.25_128_quant.tflite"
    config = agent_config(tmp_path, broker.url, telemetry_interval_s=0.25,
                          update_public_key=fleet_key().public_key_b64(), pipelines=[
        {"name": "main", "model": str(model), "source": str(IMAGES / "*.jpg"), "loop": True, "max_fps": 20,
         "labels": str(LABELS / "imagenet_labels.txt"), "delegate": "xnnpack", "threads": 1, "version": "1"},
        {"name": "once", "model": str(model), "source": str(IMAGES / "parrot.jpg"), "threads": 1},
        # ^ one still image: that run ends, and the agent goes on
        {"name": "tpu", "model": str(MODELS / "mobilenet_v1_0.25_128_quant_edgetpu.tflite"), "delegate": "coral",
         "source": str(IMAGES / "cat.bmp"), "threads": 1},
        # ^ no Edge TPU here: the Edge TPU model falls back to its CPU twin, and says why
    ])
    with Collector(broker.port) as collector, AgentProcess(config, tmp_path / "agent.log") as agent:
        assert collector.wait_subscribed()

        def running_for_a_while(c: Collector) -> bool:
            frames = [p["frames"] for m in c.of_kind("telemetry") for p in m["pipelines"] if p["name"] == "main"]
            return sum(frames) >= 30

        assert collector.wait_until(running_for_a_while, 40), agent.output()
        assert collector.wait_until(lambda c: len(events(c, "pipeline_ended")) == 2, 10)
        ended = {e["pipeline"]: e for e in events(collector, "pipeline_ended")}
        assert ended["once"]["data"]["frames"] == 1 and ended["tpu"]["data"]["frames"] == 1
        started = {e["pipeline"]: e for e in events(collector, "pipeline_started")}
        assert started["main"]["data"]["delegate"] == "xnnpack"
        assert collector.wait_until(lambda c: events(c, "fallback"), 10)
        fallback = events(collector, "fallback")[0]
        assert fallback["pipeline"] == "tpu" and fallback["level"] == "warning"
        assert fallback["data"]["delegate"] == "xnnpack" and "libedgetpu" in fallback["data"]["reason"]
        assert started["tpu"]["data"]["model"]["path"].endswith("mobilenet_v1_0.25_128_quant.tflite")  # the twin

        window = collector.of_kind("telemetry")[-1]
        main = next(p for p in window["pipelines"] if p["name"] == "main")
        once = next(p for p in window["pipelines"] if p["name"] == "once")
        assert main["status"] == "running" and main["delegate"] == "xnnpack"
        assert 5 < main["fps"] <= 25  # max_fps 20 (the window's own fps, not a guess)
        assert set(main["stages"]) >= {"capture", "preprocess", "infer", "postprocess", "latency"}
        infer = main["stages"]["infer"]
        assert 0 < infer["p50"] <= infer["p95"] <= infer["p99"]
        assert main["stages"]["latency"]["p50"] >= infer["p50"]
        assert once["status"] == "ended" and once["frames"] == 0

        state = collector.of_kind("state")[-1]
        described = {p["name"]: p for p in state["pipelines"]}
        assert described["main"]["model"]["sha256"] == inspect_model(model).sha256
        assert described["main"]["model"]["version"] == "1" and described["main"]["model"]["format"] == "tflite"
        assert described["main"]["status"] == "running" and described["once"]["status"] == "ended"
        assert described["tpu"]["delegate"] == "xnnpack" and "libedgetpu" in described["tpu"]["fallback_reason"]

        # a restart command restarts just that pipeline; it comes back on its own
        collector.publish("edgeinfer/v1/test/cam-01/cmd",
                          signed_command("c-restart-1", "restart_pipeline", {"pipeline": "main"}))
        assert collector.wait_until(lambda c: len([e for e in events(c, "pipeline_started")
                                                   if e["pipeline"] == "main"]) == 2, 20), agent.output()
        assert events(collector, "cmd_result")[0]["data"]["result"] == {"pipeline": "main"}
        assert collector.wait_until(lambda c: any(
            p["name"] == "main" and p["restarts"] == 1 and p["frames"] > 0
            for m in c.of_kind("telemetry") for p in m["pipelines"]), 10)

        assert agent.terminate() == 0, agent.output()
        assert collector.wait_until(lambda c: c.of_kind("state")[-1]["online"] is False, 5)
        assert {p["status"] for p in collector.of_kind("state")[-1]["pipelines"]} == {"stopped"}
        assert_all_valid(collector)


def test_runner_hot_swaps_the_engine_without_stopping_capture(tmp_path):
    from edgeinfer.agent.config import parse_config
    from edgeinfer.agent.runner import PipelineRunner
    from edgeinfer.runtime.selection import load

    bird = MODELS / "mobilenet_v2_1.0_224_inat_bird_quant.tflite"
    config = parse_config({"device_id": "cam-01", "pipelines": [{
        "name": "main", "model": str(MODELS / "mobilenet_v1_0.25_128_quant.tflite"),
        "source": str(IMAGES / "*.jpg"), "loop": True, "max_fps": 30, "threads": 1, "version": "1"}]})
    seen: list[tuple[str, str | None]] = []
    runner = PipelineRunner(config.pipelines[0], emit=lambda event, *a, **k: seen.append((event, k.get("pipeline"))),
                            on_change=lambda: None).start()
    try:
        deadline = time.monotonic() + 30
        while runner.status != "running" and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.5)
        before = runner.take_window()
        assert before.frames > 0
        old = runner.swap_engine(load(bird, "xnnpack", threads=1), version="2")
        old.close()
        time.sleep(0.7)
        after = runner.take_window()
        assert after.frames > 0 and runner.status == "running"  # it never stopped
        described = runner.describe()
        assert described["model"]["sha256"] == inspect_model(bird).sha256 and described["model"]["version"] == "2"
        assert runner.config.model == str(bird)  # a later restart loads the new model
        assert [e for e, _ in seen].count("pipeline_started") == 1
    finally:
        runner.stop()
    assert runner.status == "stopped"


def test_runner_restarts_a_failing_pipeline_with_capped_jittered_backoff():
    from edgeinfer.agent.config import parse_config
    from edgeinfer.agent.runner import PipelineRunner

    config = parse_config({"device_id": "cam-01", "pipelines": [{"name": "main", "model": "m.tflite", "source": 0}]})
    restarting: list[dict] = []

    def emit(event, level, message, **fields):
        if event == "pipeline_restarting":
            restarting.append(fields["data"])

    def no_camera(_config):
        raise RuntimeError("no camera")

    runner = PipelineRunner(config.pipelines[0], emit=emit, on_change=lambda: None, factory=no_camera,
                            restart_min_s=0.1, restart_max_s=0.4).start()
    try:
        deadline = time.monotonic() + 30
        while len(restarting) < 5 and time.monotonic() < deadline:
            time.sleep(0.02)
    finally:
        runner.stop()
    assert [r["attempt"] for r in restarting[:5]] == [1, 2, 3, 4, 5]
    for entry in restarting[:5]:  # equal jitter: between half and all of min(max, min * 2^(n-1))
        base = min(0.4, 0.1 * 2 ** (entry["attempt"] - 1))
        assert base / 2 - 0.005 <= entry["delay_s"] <= base + 0.005
    assert runner.last_error == "RuntimeError: no camera" and runner.status == "stopped"


def test_plugins_see_the_agent_through_its_services_interface(tmp_path):
    from edgeinfer.agent.config import parse_config
    from edgeinfer.agent.daemon import Agent
    from edgeinfer.agent.services import AgentServices

    agent = Agent(parse_config({"device_id": "cam-01", "data_dir": str(tmp_path / "data")}))
    assert isinstance(agent, AgentServices)
    assert agent.runners == [] and agent.spool is None and agent.link is None and not agent.stopping
    agent.stop()
    assert agent.stopping

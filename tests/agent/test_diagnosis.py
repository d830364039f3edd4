"""The agent's side of logs and diagnosis from afar: its log ring (agent/log_ring.py) — bounded by lines and bytes,
redacted before a line enters it, stderr's threshold unchanged — and the ``logs`` and ``doctor`` commands
(agent/diagnosis.py) against a real HTTP server standing where the fleet manager takes them: the lines after the
manager's newest, new lines while followed and none after, a byte budget no request can raise, and a doctor that
crashes or hangs costing the agent nothing."""

from __future__ import annotations

import io
import json
import logging
import sys
import time
from dataclasses import dataclass
from types import SimpleNamespace

import pytest
from support.frame_sink import FrameSink
from support.processes import wait_until

from edgeinfer.agent.diagnosis import DoctorRunner, LogSender
from edgeinfer.agent.log_ring import LINE_OVERHEAD, LogRing
from edgeinfer.agent.telemetry import BootSequence
from edgeinfer.agent.uploads import DeviceHTTP
from edgeinfer.errors import CommandRejected

SECRET = "pa55word"


@dataclass
class Agent:
    boot: BootSequence


def context(agent: Agent, command_id: str = "c-1") -> SimpleNamespace:
    return SimpleNamespace(agent=agent, command_id=command_id, message={})


def logger_with(ring: LogRing, name: str = "edgeinfer.test") -> logging.Logger:
    log = logging.getLogger(name)
    log.setLevel(logging.DEBUG)
    log.propagate = False
    log.handlers = [ring]
    return log


def posted(sink: FrameSink) -> list[dict]:
    return [json.loads(post.body) for post in sink.posts]


# ------------------------------------------------------------------------------------------------ the ring
def test_the_ring_keeps_the_newest_lines_within_its_bounds_and_numbers_them():
    ring = LogRing(max_lines=50, max_bytes=4000)
    log = logger_with(ring)
    for n in range(200):
        log.info("line %d %s", n, "x" * 20)
    log.debug("not kept: below the ring's level")
    assert ring.newest_seq == 200 and len(ring) <= 50
    lines, more = ring.after(0, max_lines=1000, max_bytes=1 << 20)
    assert not more and [line["seq"] for line in lines] == list(range(201 - len(lines), 201))
    assert sum(len(line["message"]) + len(line["logger"]) + LINE_OVERHEAD for line in lines) <= 4000
    assert ring.evicted == 200 - len(lines)
    assert lines[-1] == {"seq": 200, "ts": lines[-1]["ts"], "level": "info", "logger": "edgeinfer.test",
                         "message": f"line 199 {'x' * 20}"}
    page, more = ring.after(195, max_lines=3, max_bytes=1 << 20)
    assert [line["seq"] for line in page] == [196, 197, 198] and more
    assert ring.after(200, max_lines=10, max_bytes=10) == ([], False)


def test_a_secret_never_enters_the_ring_not_even_in_a_traceback():
    ring = LogRing()
    log = logger_with(ring)
    url = f"rtsp://admin:{SECRET}@10.1.2.3:554/Streaming/Channels/101"
    log.error("cannot open %s", url)
    try:
        raise OSError(f"[Errno 111] Connection refused: '{url}'")
    except OSError:
        log.exception("pipeline main failed")
    log.warning("mqtt password: %s, token=%s", SECRET, SECRET)
    lines, _ = ring.after(0, max_lines=10, max_bytes=1 << 20)
    assert len(lines) == 3 and not any(SECRET in line["message"] for line in lines), lines
    assert "rtsp://admin:***@10.1.2.3:554/Streaming/Channels/101" in lines[0]["message"]
    assert "Traceback" in lines[1]["message"] and "admin:***@10.1.2.3" in lines[1]["message"]


def test_a_long_message_is_cut_after_it_is_masked():
    ring = LogRing()
    logger_with(ring).info("%s rtsp://u:%s@host/x", "y" * 3990, SECRET)  # the secret straddles the cut
    [line], _ = ring.after(0, max_lines=1, max_bytes=1 << 20)
    assert len(line["message"]) == 4000 and SECRET[:3] not in line["message"][3990:]


def test_installed_on_the_root_logger_it_takes_info_and_stderr_shows_what_it_showed():
    root = logging.getLogger()
    saved = root.level, root.handlers[:]
    stream = io.StringIO()
    console = logging.StreamHandler(stream)
    root.handlers, root.level = [console], logging.WARNING
    ring = LogRing()
    try:
        ring.install()
        logging.getLogger("edgeinfer.x").info("an info line")
        logging.getLogger("edgeinfer.x").warning("a warning")
        assert [line["message"] for line in ring.after(0, max_lines=10, max_bytes=1 << 20)[0]] == [
            "an info line", "a warning"]
        assert stream.getvalue() == "a warning\n"  # the console's threshold is what the root's was
        ring.uninstall()
        assert root.level == logging.WARNING and console.level == logging.NOTSET and ring not in root.handlers
    finally:
        root.handlers, root.level = saved[1], saved[0]


# ------------------------------------------------------------------------------------------ the command
@pytest.fixture
def sender_world():
    ring = LogRing()
    log = logger_with(ring, "edgeinfer.device")
    agent = Agent(BootSequence())
    with FrameSink() as sink:
        sender = LogSender(agent, DeviceHTTP(("edgeinfer-f-cam", "pw")), ring, min_interval_s=0.2)
        try:
            yield sender, log, agent, sink, sink.url.rsplit("/", 1)[0] + "/logs"
        finally:
            sender.close()


def test_the_lines_after_the_managers_newest_then_new_ones_while_followed_and_none_after(sender_world):
    sender, log, agent, sink, url = sender_world
    for n in range(5):
        log.info("before %d", n)
    answer = sender.handle({"url": url, "boot_id": agent.boot.boot_id, "after": 2}, context(agent))
    assert answer["newest_seq"] == 5 and answer["coalesced"] is False
    assert wait_until(lambda: sink.posts, 10)
    [first] = posted(sink)
    assert [line["message"] for line in first["lines"]] == ["before 2", "before 3", "before 4"]
    assert first["boot_id"] == agent.boot.boot_id and first["complete"] is True and first["command_id"] == "c-1"
    assert sink.posts[0].headers["Authorization"].startswith("Basic ")
    # another boot's "after" means nothing here: everything is sent
    sender.handle({"url": url, "boot_id": "0" * 32, "after": 4, "until": time.time() + 2}, context(agent, "c-2"))
    assert wait_until(lambda: len(sink.posts) >= 2, 10)
    assert [line["seq"] for line in posted(sink)[1]["lines"]] == [1, 2, 3, 4, 5]
    log.warning("while followed")
    assert wait_until(lambda: any(line["message"] == "while followed" for body in posted(sink)
                                  for line in body["lines"]), 10)
    time.sleep(2.5)  # until has passed
    count = len(sink.posts)
    log.warning("nobody follows")
    time.sleep(1.5)
    assert len(sink.posts) == count
    with pytest.raises(CommandRejected, match="has passed"):
        sender.handle({"url": url, "until": time.time() - 1}, context(agent, "c-3"))
    with pytest.raises(CommandRejected, match="more than 300 s ahead"):
        sender.handle({"url": url, "until": time.time() + 3600}, context(agent, "c-4"))


def test_no_request_raises_the_byte_budget(sender_world):
    sender, log, agent, sink, url = sender_world
    sender.budget = type(sender.budget)(16 * 1024, 60.0)  # 16 KiB a minute
    for n in range(400):
        log.info("%04d %s", n, "z" * 200)  # ~100 KiB in the ring
    started = time.monotonic()
    for n in range(100):  # each asks for the whole ring again
        sender.handle({"url": url}, context(agent, f"f-{n}"))
        time.sleep(0.03)
    time.sleep(3.0)
    elapsed = time.monotonic() - started
    sent = sum(len(post.body) for post in sink.posts)
    assert sender.coalesced >= 90
    assert 0 < sent <= 16 * 1024 + elapsed * 16 * 1024 / 60 + 4096, (sent, elapsed)
    assert len(sink.posts) <= elapsed / 0.2 + 2


def test_a_refusing_manager_stops_the_sending(sender_world):
    sender, log, agent, sink, url = sender_world
    sink.answer = 403
    log.info("a line")
    sender.handle({"url": url, "until": time.time() + 30}, context(agent))
    assert wait_until(lambda: sink.posts, 10)
    log.info("another")
    time.sleep(1.5)
    assert len(sink.posts) == 1  # refused once: not asked again until the next request


# ------------------------------------------------------------------------------------------------ doctor
def run_doctor(command: list[str], timeout_s: float = 30) -> tuple[DoctorRunner, dict]:
    with FrameSink() as sink:
        runner = DoctorRunner(DeviceHTTP(None), command=command, timeout_s=timeout_s)
        answer = runner.handle({"url": sink.url}, context(Agent(BootSequence()), "d-1"))
        assert answer["running"] is True
        assert sink.wait_for(1, timeout_s + 30)
        return runner, json.loads(sink.posts[0].body)


def test_the_doctors_report_is_sent_and_reused_for_a_repeat_within_seconds():
    runner, body = run_doctor([sys.executable, "-m", "edgeinfer", "doctor", "--json"])
    assert body["command_id"] == "d-1" and body["error"] is None and body["exit_code"] in (0, 1)
    assert body["report"]["root"] == "/" and body["report"]["findings"]
    with FrameSink() as sink:
        runner.handle({"url": sink.url}, context(Agent(BootSequence()), "d-2"))
        assert sink.wait_for(1, 30)
        again = json.loads(sink.posts[0].body)
    assert runner.runs == 1 and again["report"] == body["report"] and again["command_id"] == "d-2"


def test_a_doctor_that_crashes_or_hangs_is_a_report_of_it_not_the_agents_end():
    _runner, crashed = run_doctor([sys.executable, "-c", "import os; print('half'); os.abort()"])
    assert crashed["report"] is None and crashed["exit_code"] == -6
    assert crashed["error"].startswith("the doctor exited -6 without a JSON report")
    started = time.monotonic()
    _runner, hung = run_doctor([sys.executable, "-c", "import time; time.sleep(60)"], timeout_s=1.0)
    assert hung["error"] == "the doctor did not finish within 1 s (killed)" and hung["exit_code"] is None
    assert time.monotonic() - started < 20
    _runner, secret = run_doctor([sys.executable, "-c", f"print('{{\"detail\": \"rtsp://u:{SECRET}@h/\"}}')"])
    assert secret["report"] == {"detail": "rtsp://u:***@h/"}

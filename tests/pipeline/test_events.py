"""Event rules with evidence: the rules' text, cooldown and rate limit, the evidence thread, and the
generated scene clip (tests/support/scenes.py) through the real face detector with a line and a zone:
one event per true crossing and entry, each with a snapshot and a clip on disk."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import cv2
import numpy as np
import pytest
from support import scenes
from support.assets import IMAGES, REPO
from support.pipeline import ULTRAFACE

from edgeinfer import MultiPipeline, Pipeline
from edgeinfer.capture import open_source
from edgeinfer.forms.evidence import CLIP_NAMES
from edgeinfer.pipeline.events import EventRule, StreamEvents, parse_rules, stream_folder
from edgeinfer.pipeline.evidence import EVENT_ID, META_NAME, SNAPSHOT_NAME, EvidenceStore
from edgeinfer.pipeline.postprocess import Classification, Detection, Detections
from edgeinfer.pipeline.zones import AnalyticsEvent

LINE = "door=" + ",".join(str(v) for v in scenes.LINE)
ZONE = "shop=" + ",".join(f"{x},{y}" for x, y in scenes.ZONE)


# ----------------------------------------------------------------------------------------- rules

def test_rules_parse_their_three_forms():
    assert EventRule.parse("line_crossed") == EventRule("line_crossed", "line_crossed")
    rule = EventRule.parse("line_crossed:door/person,car")
    assert (rule.kind, rule.name, rule.labels) == ("line_crossed", "door", frozenset({"person", "car"}))
    assert EventRule.parse("zone_entered:dock").name == "dock"
    detection = EventRule.parse("detection:0.8/person")
    assert (detection.min_score, detection.labels, detection.name) == (0.8, frozenset({"person"}), None)
    assert EventRule.parse("detection").min_score == 0.0


@pytest.mark.parametrize(("text", "message"), [
    ("bogus", "not one of"), ("detection:high", "not a score"), ("detection:1.5", "within 0..1"),
    ("line_crossed/", "not one of"), ("", "not one of"), ("zone_entered:a/b/c", "not one of"),
])
def test_a_bad_rule_says_what_is_wrong(text, message):
    with pytest.raises(ValueError, match=message):
        EventRule.parse(text)


def test_rules_are_checked_against_the_pipelines_lines_and_zones():
    assert len(parse_rules(["line_crossed:door", "detection"], lines=["door"])) == 2
    with pytest.raises(ValueError, match="needs a line"):
        parse_rules(["line_crossed"])
    with pytest.raises(ValueError, match="no zone named 'dock'"):
        parse_rules(["zone_entered:dock"], zones=["shop"])
    with pytest.raises(ValueError, match="no line named"):  # the pipeline option checks them the same way
        Pipeline(ULTRAFACE, IMAGES, task="detect", lines=[LINE], events=["line_crossed:gate"])


def test_stream_folders_are_safe_names_under_the_evidence_dir(tmp_path):
    assert stream_folder(None, "a") is None
    assert stream_folder(tmp_path, "door cam") == tmp_path / "door_cam"
    assert stream_folder(tmp_path, "../../etc").parent == tmp_path
    assert stream_folder(tmp_path, "..").name == "stream"


# ----------------------------------------------------------------------- firing, without evidence

def _crossing(track_id: int, frame_id: int, direction: str = "in", label: str = "person") -> AnalyticsEvent:
    return AnalyticsEvent("line_crossed", "door", track_id, label, frame_id, frame_id / 30, direction,
                          box=(1.0, 2.0, 3.0, 4.0))


def _detections(*items: tuple[str, float, int | None]) -> Detections:
    return Detections(tuple(Detection((0.0, 0.0, 10.0, 10.0), score, 0, label, track_id)
                            for label, score, track_id in items))


def test_each_crossing_is_an_event_and_a_detection_rule_keeps_its_cooldown_per_subject():
    events = StreamEvents(parse_rules(["line_crossed/person", "detection:0.6/car"], lines=["door"]), cooldown_s=10)
    got: list[dict] = []
    events.add_listener(got.append)
    events.on_analytics(_crossing(1, 10))
    events.on_analytics(_crossing(1, 40, "out"))  # the same track back out: a change, its own event
    events.on_analytics(_crossing(2, 41, label="dog"))  # not a label the rule takes
    for frame_id in range(0, 301, 30):  # a car in view for 10 s, seen every second: one event per 10 s
        events.check(_detections(("car", 0.9, None), ("car", 0.5, None)), frame_id, frame_id / 30)
    events.check(_detections(("car", 0.7, 7)), 301, 301 / 30)  # another subject (a track) fires at once
    kinds = [(e["kind"], e.get("direction"), e["track_id"]) for e in got]
    assert kinds == [("line_crossed", "in", 1), ("line_crossed", "out", 1), ("detection", None, None),
                     ("detection", None, None), ("detection", None, 7)]
    assert [e["frame_id"] for e in got if e["kind"] == "detection"] == [0, 300, 301]
    assert got[3]["suppressed"] == 9  # what the cooldown held back since the last event
    assert all(EVENT_ID.match(e["event_id"]) and e["snapshot"] is None for e in got)
    assert events.counts()["suppressed"] == 9 and events.counts()["triggered"] == 5


def test_the_rate_limit_holds_back_a_crowd_and_counts_it():
    events = StreamEvents(parse_rules(["line_crossed"], lines=["door"]), per_minute=3)
    got: list[dict] = []
    events.add_listener(got.append)
    for track_id in range(10):
        events.on_analytics(_crossing(track_id, track_id))
    assert len(got) == 3 and events.counts()["rate_limited"] == 7


def test_a_classifiers_top1_fires_a_detection_rule():
    events = StreamEvents(parse_rules(["detection:0.5/macaw"]))
    got: list[dict] = []
    events.add_listener(got.append)
    events.check([Classification(88, "macaw", 0.9), Classification(1, "goldfish", 0.05)], 1, 1.0)
    events.check([Classification(1, "goldfish", 0.95), Classification(88, "macaw", 0.6)], 2, 2.0)  # not top-1
    assert [(e["label"], e["score"]) for e in got] == [("macaw", 0.9)]


def test_a_listener_that_raises_does_not_stop_the_events(caplog):
    events = StreamEvents(parse_rules(["line_crossed"], lines=["door"]))
    got: list[dict] = []
    events.add_listener(lambda _e: 1 / 0)
    events.add_listener(got.append)
    events.on_analytics(_crossing(1, 1))
    events.on_analytics(_crossing(2, 2))
    assert len(got) == 2 and "event listener failed" in caplog.text


# --------------------------------------------------------------------------- with evidence

@pytest.fixture(scope="module")
def frames():
    """1280x720 frames: the cat photo with a parrot crop moving across it."""
    background = cv2.imread(str(IMAGES / "cat_720p.jpg"))
    parrot = cv2.resize(cv2.imread(str(IMAGES / "parrot.jpg")), (200, 200))
    out = []
    for i in range(60):
        frame = background.copy()
        x = 20 * i
        frame[260:460, x:x + 200] = parrot[:, : min(200, 1280 - x)]
        out.append(frame)
    return out


def _feed(events: StreamEvents, frames, ids, start: float, fps: float = 30.0, *, paced: bool = True) -> None:
    """Offer frames ``ids`` (timestamps ``start + id / fps``); ``paced``: as a camera would, never faster
    than the evidence thread keeps up (each waits for the one before to be encoded)."""
    for frame_id in ids:
        events.offer(frames[frame_id % len(frames)], frame_id, start + frame_id / fps)
        deadline = time.monotonic() + 10
        while paced and events.pending and time.monotonic() < deadline:
            time.sleep(0.002)


def _wait_for(got: list, count: int, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while len(got) < count and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(got) >= count, f"{len(got)} of {count} events delivered"


def test_an_event_gets_a_snapshot_and_a_clip_with_pre_and_post_roll(tmp_path, frames):
    store = EvidenceStore(tmp_path)
    events = StreamEvents(parse_rules(["line_crossed"], lines=["door"]), store=store, stream="door", pre_s=1.0,
                          post_s=1.0, fps=10.0, width=320)
    got: list[dict] = []
    events.add_listener(got.append)
    start = time.time()
    _feed(events, frames, range(0, 61), start)  # 2 s of frames at 30 fps
    crossing = AnalyticsEvent("line_crossed", "door", 4, "parrot", 60, start + 2.0, "in")
    events.on_analytics(crossing)
    _feed(events, frames, range(61, 121), start)  # the next 2 s: the post-roll ends after 1 s of it
    _wait_for(got, 1)
    event = got[0]
    assert (event["stream"], event["kind"], event["track_id"], event["frame_id"]) == ("door", "line_crossed", 4, 60)
    meta = json.loads((tmp_path / event["event_id"] / META_NAME).read_text())
    assert meta["event"]["frame_id"] == 60 and meta["snapshot_frame_id"] == 60  # 60 is on the 10 fps grid
    # the pre-roll ring holds 1 s at 10 fps (10 frames, the snapshot's among them), then 1 s of post-roll
    assert meta["first_frame_id"] == 33 and meta["last_frame_id"] == 90
    assert event["duration_s"] == pytest.approx(1.9, abs=0.01)
    snapshot = cv2.imread(event["snapshot"])
    assert snapshot.shape == (180, 320, 3)  # downscaled to the evidence width
    clip = open_source(event["clip"])
    try:
        count = 0
        while clip.read() is not None:
            count += 1
        assert count == 20
    finally:
        clip.close()
    assert Path(event["snapshot"]).stat().st_size == event["snapshot_bytes"] > 0
    events.close()
    assert events.counts() == {"triggered": 1, "suppressed": 0, "rate_limited": 0, "frames_dropped": 0,
                               "delivered": 1, "failed": 0}


def test_a_source_that_stalls_does_not_hold_a_recording_open(tmp_path, frames):
    events = StreamEvents(parse_rules(["detection"]), store=EvidenceStore(tmp_path), post_s=0.5, fps=10.0)
    got: list[dict] = []
    events.add_listener(got.append)
    start = time.time() - 1.0
    _feed(events, frames, range(0, 30), start)
    events.check(_detections(("parrot", 0.9, None)), 29, start + 29 / 30)
    _wait_for(got, 1, timeout=10)  # no frame after the event: written when its post-roll is long past
    assert got[0]["frames"] >= 1 and Path(got[0]["clip"]).exists()
    events.close()


def test_close_writes_what_a_recording_has(tmp_path, frames):
    events = StreamEvents(parse_rules(["detection"]), store=EvidenceStore(tmp_path), post_s=30.0)
    got: list[dict] = []
    events.add_listener(got.append)
    start = time.time()
    _feed(events, frames, range(0, 10), start)
    events.check(_detections(("parrot", 0.9, None)), 9, start + 9 / 30)
    events.close()
    assert len(got) == 1 and Path(got[0]["clip"]).exists()
    events.offer(frames[0], 11, start + 1)  # after close: ignored, no thread started again
    assert events.counts()["delivered"] == 1


def test_a_slow_disk_drops_evidence_frames_never_blocks_the_caller(tmp_path, frames, monkeypatch):
    events = StreamEvents(parse_rules(["detection"]), store=EvidenceStore(tmp_path), fps=30.0)
    recorder = events.recorder
    release = threading.Event()
    real_add = recorder.add

    def slow_add(*args):
        release.wait(10)
        return real_add(*args)

    monkeypatch.setattr(recorder, "add", slow_add)
    _feed(events, frames, range(0, 40), time.time(), paced=False)  # all due; the thread is stuck on the first
    assert events.counts()["frames_dropped"] >= 40 - 1 - 8  # the queue holds 8
    release.set()
    events.close()


def test_a_store_that_cannot_write_counts_failures_and_the_events_go_on(tmp_path, frames):
    store = EvidenceStore(tmp_path / "store")
    events = StreamEvents(parse_rules(["detection"]), store=store, post_s=0.0, fps=30.0)
    got: list[dict] = []
    events.add_listener(got.append)
    (tmp_path / "store").rmdir()
    (tmp_path / "store").write_text("a file where the store's folder was: every write fails")
    start = time.time()
    _feed(events, frames, range(0, 5), start)
    events.check(_detections(("parrot", 0.9, None)), 4, start + 4 / 30)
    events.check(_detections(("macaw", 0.9, None)), 5, start + 5 / 30)
    events.close()
    assert got == [] and events.counts()["failed"] == 2 and events.counts()["triggered"] == 2


# ------------------------------------------------------------------- the scene through a pipeline

def test_the_scene_clip_makes_one_event_per_true_crossing_and_entry_with_evidence(tmp_path):
    clip = scenes.make_scene_clip(tmp_path / "scene.avi")
    got: list[dict] = []
    with Pipeline(ULTRAFACE, clip, task="detect", lines=[LINE], zones=[ZONE], line_band=scenes.BAND,
                  events=["line_crossed:door", "zone_entered:shop"], evidence_dir=tmp_path / "events") as pipeline:
        pipeline.add_event_listener(got.append)
        crossings = []
        pipeline.analytics.add_listener(crossings.append)
        list(pipeline)
        counts = pipeline.events.counts()
    truth = scenes.SCENE_TRUTH
    lines = [e for e in got if e["kind"] == "line_crossed"]
    zones = [e for e in got if e["kind"] == "zone_entered"]
    assert sorted(e["direction"] for e in lines) == sorted(["in"] * truth["in"] + ["out"] * truth["out"])
    assert len(zones) == truth["zone_entries"]
    expected = {(e.kind, e.track_id, e.frame_id) for e in crossings if e.kind in ("line_crossed", "zone_entered")}
    assert {(e["kind"], e["track_id"], e["frame_id"]) for e in got} == expected
    store = EvidenceStore(tmp_path / "events")
    assert len(store) == len(got) == counts["delivered"] and counts["failed"] == 0
    for event in got:
        stored = store.get(event["event_id"])
        assert stored is not None and stored.meta["snapshot_frame_id"] == event["frame_id"]  # its own frame
        assert stored.meta["first_frame_id"] <= event["frame_id"]
        image = cv2.imread(str(stored.folder / SNAPSHOT_NAME))
        assert image is not None and image.shape[1] == 640
        assert stored.clip_path.name in CLIP_NAMES
        assert stored.clip_path.stat().st_size == stored.meta["clip_bytes"]


def test_each_stream_records_its_events_in_a_folder_of_its_own(tmp_path):
    clip = scenes.make_scene_clip(tmp_path / "scene.avi")
    got: list[dict] = []
    with MultiPipeline(ULTRAFACE, {"east": clip, "west": clip}, task="detect", policy="every", lines=[LINE],
                       line_band=scenes.BAND, events=["line_crossed"], evidence_dir=tmp_path / "ev") as multi:
        multi.add_event_listener(got.append)
        multi.start()
        assert multi.wait(120)
    truth = scenes.SCENE_TRUTH
    for name in ("east", "west"):
        mine = [e for e in got if e["stream"] == name]
        assert len(mine) == truth["in"] + truth["out"], name
        assert all(Path(e["clip"]).parent.parent == tmp_path / "ev" / name for e in mine)


def test_edgeinfer_run_prints_each_event_and_keeps_its_evidence(tmp_path):
    clip = scenes.make_scene_clip(tmp_path / "scene.avi")
    done = subprocess.run([sys.executable, "-m", "edgeinfer", "run", str(ULTRAFACE), "--source", str(clip),
                           "--task", "detect", "--line", LINE, "--event", "line_crossed:door", "--json",
                           "--evidence-dir", str(tmp_path / "ev")], capture_output=True, text=True, cwd=REPO,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    lines = [json.loads(line) for line in done.stdout.splitlines()]
    events = [line for line in lines if line["type"] == "event"]
    assert len(events) == scenes.SCENE_TRUTH["in"] + scenes.SCENE_TRUTH["out"]
    assert all(Path(e["snapshot"]).is_file() and Path(e["clip"]).is_file() for e in events)
    bad = subprocess.run([sys.executable, "-m", "edgeinfer", "run", str(ULTRAFACE), "--source", str(clip),
                          "--task", "detect", "--event", "line_crossed"], capture_output=True, text=True,
                         cwd=REPO, timeout=120)
    assert bad.returncode != 0 and "needs a line" in bad.stderr
    assert np.all(np.array([e["frame_id"] for e in events]) < scenes.FRAMES)

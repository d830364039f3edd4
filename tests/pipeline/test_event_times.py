"""Every event carries wall-clock time (issue 35, item 4): a real pipeline (the face detector) on a file — the
generated scene, read far faster than real time — with a line, a zone and a detection rule. Before the fix its
``line_crossed`` and ``zone_entered`` events carried the clip's own time as their ``timestamp`` (``0.93`` for the
crossing at frame 28, "20785 d ago" on the dashboard) while its ``detection`` events carried the wall clock; now
every event's ``timestamp`` is the wall-clock time its frame was read, and the clip's own time is ``source_time``.
"""

from __future__ import annotations

import calendar
import time

import pytest
from support import scenes
from support.pipeline import ULTRAFACE

from edgeinfer import Pipeline

LINE = "door=" + ",".join(str(v) for v in scenes.LINE)
ZONE = "shop=" + ",".join(f"{x},{y}" for x, y in scenes.ZONE)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """The scene's rule events and its raw analytics events, with the wall-clock bounds of the run."""
    clip = scenes.make_scene_clip(tmp_path_factory.mktemp("times") / "scene.avi")
    events, analytics = [], []
    before = time.time()
    with Pipeline(ULTRAFACE, clip, task="detect", lines=[LINE], zones=[ZONE], line_band=scenes.BAND,
                  events=["line_crossed:door", "zone_entered:shop", "detection:0.5"]) as pipeline:
        pipeline.add_event_listener(events.append)
        assert pipeline.analytics is not None
        pipeline.analytics.add_listener(analytics.append)
        list(pipeline)
    return events, analytics, before, time.time()


def test_rule_events_from_a_file_carry_the_wall_clock_and_the_clips_own_time_apart(run):
    events, _, before, after = run
    kinds = {e["kind"] for e in events}
    assert {"line_crossed", "zone_entered", "detection"} <= kinds, kinds
    for event in events:
        # the wall clock: within the run (a few seconds of time.time()), whatever the rule
        assert before <= event["timestamp"] <= after, event
        # the clip's own time: the frame's place in the file, read at any speed
        assert event["source_time"] == pytest.approx(event["frame_id"] / scenes.FPS, abs=1e-6), event
    crossings = sorted(e["frame_id"] for e in events if e["kind"] == "line_crossed")
    assert len(crossings) == scenes.SCENE_TRUTH["in"] + scenes.SCENE_TRUTH["out"]


def test_an_event_without_evidence_is_named_by_the_wall_clock(run):
    events, _, before, after = run
    for event in events:  # YYYYmmddTHHMMSSfffZ-...: the time it happened, not 1970 plus the clip's seconds
        stamp = calendar.timegm(time.strptime(event["event_id"][:15], "%Y%m%dT%H%M%S"))
        assert int(before) - 1 <= stamp <= after, event["event_id"]


def test_line_and_zone_events_of_the_analytics_carry_both_times(run):
    _, analytics, before, after = run
    kinds = {e.kind for e in analytics}
    assert {"line_crossed", "zone_entered", "zone_left"} <= kinds, kinds
    for event in analytics:
        assert before <= event.timestamp <= after, event
        assert event.source_time == pytest.approx(event.frame_id / scenes.FPS, abs=1e-6), event
        assert event.to_dict()["timestamp"] == round(event.timestamp, 6)
        assert event.to_dict()["source_time"] == round(event.source_time, 6)

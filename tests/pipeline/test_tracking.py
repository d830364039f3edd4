"""Tracking, line crossings with hysteresis and polygon zones: the rules on hand-made tracks, then a
generated clip with known ground truth through the real face detector (tests/support/scenes.py)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from support import scenes
from support.assets import MOBILENET_TINY, REPO
from support.pipeline import ULTRAFACE

from edgeinfer import MultiPipeline, Pipeline
from edgeinfer.pipeline.analytics import (
    AnalyticsEvent,
    LineCounter,
    StreamAnalytics,
    ZoneCounter,
    build_analytics,
    parse_line,
    parse_zone,
)
from edgeinfer.pipeline.postprocess import Detection, Detections
from edgeinfer.pipeline.tracking import Tracker

H = 100.0  # box height of the hand-made tracks: the default band (0.1 of it) is 10 px


def box_at(x: float, y: float = 300.0) -> tuple[float, float, float, float]:
    """A 100x100 box whose bottom centre (the default anchor) is at (x, y)."""
    return (x - 50, y - H, x + 50, y)


def walk(counter, xs, track_id=1, start_frame=0):
    """Feed one track's anchor x positions (None: no box that frame); the events made."""
    events = []
    for i, x in enumerate(xs):
        if x is None:
            continue
        event = counter.update(track_id, "face", box_at(x), start_frame + i, (start_frame + i) / 30)
        if event is not None:
            events.append(event)
    return events


def vertical_line(**options) -> LineCounter:
    """The band rule alone (``hold_s=0``); the hold is tested in test_line_hold.py."""
    options.setdefault("hold_s", 0.0)
    return LineCounter("door", (320, 470), (320, 10), **options)  # drawn upwards: left → right is "in"


# ------------------------------------------------------------------------------------------
# the line rule
# ------------------------------------------------------------------------------------------

def test_a_crossing_counts_once_in_its_direction():
    line = vertical_line()
    (event,) = walk(line, [200, 260, 300, 318, 325, 340, 400])
    assert (event.kind, event.name, event.direction, event.track_id, event.frame_id) == (
        "line_crossed", "door", "in", 1, 5)  # counted where the anchor leaves the band (330) on the far side
    assert line.counts() == {"in": 1, "out": 0}
    (event,) = walk(line, [400, 300, 200], track_id=2)
    assert event.direction == "out" and line.counts() == {"in": 1, "out": 1}
    # the other way round: the same line drawn downwards swaps in and out
    down = LineCounter("door", (320, 10), (320, 470), hold_s=0)
    assert [e.direction for e in walk(down, [200, 400])] == ["out"]


def test_flicker_on_the_line_counts_once():
    line = vertical_line()
    # approaches, then its anchor jumps to and fro across the line inside the band with frames missing
    xs = [250, 290, 312, 327, None, None, 314, 328, 313, None, 326, 318, 350, 420]
    events = walk(line, xs)
    assert [e.direction for e in events] == ["in"] and line.counts() == {"in": 1, "out": 0}
    # without a band every pass over x = 320 is a crossing
    bare = vertical_line(band=0)
    assert [e.direction for e in walk(bare, xs)] == ["in", "out", "in", "out", "in", "out", "in"]


def test_standing_on_the_line_jittering_never_counts():
    line = vertical_line()
    jitter = [320 + d for d in (-6, 4, -3, 6, -5, 2, 5, -6, 3, -2) * 20]
    assert walk(line, jitter) == [] and line.counts() == {"in": 0, "out": 0}
    assert len(walk(vertical_line(band=0), jitter)) > 50  # every sign change


def test_back_and_forth_counts_each_real_crossing_and_a_return_into_the_band_nothing():
    line = vertical_line()
    events = walk(line, [200, 400, 325, 400, 315, 400, 200, 400])  # in; into the band and back (x2); out; in
    assert [e.direction for e in events] == ["in", "out", "in"]
    assert line.counts() == {"in": 2, "out": 1}


def test_first_seen_in_the_band_or_walking_round_the_end_does_not_count():
    line = vertical_line()
    assert walk(line, [322, 318, 326]) == []  # no side known yet
    assert [e.direction for e in walk(line, [322, 400, 200], track_id=2)] == ["out"]  # side known at 400
    # the segment ends at y = 10 and 470: a track passing below its lower end is not crossing it
    line = vertical_line()
    path = [(200, 300), (200, 480), (400, 480), (400, 300)]
    events = [line.update(7, "face", box_at(x, y), i, i / 30) for i, (x, y) in enumerate(path)]
    assert events == [None] * 4 and line.counts() == {"in": 0, "out": 0}


def test_band_in_pixels_or_as_a_share_of_the_box():
    assert walk(vertical_line(band=0, band_px=25), [290, 340, 290]) == []  # within ±25 px
    assert len(walk(vertical_line(band=0, band_px=25), [290, 350, 290])) == 2
    assert len(walk(vertical_line(band=0.3), [290, 340, 290])) == 0  # 0.3 x 100 px
    # the anchor: with "center" a box whose bottom is past a horizontal line but whose centre is not
    line = LineCounter("floor", (0, 300), (640, 300), anchor="center", hold_s=0)
    assert line.update(1, "face", (100, 150, 200, 250), 0, 0.0) is None
    assert line.update(1, "face", (100, 220, 200, 320), 1, 0.1) is None  # centre 270: beyond the band, same side
    assert line.update(1, "face", (100, 280, 200, 380), 2, 0.2).direction == "in"  # downwards over a rightwards line


# ------------------------------------------------------------------------------------------
# the zone rule
# ------------------------------------------------------------------------------------------

def test_zone_entries_jitter_on_the_edge_and_time_inside():
    zone = ZoneCounter("shop", [(400, 0), (640, 0), (640, 480), (400, 480)], hold_s=0)
    xs = [300, 395, 405, 396, 404, 450, 500, 500, 395, 405, 300, 300, 500]
    events = [zone.update(1, "face", box_at(x), i, i * 0.5) for i, x in enumerate(xs)]
    kinds = [(i, e.kind) for i, e in enumerate(events) if e is not None]
    assert kinds == [(5, "zone_entered"), (10, "zone_left"), (12, "zone_entered")]
    assert events[10].dwell_s == pytest.approx(2.5)  # frames 5 → 10 at 0.5 s
    assert zone.counts()["inside"] == 1 and zone.counts()["entries"] == 2
    assert zone.dwell(1) == 0.0 and zone.dwell(2) is None
    left = zone.forget(1, "face", 20, 10.0)
    assert left.kind == "zone_left" and left.dwell_s == pytest.approx(4.0)
    assert zone.counts() == {"inside": 0, "entries": 2, "dwell_s": {}, "mean_visit_s": 3.25}
    # a concave zone: the notch is outside
    ell = ZoneCounter("ell", [(0, 0), (300, 0), (300, 100), (100, 100), (100, 300), (0, 300)], band=0)
    assert ell.depth((50, 250)) > 0 and ell.depth((200, 200)) < 0 and ell.depth((200, 50)) == pytest.approx(50)


# ------------------------------------------------------------------------------------------
# configuration errors
# ------------------------------------------------------------------------------------------

@pytest.mark.parametrize(("make", "message"), [
    (lambda: ZoneCounter("z", [(0, 0), (10, 10)]), "at least 3 points, not 2"),
    (lambda: ZoneCounter("z", [(0, 0), (10, 10), (20, 20)]), "encloses no area"),
    (lambda: ZoneCounter("z", [(0, 0), (10, "x"), (20, 0)]), "point 2 must be a point"),
    (lambda: LineCounter("l", (5, 5), (5, 5)), "has no length"),
    (lambda: LineCounter.from_coords("l", [1, 2, 3]), "four numbers"),
    (lambda: LineCounter("l", (0, 0), (9, 9), anchor="feet"), "anchor 'feet' is not one of"),
    (lambda: LineCounter("l", (0, 0), (9, 9), band=-1), "must be finite numbers >= 0"),
    (lambda: LineCounter("l", (0, 0), (9, 9), hold_s=float("nan")), "must be finite numbers >= 0"),
    (lambda: ZoneCounter("z", [(0, 0), (9, 0), (9, 9)], hold_s="soon"), "must be finite numbers >= 0"),
    (lambda: LineCounter("l", (0, 0), (9, 9), trigger="feet"), "trigger 'feet' is not one of anchor, box"),
    (lambda: LineCounter("", (0, 0), (9, 9)), "is not a name"),
    (lambda: LineCounter("a/b", (0, 0), (9, 9)), "is not a name"),
    (lambda: ZoneCounter("z", [(0, 0), (9, 0), (9, -9)]), "from 0 to 16384"),
    (lambda: Tracker(min_hits=0), "min_hits must be an integer >= 1"),
    (lambda: StreamAnalytics(Tracker(), [LineCounter("a", (0, 0), (9, 9)), LineCounter("a", (0, 0), (9, 1))]),
     "repeated: a"),
    (lambda: parse_line("1,2,3"), "x1,y1,x2,y2"),
    (lambda: parse_zone("1,2,3,4"), "at least 3 points"),
    (lambda: parse_zone("1,2,a,4,5,6"), "not a list of numbers"),
])
def test_bad_configuration_is_a_value_error_that_says_what_is_wrong(make, message):
    with pytest.raises(ValueError, match=message):
        make()


def test_parsing_what_the_command_line_gives():
    assert parse_line("10,20,30,40.5") == (10.0, 20.0, 30.0, 40.5)
    assert parse_zone("0,0;100,0;100,50") == [(0.0, 0.0), (100.0, 0.0), (100.0, 50.0)]
    analytics = build_analytics(lines=[parse_line("320,470,320,10")], zones={"shop": parse_zone("0,0,9,0,9,9")})
    assert [line.name for line in analytics.lines] == ["line1"] and analytics.zones[0].name == "shop"


# ------------------------------------------------------------------------------------------
# the tracker and the analytics on hand-made detections
# ------------------------------------------------------------------------------------------

def _frame(*xs):
    return Detections(tuple(Detection(box_at(x, y), 0.9, 1, "face") for x, y in xs))


def test_tracks_are_confirmed_after_min_hits_and_keep_their_id_through_a_short_gap():
    tracker = Tracker(min_hits=3)
    ids = [[d.track_id for d in tracker.update(_frame((100 + 10 * f, 200), (500, 200 + 5 * f)), f)]
           for f in range(5)]
    assert ids[:2] == [[None, None]] * 2 and ids[2] == ids[3] == ids[4] and None not in ids[2]
    first = ids[4][0]
    assert tracker.update(Detections(), 5) == Detections() and tracker.update(_frame(), 6) == Detections()
    assert tracker.update(_frame((170, 200)), 7)[0].track_id == first  # two frames missing, same track
    eager = Tracker(min_hits=1)  # the library names a track from its second frame on, whatever min_hits
    assert [eager.update(_frame((100 + f, 200)), f)[0].track_id for f in range(3)] == [None, 0, 0]
    detection = tracker.update(_frame((180, 200)), 8)[0]
    assert detection.to_dict()["track_id"] == first and "track_id" not in Detection((0, 0, 1, 1), 0.9, 1, "x").to_dict()


def test_stream_analytics_counts_events_and_forgets_lost_tracks(caplog):
    analytics = StreamAnalytics(Tracker(min_hits=3, lost_frames=5), [vertical_line()],
                                [ZoneCounter("right", [(400, 0), (640, 0), (640, 480), (400, 480)])], fps=10)
    seen: list[AnalyticsEvent] = []
    analytics.add_listener(seen.append)
    analytics.add_listener(lambda event: 1 / 0)  # a broken listener changes nothing
    frame = 0
    for x in range(200, 520, 20):  # left → right, into the zone
        analytics.process(_frame((x, 300)), frame)
        frame += 1
    for _ in range(8):  # gone: forgotten after lost_frames + 1 frames, so it leaves the zone
        analytics.process(Detections(), frame)
        frame += 1
    assert [(e.kind, e.direction) for e in seen] == [("line_crossed", "in"), ("zone_entered", None),
                                                      ("zone_left", None)]
    assert seen[2].frame_id == 15 and seen[2].dwell_s == pytest.approx((15 - 11) / 10)
    counts = analytics.counts()
    assert counts["lines"] == {"door": {"in": 1, "out": 0}} and counts["tracks"] == {"confirmed": 1, "active": 0}
    assert counts["zones"]["right"]["entries"] == 1 and counts["zones"]["right"]["inside"] == 0
    json.dumps(counts) and json.dumps([e.to_dict() for e in seen])
    assert "analytics listener failed" in caplog.text


# ------------------------------------------------------------------------------------------
# the generated clip through the real detector
# ------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def scene_run(tmp_path_factory):
    """The scene clip through Ultraface with the analytics as an observer; the detections per frame too."""
    clip = scenes.make_scene_clip(tmp_path_factory.mktemp("scene") / "scene.avi")
    analytics = build_analytics(lines={"door": scenes.LINE}, zones={"shop": scenes.ZONE}, band=scenes.BAND,
                                fps=scenes.FPS)
    events: list[AnalyticsEvent] = []
    analytics.add_listener(events.append)
    recorded: list[tuple[int, Detections]] = []
    with Pipeline(ULTRAFACE, clip, task="detect") as pipeline:
        pipeline.add_observer(analytics)
        for result in pipeline:
            recorded.append((result.frame_id, result.result))
    assert [f for f, _ in recorded] == list(range(scenes.FRAMES))
    return analytics, events, recorded


def _replay(recorded, **options):
    analytics = build_analytics(lines={"door": scenes.LINE}, zones={"shop": scenes.ZONE}, fps=scenes.FPS, **options)
    for frame_id, detections in recorded:
        analytics.process(detections, frame_id)
    return analytics.counts()


def test_the_generated_clip_counts_exactly_the_ground_truth(scene_run):
    analytics, events, _ = scene_run
    counts = analytics.counts()
    truth = scenes.SCENE_TRUTH
    assert counts["lines"]["door"] == {"in": truth["in"], "out": truth["out"]}, counts
    shop = counts["zones"]["shop"]
    assert (shop["entries"], shop["inside"]) == (truth["zone_entries"], truth["zone_inside_at_end"]), counts
    assert counts["tracks"]["confirmed"] == 3  # A, B, C: the blinking ghosts never became tracks
    crossings = [(e.direction, e.frame_id) for e in events if e.kind == "line_crossed"]
    assert [d for d, _ in crossings] == ["in", "in", "out"]  # A in, B in after its flicker, A back out
    # each reported once it has held (0.3 s: 9 frames after the anchor left the band)
    assert 29 < crossings[0][1] < 44 and 97 < crossings[1][1] < 105 and 104 < crossings[2][1] < 119
    (left,) = [e for e in events if e.kind == "zone_left"]
    entered, gone = scenes.A_ZONE_FRAMES
    assert left.dwell_s == pytest.approx((gone - entered) / scenes.FPS, abs=4 / scenes.FPS)
    a, b = (e.track_id for e in events if e.kind == "zone_entered")
    assert left.track_id == a != b and crossings and {e.track_id for e in events} == {a, b}
    assert all(d.track_id is not None for d in analytics.last)  # the last frame: A, B, C all tracked


def test_without_hysteresis_or_with_unconfirmed_tracks_the_same_clip_counts_wrong(scene_run):
    _, _, recorded = scene_run
    truth = scenes.SCENE_TRUTH
    right = {"in": truth["in"], "out": truth["out"]}
    assert _replay(recorded, band=scenes.BAND, hold_s=0)["lines"]["door"] == right  # the band alone
    assert _replay(recorded, band=0)["lines"]["door"] == right  # the hold alone
    # neither: C's jitter on the line and B's flicker count as crossings, frame after frame
    bare = _replay(recorded, band=0, hold_s=0)["lines"]["door"]
    assert bare["in"] >= truth["in"] + 20 and bare["out"] >= truth["out"] + 20, bare
    # tentative tracks counted: each blinking ghost is a crossing, unless the hold asks more than a frame
    unconfirmed = _replay(recorded, band=scenes.BAND, min_hits=1, hold_s=0)
    assert unconfirmed["lines"]["door"] == {"in": truth["in"] + 1, "out": truth["out"] + 1}, unconfirmed
    assert unconfirmed["tracks"]["confirmed"] == 5
    assert _replay(recorded, band=scenes.BAND, min_hits=1)["lines"]["door"] == right


def test_the_pipeline_tracks_and_counts_from_its_options(tmp_path):
    """``Pipeline(..., lines=..., zones=...)``: the detections every consumer gets carry track ids, and
    the window's stats carry the counts (what the agent's telemetry sends)."""
    clip = scenes.make_scene_clip(tmp_path / "scene.avi")
    line = "door=" + ",".join(str(v) for v in scenes.LINE)
    zone = "shop=" + ",".join(f"{x},{y}" for x, y in scenes.ZONE)
    with Pipeline(ULTRAFACE, clip, task="detect", lines=[line], zones=[zone], line_band=scenes.BAND) as pipeline:
        events: list[AnalyticsEvent] = []
        pipeline.analytics.add_listener(events.append)
        results = list(pipeline)
        stats = pipeline.take_window()
    truth = scenes.SCENE_TRUTH
    assert stats.analytics["lines"]["door"] == {"in": truth["in"], "out": truth["out"]}
    assert stats.analytics["zones"]["shop"]["entries"] == truth["zone_entries"]
    assert [e.direction for e in events if e.kind == "line_crossed"] == ["in", "in", "out"]
    tracked = {d.track_id for r in results for d in r.result if d.track_id is not None}
    assert len(tracked) == 3 and "track_id" in results[-1].to_dict()["result"][0]
    with pytest.raises(ValueError, match="need results with boxes"):
        Pipeline(MOBILENET_TINY, clip, lines=[line])  # a classifier: nothing to count
    with pytest.raises(ValueError, match="need a task with boxes"):
        Pipeline(ULTRAFACE, clip, task="classify", lines=[line])


def test_edgeinfer_run_counts_a_line_and_a_zone(tmp_path):
    clip = scenes.make_scene_clip(tmp_path / "scene.avi")
    line = "door=" + ",".join(str(v) for v in scenes.LINE)
    zone = "shop=" + ",".join(f"{x},{y}" for x, y in scenes.ZONE)
    done = subprocess.run([sys.executable, "-m", "edgeinfer", "run", str(ULTRAFACE), "--source", str(clip),
                           "--task", "detect", "--line", line, "--zone", zone, "--line-hold", "0.3",
                           "--line-trigger", "anchor"], capture_output=True, text=True,
                          cwd=REPO, timeout=120)
    assert done.returncode == 0, done.stderr
    truth = scenes.SCENE_TRUTH
    assert f"line door: in {truth['in']}, out {truth['out']}" in done.stdout
    assert f"{truth['zone_entries']} entries" in done.stdout and "tracks: 3 confirmed" in done.stdout


def test_each_stream_of_a_multi_stream_run_tracks_and_counts_on_its_own(tmp_path):
    clip = scenes.make_scene_clip(tmp_path / "scene.avi")
    line = "door=" + ",".join(str(v) for v in scenes.LINE)
    with MultiPipeline(ULTRAFACE, {"east": clip, "west": clip}, task="detect", policy="every", lines=[line],
                       line_band=scenes.BAND) as multi:
        multi.start()
        assert multi.wait(120), "the two file streams did not end"
        stats = multi.stats()
    truth = scenes.SCENE_TRUTH
    for name in ("east", "west"):  # the same clip twice: two trackers, the same exact counts
        assert stats[name].frames == scenes.FRAMES
        assert stats[name].analytics["lines"]["door"] == {"in": truth["in"], "out": truth["out"]}, name

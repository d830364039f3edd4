"""Issue 29: a crossing (or a zone entry) counts only when it holds. Synthetic tracks of several box sizes
and frame rates (tests/support/crossings.py) through the real tracker and StreamAnalytics, no model."""

from __future__ import annotations

import pytest
from support import crossings as c

from edgeinfer.pipeline.analytics import StreamAnalytics, build_analytics
from edgeinfer.pipeline.options import PipelineOptions
from edgeinfer.pipeline.zones import DEFAULT_BAND, DEFAULT_HOLD_S, LineCounter, ZoneCounter

SIZES = (30, 100, 300)
RATES = (5, 15, 30)


def count(paths, size, fps, seconds, **options) -> dict[str, int]:
    """The line's counts after the clip, through a real tracker and StreamAnalytics timed by ``fps``."""
    analytics = build_analytics(lines={"door": c.line(size, len(paths))}, fps=fps, frame_rate=fps, **options)
    for frame_id, detections in c.frames(paths, size, fps, seconds):
        analytics.process(detections, frame_id)
    return analytics.counts()["lines"]["door"]


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("fps", RATES)
def test_the_doorway_clip_counts_its_four_real_crossings_and_not_the_loiterer(size, fps):
    """The issue's case: four people walk through while one stands in the doorway, its box jittering
    by ±12 % of its size across the line. The band alone counts the loiterer on every flip."""
    assert count(c.doorway(), size, fps, 20.0) == {"in": 2, "out": 2}
    if size == 100:  # the rule before issue 29 (the counts are the same at every size)
        bare = count(c.doorway(), size, fps, 20.0, band=0.1, hold_s=0)
        assert bare["in"] > 2 and bare["out"] > 2, bare


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("fps", RATES)
def test_a_loiterer_jittering_across_the_line_counts_nothing(size, fps):
    paths = [c.jitterer(0.10, 1), c.jitterer(0.15, 2), c.jitterer(0.15, 3)]  # ±10 %, ±15 % of the box
    assert count(paths, size, fps, 20.0) == {"in": 0, "out": 0}


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("fps", RATES)
def test_a_track_flickering_to_the_other_side_counts_nothing(size, fps):
    """Missing from a third of the frames, first seen on the other side each time it comes back."""
    paths = [c.flickerer(0.3, seed) for seed in range(3)]
    assert count(paths, size, fps, 20.0) == {"in": 0, "out": 0}


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("fps", RATES)
def test_real_crossings_count_once_each_way_slow_or_fast(size, fps):
    # walking (1 box size a second) and running (4: at 5 fps the box moves 0.8 of its size a frame)
    paths = [c.walker(0.5, 1.0, 1, seed=1), c.walker(0.5, 1.0, -1, seed=2),
             c.walker(0.5, 4.0, 1, seed=3), c.walker(0.5, 4.0, -1, seed=4)]
    assert count(paths, size, fps, 7.0) == {"in": 2, "out": 2}


def test_a_flip_that_does_not_hold_counts_nothing_and_the_event_comes_when_it_has_held():
    line = LineCounter("door", (320, 470), (320, 10), hold_s=0.3)
    box = lambda x: (x - 50, 200, x + 50, 300)  # noqa: E731 — 100 px box, anchor at (x, 300): band 15 px
    steps = [(0, 250), (1, 340), (2, 340), (3, 300), (4, 340), (5, 340), (6, 340), (7, 340), (8, 250)]
    events = [(f, line.update(1, "p", box(x), f, f / 10)) for f, x in steps]  # 10 fps: 0.3 s = 3 frames
    assert [(f, e.direction, e.timestamp) for f, e in events if e] == [(7, "in", 0.7)]
    # a frame without the box breaks the wait too (miss)
    line.update(2, "p", box(250), 0, 0.0)
    for f in range(1, 7):
        line.update(2, "p", box(340), f, f / 10) if f != 3 else line.miss(2)
    assert line.counts() == {"in": 1, "out": 0}
    assert line.update(2, "p", box(340), 7, 0.7).direction == "in"  # seen in 4, 5, 6, 7: 0.3 s
    # hold_s=0 is the bare band: counted the first frame beyond it
    bare = LineCounter("door", (320, 470), (320, 10), hold_s=0)
    assert bare.update(1, "p", box(250), 0, 0.0) is None and bare.update(1, "p", box(340), 1, 0.1).direction == "in"


def test_box_trigger_counts_when_the_whole_box_is_across():
    line = LineCounter("door", (320, 470), (320, 10), band=0, hold_s=0, trigger="box")
    box = lambda x: (x - 50, 200, x + 50, 300)  # noqa: E731
    assert line.update(1, "p", box(200), 0, 0.0) is None
    assert line.update(1, "p", box(340), 1, 0.1) is None  # the anchor is across, the box straddles the line
    assert line.update(1, "p", box(371), 2, 0.2).direction == "in"  # left edge at 321
    # jittering ±40 % of its size on the line never puts the whole box across
    assert count([c.jitterer(0.4, 1)], 100, 15, 30.0, trigger="box") == {"in": 0, "out": 0}
    assert count([c.walker(0.5, 1.0, 1), c.walker(0.5, 1.0, -1)], 100, 15, 7.0, trigger="box") == {"in": 1, "out": 1}


def test_a_zone_entry_and_exit_hold_too_and_dwell_is_measured_from_the_first_frame():
    zone = ZoneCounter("shop", [(400, 0), (640, 0), (640, 480), (400, 480)], hold_s=0.3)
    box = lambda x: (x - 50, 200, x + 50, 300)  # noqa: E731
    xs = [300, 430, 300, 430, 300, 430, 450, 460, 470, 480, 300, 430, 300, 300, 300, 300]  # 10 fps
    events = [(f, zone.update(1, "p", box(x), f, f / 10)) for f, x in enumerate(xs)]
    assert [(f, e.kind) for f, e in events if e] == [(8, "zone_entered"), (15, "zone_left")]
    left = events[15][1]
    assert left.dwell_s == pytest.approx(1.2 - 0.5)  # inside from frame 5 to frame 12 (first outside of the hold)
    assert zone.counts()["entries"] == 1 and zone.counts()["inside"] == 0


@pytest.mark.parametrize("fps", RATES)
def test_a_zone_on_the_line_side_of_a_jitterer_is_entered_by_walkers_only(fps):
    size = 100
    x = c.X + 0.0  # the zone is everything right of the line
    zone = [(x, 0), (x + 20 * size, 0), (x + 20 * size, 20 * size), (x, 20 * size)]
    analytics = build_analytics(zones={"right": zone}, fps=fps, frame_rate=fps)
    paths = [c.jitterer(0.15, 3), c.walker(0.5, 1.0, 1, seed=5)]
    for frame_id, detections in c.frames(paths, size, fps, 7.0):
        analytics.process(detections, frame_id)
    assert analytics.counts()["zones"]["right"]["entries"] == 1


def test_the_options_name_the_hold_and_the_trigger():
    options = PipelineOptions(lines=("door=320,470,320,10",), line_hold_s=0.5, line_trigger="box")
    assert (PipelineOptions().line_band, PipelineOptions().line_hold_s) == (DEFAULT_BAND, DEFAULT_HOLD_S)
    from edgeinfer.pipeline.analytics import analytics_from_options

    analytics = analytics_from_options(options, fps=12.5)
    assert isinstance(analytics, StreamAnalytics) and analytics.fps == 12.5
    (line,) = analytics.lines
    assert (line.hold_s, line.trigger, line.band) == (0.5, "box", DEFAULT_BAND)
    for bad in ({"line_hold_s": -1}, {"line_hold_s": float("nan")}, {"line_band": float("inf")},
                {"line_trigger": "feet"}):
        with pytest.raises(ValueError, match="line_"):
            PipelineOptions(**bad)

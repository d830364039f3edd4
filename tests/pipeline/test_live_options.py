"""A running run takes new thresholds, max_fps, lines, event and capture rules without a new stream: the capture
threads and the frame ids go on (pipeline/live_options.py), on a real detector reading the scene clip."""

from __future__ import annotations

import dataclasses
import threading
import time
from collections import defaultdict

import pytest
from support import scenes
from support.pipeline import ULTRAFACE
from support.processes import wait_until

from edgeinfer.pipeline.live_options import LIVE_OPTIONS, restart_needed
from edgeinfer.pipeline.multi import MultiPipeline
from edgeinfer.pipeline.options import PipelineOptions

LINE = "door=" + ",".join(str(v) for v in scenes.LINE)


@pytest.fixture(scope="module")
def clip(tmp_path_factory):
    return scenes.make_scene_clip(tmp_path_factory.mktemp("scene") / "scene.avi")


class Results:
    """Every result's frame id per stream, and each result's detections' lowest score, after a mark."""

    def __init__(self) -> None:
        self.ids: dict[str, list[int]] = defaultdict(list)
        self.lowest_after: list[float] = []
        self.mark: float | None = None
        self.lock = threading.Lock()

    def __call__(self, result) -> None:
        with self.lock:
            self.ids[result.stream].append(result.frame_id)
            if self.mark is not None and result.timestamp > self.mark:
                self.lowest_after += [d.score for d in result.result.items]

    def count(self, stream: str) -> int:
        with self.lock:
            return len(self.ids[stream])


def test_new_lines_rules_capture_threshold_and_pace_reach_a_running_run_without_a_new_stream(clip, tmp_path):
    results = Results()
    with MultiPipeline(ULTRAFACE, {"a": str(clip), "b": str(clip)}, task="detect", loop=True, policy="every",
                       threads=1, score_threshold=0.3) as run:
        run.start(callback=results)
        assert wait_until(lambda: results.count("a") >= 10 and results.count("b") >= 10, 60)
        before = {name: run.get_stream(name) for name in run.streams}
        assert all(stream.analytics is None and stream.sampler is None for stream in before.values())
        options = dataclasses.replace(run.options, lines=(LINE,), events=("line_crossed:door",),
                                      evidence_dir=str(tmp_path / "evidence"), capture=("random:1",),
                                      capture_dir=str(tmp_path / "samples"), score_threshold=0.7, max_fps=40.0)
        fired: list[dict] = []
        changed = run.reconfigure(options)
        run.add_event_listener(fired.append)  # event rules the run did not have now take listeners
        results.mark = time.time()
        assert changed == {"lines", "events", "evidence_dir", "capture", "capture_dir", "score_threshold", "max_fps"}
        assert {name: run.get_stream(name) for name in run.streams} == before  # the same streams, still reading
        counted = {name: results.count(name) for name in before}
        assert wait_until(lambda: all(results.count(n) >= counted[n] + 40 for n in before), 90)
        for name, ids in results.ids.items():  # no stream began again: the ids go on rising
            assert ids == sorted(ids) and len(set(ids)) == len(ids), name
        for stream in before.values():
            assert [line.name for line in stream.analytics.lines] == ["door"]
            assert stream.events is not None and stream.sampler is not None
        assert results.lowest_after and min(results.lowest_after) >= 0.7  # the new threshold decodes
        assert wait_until(lambda: any((tmp_path / "samples" / name).glob("*/sample.json") for name in ("a", "b")), 30)
        assert wait_until(lambda: fired, 60), "the scene's faces cross the line: the new rule fires"
        assert run.options.max_fps == 40.0 and run.options.task == "detect"

        # and back: no lines, no rules, no capture; the analytics dropped, the rules' parts closed
        events = before["a"].events
        assert run.reconfigure(dataclasses.replace(options, lines=(), events=(), capture=())) == {
            "lines", "events", "capture"}
        assert all(s.analytics is None and s.events is None and s.sampler is None for s in before.values())
        assert events._closed
        counted = {name: results.count(name) for name in before}
        assert wait_until(lambda: all(results.count(n) >= counted[n] + 10 for n in before), 60)


def test_what_a_running_run_cannot_take_is_refused_and_nothing_changes(clip):
    with MultiPipeline(ULTRAFACE, {"a": str(clip)}, task="detect", loop=True, threads=1) as run:
        run.start()
        before = run.options
        for change in ({"delegate": "xnnpack"}, {"queue_size": 4}, {"resize": "crop"}, {"fps": 5.0}):
            with pytest.raises(ValueError, match=f"{next(iter(change))} cannot change while the pipeline runs"):
                run.reconfigure(dataclasses.replace(before, **change))
        with pytest.raises(ValueError, match="event rule 'line_crossed:gate'"):
            run.reconfigure(dataclasses.replace(before, lines=(LINE,), events=("line_crossed:gate",)))
        assert run.options == before and run.get_stream("a").analytics is None


def test_the_live_options_are_the_ones_restart_needed_lets_through():
    old = PipelineOptions(task="detect")
    for name in LIVE_OPTIONS:
        value = getattr(old, name)
        new_value = {bool: not value, tuple: ("x=1,2,3,4",) if name in ("lines",) else value}.get(type(value), value)
        assert name not in restart_needed(old, dataclasses.replace(old, **{name: new_value}))
    assert restart_needed(old, dataclasses.replace(old, delegate="coral")) == {"delegate"}
    assert restart_needed(old, dataclasses.replace(old, task="pose")) == {"task"}

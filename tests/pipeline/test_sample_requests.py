"""Frames asked for (the dashboard's "sample the next N frames", the agent's ``sample`` command): exactly the next
N frames kept under the rule ``request``, on a pipeline whose only rule is ``request`` or beside other rules; a
pipeline that does not sample, or a stream it does not have, refused by name."""

from __future__ import annotations

import json

import pytest
from support import scenes
from support.pipeline import ULTRAFACE

from edgeinfer.forms.samples import REQUEST_RULE, SAMPLE_META_NAME
from edgeinfer.pipeline.multi import MultiPipeline


@pytest.fixture(scope="module")
def clip(tmp_path_factory):
    return scenes.make_scene_clip(tmp_path_factory.mktemp("scene") / "scene.avi")


def _rules(folder):
    return sorted(json.loads(meta.read_text())["rule"] for meta in folder.glob(f"*/*/{SAMPLE_META_NAME}"))


def test_a_request_keeps_exactly_the_next_frames_and_the_request_rule_alone_keeps_nothing_else(clip, tmp_path):
    with MultiPipeline(ULTRAFACE, {"door": clip}, task="detect", policy="every", sample=[REQUEST_RULE],
                       samples_dir=tmp_path, samples_per_minute=1, name="lobby") as pipeline:
        pipeline.samples.describe("lobby", "4")
        assert pipeline.samples.request(3) == ["door"]
        results = list(pipeline)
    assert len(results) == scenes.FRAMES and _rules(tmp_path) == [REQUEST_RULE] * 3  # per_minute: not for asks
    metas = [json.loads(m.read_text()) for m in tmp_path.glob(f"*/*/{SAMPLE_META_NAME}")]
    assert sorted(m["frame_id"] for m in metas) == [0, 1, 2]
    assert {(m["pipeline"], m["stream"], m["model"]["version"]) for m in metas} == {("lobby", "door", "4")}


def test_a_pipeline_without_capture_or_without_the_stream_refuses_a_request(clip, tmp_path):
    with MultiPipeline(ULTRAFACE, {"door": clip}, task="detect") as pipeline, \
            pytest.raises(ValueError, match="does not sample"):
        pipeline.samples.request(3)
    with MultiPipeline(ULTRAFACE, {"door": clip}, task="detect", sample=["request"],
                       samples_dir=tmp_path) as pipeline, \
            pytest.raises(ValueError, match="no open stream 'yard'"):
        pipeline.samples.request(3, "yard")

"""Capture rules (docs/datasets.md) with the real face detector on the generated scene clip."""

from __future__ import annotations

import json
import os

import cv2
import pytest
from support import scenes
from support.pipeline import ULTRAFACE

from edgeinfer import Pipeline
from edgeinfer._samples import PHASH, SAMPLE_FRAME_NAME, SAMPLE_ID, SAMPLE_META_NAME
from edgeinfer.pipeline.sampling import CaptureRule, SampleStore


@pytest.fixture(scope="module")
def clip(tmp_path_factory):
    return scenes.make_scene_clip(tmp_path_factory.mktemp("scene") / "scene.avi")


def _run(clip, folder, rules, **options):
    results = []
    with Pipeline(ULTRAFACE, clip, task="detect", capture=rules, capture_dir=folder, **options) as pipeline:
        results = list(pipeline)
    return results, pipeline.sampler


def _samples(folder):
    found = [(json.loads((f / SAMPLE_META_NAME).read_text()), f) for f in folder.iterdir()
             if (f / SAMPLE_META_NAME).exists()] if folder.exists() else []
    return sorted(found, key=lambda pair: pair[0]["frame_id"])


def _metas(folder):
    return [meta for meta, _ in _samples(folder)]


def test_the_uncertain_band_keeps_exactly_the_frames_with_a_box_in_it(clip, tmp_path):
    # the detector's own threshold lowered so that it reports boxes it is unsure of
    results, sampler = _run(clip, tmp_path / "c", ["uncertain:0.05-0.5"], capture_per_minute=1000,
                            score_threshold=0.05)
    expected = {r.frame_id for r in results if any(0.05 <= d.score < 0.5 for d in r.result)}
    metas = _metas(tmp_path / "c")
    kept = {m["frame_id"] for m in metas}
    # a file read faster than the disk writes drops samples at the queue: counted, never silent
    assert expected and kept <= expected and len(kept) + sampler.counts()["dropped"] == len(expected)
    for meta, folder in _samples(tmp_path / "c"):
        assert meta["rule"] == "uncertain:0.05-0.5" and (meta["width"], meta["height"]) == scenes.SIZE
        assert any(0.05 <= d["score"] < 0.5 for d in meta["output"])
        assert meta["model"]["name"] == os.path.basename(ULTRAFACE) and len(meta["model"]["sha256"]) == 64
        # the labels a dataset gets: the model's boxes, in the frame, the same as its output's
        assert [d["box"] for d in meta["detections"]] == [
            [min(max(v, 0.0), limit) for v, limit in zip(o["box"], scenes.SIZE * 2)] for o in meta["output"]]
        assert PHASH.match(meta["phash"]) and SAMPLE_ID.match(meta["sample_id"]) and meta["sample_id"] == folder.name
        image = cv2.imread(str(folder / SAMPLE_FRAME_NAME))
        assert image.shape[1::-1] == scenes.SIZE  # full size


def test_a_band_nothing_scores_in_keeps_nothing_and_capture_is_off_by_default(clip, tmp_path):
    results, _ = _run(clip, tmp_path / "c", ["uncertain:0.0-0.01"])
    assert results and _metas(tmp_path / "c") == []
    with Pipeline(ULTRAFACE, clip, task="detect", max_frames=5) as pipeline:
        list(pipeline)
    assert pipeline.options.capture == () and pipeline.options.capture_dir is None


def test_the_rate_limit_holds_per_rule(clip, tmp_path):
    # the first rule keeps a frame it fires on; the second gets the frames the first's limit leaves
    _run(clip, tmp_path / "c", ["event:detection:0.5", "random:1.0"], capture_per_minute=3)
    rules = [m["rule"] for m in _metas(tmp_path / "c")]
    assert rules.count("event:detection:0.5") == 3 and rules.count("random:1.0") == 3 and len(rules) == 6


def test_an_event_rule_keeps_the_frames_it_fires_on(clip, tmp_path):
    _run(clip, tmp_path / "c", ["event:line_crossed"], capture_per_minute=1000,
                      lines=["door=" + ",".join(str(int(v)) for v in scenes.LINE)], line_band=scenes.BAND)
    metas = _metas(tmp_path / "c")
    assert len(metas) == scenes.SCENE_TRUTH["in"] + scenes.SCENE_TRUTH["out"]
    assert {m["rule"] for m in metas} == {"event:line_crossed"}


def test_drift_keeps_nothing_on_a_steady_scene(clip, tmp_path):
    _run(clip, tmp_path / "steady", ["drift:0.99@20"], capture_per_minute=1000)
    assert _metas(tmp_path / "steady") == []


def test_the_store_stays_under_its_bound_dropping_the_oldest(clip, tmp_path):
    bound = 0.2  # MB: a few full-size JPEGs
    _run(clip, tmp_path / "c", ["random:1.0"], capture_per_minute=1000, capture_max_mb=bound)
    store = SampleStore(tmp_path / "c", int(bound * 1024 * 1024))
    assert len(store) > 1 and store.total_bytes <= bound * 1024 * 1024
    assert max(m["frame_id"] for m in _metas(tmp_path / "c")) >= scenes.FRAMES - 3  # the newest kept


def test_a_full_store_is_a_clear_error_and_keeps_what_is_stored(clip, tmp_path, caplog):
    folder = tmp_path / "c"
    _run(clip, folder, ["random:1.0"], max_frames=2, capture_per_minute=1000)
    before = {f.name: (f / SAMPLE_FRAME_NAME).read_bytes() for f in folder.iterdir()}
    assert len(before) == 2
    with Pipeline(ULTRAFACE, clip, task="detect", capture=["random:1.0"], capture_dir=folder,
                  capture_max_mb=4 / 1024, max_frames=3) as pipeline:  # 4 KB: no full frame fits
        list(pipeline)
    assert "larger than the store's bound" in caplog.text
    assert {f.name: (f / SAMPLE_FRAME_NAME).read_bytes() for f in folder.iterdir()} == before


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into a read-only folder")
def test_a_read_only_folder_is_a_clear_error_and_keeps_what_is_stored(clip, tmp_path, caplog):
    folder = tmp_path / "c"
    _run(clip, folder, ["random:1.0"], max_frames=2, capture_per_minute=1000)
    before = sorted(f.name for f in folder.iterdir())
    folder.chmod(0o555)
    try:
        _run(clip, folder, ["random:1.0"], max_frames=3, capture_per_minute=1000)
    finally:
        folder.chmod(0o755)
    assert "cannot write capture sample" in caplog.text
    assert sorted(f.name for f in folder.iterdir()) == before


def test_a_request_keeps_the_next_n_frames(clip, tmp_path):
    with Pipeline(ULTRAFACE, clip, task="detect", capture=["uncertain:0.0-0.01"], capture_dir=tmp_path / "c",
                  max_frames=20) as pipeline:
        pipeline.sampler.request(4)
        list(pipeline)
    metas = _metas(tmp_path / "c")
    assert [m["rule"] for m in metas] == ["request"] * 4


@pytest.mark.parametrize("text", ["uncertain:0.9-0.5", "uncertain:x", "drift:2", "random:0", "event:nope",
                                  "sometimes:1"])
def test_a_bad_rule_is_refused_saying_why(text):
    with pytest.raises(ValueError, match="capture rule"):
        CaptureRule.parse(text)

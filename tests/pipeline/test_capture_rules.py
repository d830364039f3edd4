"""Capture rules (docs/datasets.md) with the real face detector on the generated scene clip, and the COCO SSD
detector on clips of the shared photos (a scene that changes, a capture folder on a full disk)."""

from __future__ import annotations

import json
import os

import cv2
import numpy as np
import pytest
from support import disk, scenes
from support.pipeline import IMAGES, LABELS, MODELS, ULTRAFACE

from edgeinfer import Pipeline
from edgeinfer._evidence import new_event_id
from edgeinfer._samples import PHASH, SAMPLE_FRAME_NAME, SAMPLE_ID, SAMPLE_META_NAME
from edgeinfer.capture import make_test_clip
from edgeinfer.errors import OutputError
from edgeinfer.pipeline.sampling import CaptureRule, SampleStore

COCO_SSD = MODELS / "mobilenet_ssd_v2_coco_quant_postprocess.tflite"
#: frames of each photo in the COCO clips: kites and people, then two dogs
PHOTO_FRAMES = 20


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
    results, _ = _run(clip, tmp_path / "c", ["uncertain:0.0-0.01"], score_threshold=0.0)  # no box scores under 0.01
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


def test_a_request_keeps_the_next_n_frames(clip, tmp_path):
    with Pipeline(ULTRAFACE, clip, task="detect", capture=["request"], capture_dir=tmp_path / "c",
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


# -------------------------------------------------------------------------- the COCO detector on photo clips
@pytest.fixture(scope="module")
def photo_clips(tmp_path_factory):
    """``steady``: kite_and_cold.jpg (kites, people) all along; ``change``: the same, then pets.jpg (dogs)."""
    folder = tmp_path_factory.mktemp("photos")
    kite, pets = IMAGES / "kite_and_cold.jpg", IMAGES / "pets.jpg"
    return {"steady": make_test_clip(folder / "steady.avi", [kite, kite], frames_per_image=PHOTO_FRAMES),
            "change": make_test_clip(folder / "change.avi", [kite, pets], frames_per_image=PHOTO_FRAMES)}


def _run_coco(clip, folder, rules, **options):
    with Pipeline(COCO_SSD, clip, labels=LABELS / "coco_labels.txt", capture=rules, capture_dir=folder,
                  **options) as pipeline:
        results = list(pipeline)
    assert pipeline.error is None
    return results, pipeline.sampler


def test_drift_keeps_frames_once_the_scene_changes_and_none_while_it_stays(photo_clips, tmp_path):
    rule = "drift:0.5@10"  # baseline: the first 10 frames' labels; window: the last 10 frames'
    results, sampler = _run_coco(photo_clips["steady"], tmp_path / "steady", [rule], capture_per_minute=1000)
    assert len(results) == 2 * PHOTO_FRAMES and {d.label for d in results[-1].result} == {"kite", "person"}
    assert _metas(tmp_path / "steady") == [] and sampler.counts()["kept"] == 0

    results, sampler = _run_coco(photo_clips["change"], tmp_path / "change", [rule], capture_per_minute=1000)
    assert {d.label for d in results[-1].result} == {"dog"}
    metas = _metas(tmp_path / "change")
    assert metas and sampler.counts()["written"] == len(metas)
    # nothing kept before the dogs came; the window must be mostly dogs before the distance passes 0.5
    assert min(m["frame_id"] for m in metas) > PHOTO_FRAMES
    for meta in metas:
        assert meta["rule"] == rule and {d["label"] for d in meta["output"]} == {"dog"}


def test_the_rate_limit_is_per_rule_and_counted(photo_clips, tmp_path):
    rules = ["event:detection:0.5/kite", "event:detection:0.5/person"]  # both fire on every frame
    frames = 12
    _, sampler = _run_coco(photo_clips["steady"], tmp_path / "c", rules, capture_per_minute=2, max_frames=frames)
    # the kite rule keeps frames 0 and 1; its limit reached, the person rule keeps 2 and 3; then neither
    assert [(m["frame_id"], m["rule"]) for m in _metas(tmp_path / "c")] == [
        (0, rules[0]), (1, rules[0]), (2, rules[1]), (3, rules[1])]
    counts = sampler.counts()
    assert counts["kept"] == counts["written"] == 4
    assert counts["rate_limited"] == 2 + 2 * (frames - 4)  # the kite rule on 2 and 3, both rules after


def _jpeg(name: str) -> bytes:
    return cv2.imencode(".jpg", cv2.resize(cv2.imread(str(IMAGES / name)), (640, 480)))[1].tobytes()


def test_the_bounded_store_deletes_the_oldest_first_and_only_what_it_must(tmp_path):
    photos = ["kite_and_cold.jpg", "pets.jpg", "cat_720p.jpg", "parrot.jpg", "grace_hopper.bmp", "squat.bmp"]
    frames = [_jpeg(name) for name in photos]
    bound = 2 * max(len(f) for f in frames) + 10_000  # two or three samples at a time
    store = SampleStore(tmp_path / "c", bound)
    ids = [new_event_id(i, now=1_800_000_000.0 + i) for i in range(len(frames))]  # ids in time order
    sizes = {}
    for i, (sample_id, jpeg) in enumerate(zip(ids, frames)):
        folder = store.write(sample_id, jpeg, {"sample_id": sample_id, "frame_id": i})
        sizes[sample_id] = len(jpeg) + (folder / SAMPLE_META_NAME).stat().st_size
        kept = [f.name for f in store.list()]
        written = ids[:i + 1]
        assert kept == written[len(written) - len(kept):]  # the newest, in order: only the oldest went
        assert store.total_bytes == sum(sizes[k] for k in kept) <= bound
        if len(kept) < len(written):  # the next older one would not have fitted
            assert store.total_bytes + sizes[written[-len(kept) - 1]] > bound
        assert sorted(p.name for p in (tmp_path / "c").iterdir()) == kept  # the deleted ones are gone from disk
    assert len(store) < len(frames)
    with pytest.raises(OutputError, match="larger than the store's bound"):
        store.write(new_event_id(99), b"\xff" * bound, {})
    reloaded = SampleStore(tmp_path / "c", bound)
    assert reloaded.list() == store.list() and reloaded.total_bytes == store.total_bytes


def test_a_reloaded_store_removes_a_partial_sample_and_keeps_the_whole_ones(photo_clips, tmp_path):
    folder = tmp_path / "c"
    _run_coco(photo_clips["steady"], folder, ["random:1.0"], capture_per_minute=1000, max_frames=2)
    whole = {f.name: (f / SAMPLE_FRAME_NAME).read_bytes() for f in folder.iterdir()}
    assert len(whole) == 2
    # a crash between the frame and its sample.json: the frame and the metadata's temporary file, no sample.json
    partial = folder / new_event_id(7)
    partial.mkdir()
    (partial / SAMPLE_FRAME_NAME).write_bytes(next(iter(whole.values())))
    (partial / f".sample.{os.getpid()}-0.tmp.json").write_text('{"rule": "ran')
    store = SampleStore(folder, 100 * 1024 * 1024)
    assert sorted(f.name for f in store.list()) == sorted(whole) and not partial.exists()
    assert {f.name: (f / SAMPLE_FRAME_NAME).read_bytes() for f in folder.iterdir()} == whole
    assert store.total_bytes == sum(len(b) + (folder / n / SAMPLE_META_NAME).stat().st_size for n, b in whole.items())


@pytest.fixture
def small_disk(tmp_path):
    """A 256 KiB tmpfs: three full-size samples fit, the fourth does not."""
    with disk.small_disk(tmp_path / "disk", 256) as mount:
        yield mount


def _stored(folder):
    """Every sample folder: its sample.json (parsed: it must be whole) and its frame's bytes (decodable)."""
    found = {}
    for entry in folder.iterdir():
        frame = (entry / SAMPLE_FRAME_NAME).read_bytes()
        assert cv2.imdecode(np.frombuffer(frame, np.uint8), cv2.IMREAD_COLOR) is not None
        found[entry.name] = (json.loads((entry / SAMPLE_META_NAME).read_text()), frame)
    return found


def test_a_full_disk_counts_failed_samples_the_inference_goes_on_and_the_stored_stay_whole(photo_clips,
                                                                                           small_disk):
    folder = small_disk / "samples"
    frames = 10
    results, sampler = _run_coco(photo_clips["steady"], folder, ["random:1.0"], capture_per_minute=1000,
                                 max_frames=frames)
    assert [r.frame_id for r in results] == list(range(frames))  # every frame inferred
    counts = sampler.counts()
    assert counts["written"] >= 1 and counts["failed"] >= 1 and counts["kept"] == counts["written"] + counts["failed"]
    assert "cannot write capture sample" in sampler.last_error and "No space left on device" in sampler.last_error
    stored = _stored(folder)  # no partial folder left behind by the failed ones
    assert len(stored) == counts["written"]

    # the disk still full: a second run keeps nothing new, changes nothing stored, and infers every frame
    results, sampler = _run_coco(photo_clips["steady"], folder, ["random:1.0"], capture_per_minute=1000,
                                 max_frames=frames)
    assert len(results) == frames and sampler.counts()["written"] == 0 and sampler.counts()["failed"] >= 1
    assert "No space left on device" in sampler.last_error
    assert _stored(folder) == stored

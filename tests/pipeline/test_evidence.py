"""Event evidence: the pre-roll ring, recordings (snapshot, pre-roll, post-roll) and the bounded store.

Frames are ``cat_720p.jpg`` (1280x720) with a crop of ``parrot.jpg`` moving across it, one position
per frame id, offered at 30 fps by the timestamps the tests choose (``id / 30``). The history keeps
5 fps (every 6th frame) of the last 2 s; the recorder's post-roll is 3 s.
"""

from __future__ import annotations

import json
import tracemalloc
from pathlib import Path

import cv2
import numpy as np
import pytest
from support.assets import IMAGES

from edgeinfer.capture import open_source
from edgeinfer.capture.mjpeg import MjpegFileSource
from edgeinfer.capture.mjpeg import available as pyav_available
from edgeinfer.errors import InputMismatch
from edgeinfer.pipeline.evidence import (
    CLIP_NAME,
    EVENT_ID,
    META_NAME,
    PLAIN_SNAPSHOT_NAME,
    SNAPSHOT_NAME,
    EncodedFrame,
    EvidenceRecorder,
    EvidenceStore,
    FrameHistory,
    new_event_id,
)

CAMERA_FPS = 30
STEP = 6  # 30 fps camera, 5 fps history: every 6th frame


@pytest.fixture(scope="module")
def scene():
    background = cv2.imread(str(IMAGES / "cat_720p.jpg"))
    parrot = cv2.imread(str(IMAGES / "parrot.jpg"))
    assert background is not None and parrot is not None and background.shape == (720, 1280, 3)
    return background, cv2.resize(parrot, (240, 240), interpolation=cv2.INTER_AREA)


def make_frame(scene, frame_id: int) -> np.ndarray:
    background, sprite = scene
    frame = background.copy()
    x = (frame_id * 5) % (1280 - 240)
    y = 240 + int(120 * np.sin(frame_id / 15))
    frame[y:y + 240, x:x + 240] = sprite
    return frame


def ts(frame_id: int) -> float:
    return frame_id / CAMERA_FPS


def feed(target, scene, ids) -> None:
    for frame_id in ids:
        target.offer(make_frame(scene, frame_id), frame_id, ts(frame_id))


def small(frame: np.ndarray) -> np.ndarray:
    return cv2.resize(frame, (640, 360), interpolation=cv2.INTER_AREA)


def read_all(source) -> list[np.ndarray]:
    frames = []
    try:
        while (frame := source.read()) is not None:
            frames.append(frame.copy())
    finally:
        source.close()
    return frames


def count_encodes(monkeypatch) -> dict[str, int]:
    calls = {"imencode": 0, "resize": 0}
    for name in calls:
        original = getattr(cv2, name)

        def spy(*args, _name=name, _original=original, **kwargs):
            calls[_name] += 1
            return _original(*args, **kwargs)

        monkeypatch.setattr(cv2, name, spy)
    return calls


# ------------------------------------------------------------------------------- the history


def test_the_history_holds_exactly_the_last_seconds_at_fps(scene):
    history = FrameHistory(seconds=2.0, fps=5.0, width=640)
    assert history.snapshot() is None and history.frames() == []
    feed(history, scene, range(120))
    assert [frame.frame_id for frame in history.frames()] == list(range(60, 120, STEP))
    assert [frame.timestamp for frame in history.frames()] == [ts(i) for i in range(60, 120, STEP)]
    assert (history.offered, history.kept, history.capacity) == (120, 20, 10)
    newest = history.snapshot()
    assert newest.frame_id == 114 and newest.jpeg[:2] == b"\xff\xd8" and newest.jpeg[-2:] == b"\xff\xd9"
    decoded = cv2.imdecode(np.frombuffer(newest.jpeg, np.uint8), cv2.IMREAD_COLOR)
    assert decoded.shape == (360, 640, 3)


def test_a_gap_restarts_the_grid_and_a_forced_frame_is_kept_once(scene):
    history = FrameHistory(seconds=2.0, fps=5.0)
    feed(history, scene, [0, 1, 6])
    history.offer(make_frame(scene, 7), 7, ts(7), keep=True)  # the frame an event was decided on
    assert history.offer(make_frame(scene, 7), 7, ts(7), keep=True) is history.snapshot()  # no re-encode
    feed(history, scene, [8, 12, 100, 101, 106])  # 100: after a stall, the grid starts again there
    assert [frame.frame_id for frame in history.frames()] == [100, 106]  # 0..12 are older than 2 s
    assert [f.frame_id for f in history._frames] == [0, 6, 7, 12, 100, 106]


def test_a_frame_the_history_skips_costs_no_encode(scene, monkeypatch):
    history = FrameHistory(seconds=2.0, fps=5.0)
    frame = make_frame(scene, 0)
    calls = count_encodes(monkeypatch)
    assert history.offer(frame, 0, 0.0) is not None
    assert calls == {"imencode": 1, "resize": 1}
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        tracemalloc.reset_peak()
        for frame_id in range(1, 6):
            assert history.offer(frame, frame_id, ts(frame_id)) is None
        peak = tracemalloc.get_traced_memory()[1] - before
    finally:
        tracemalloc.stop()
    assert calls == {"imencode": 1, "resize": 1}
    assert peak < 4096, f"a skipped frame allocated {peak} bytes (a 640x360 copy alone is 691200)"


@pytest.mark.parametrize("bad", [np.zeros((36, 64, 3), np.float32), np.zeros((36, 64), np.uint8),
                                 np.zeros((36, 64, 4), np.uint8), np.zeros((0, 64, 3), np.uint8),
                                 [[0, 0, 0]]])
def test_a_frame_that_is_not_uint8_bgr_raises_input_mismatch(bad, tmp_path):
    recorder = EvidenceRecorder(EvidenceStore(tmp_path), FrameHistory())
    with pytest.raises(InputMismatch):
        recorder.offer(bad, 0, 0.0)
    with pytest.raises(ValueError):  # InputMismatch is a ValueError too
        FrameHistory().offer(bad, 0, 0.0)


# ------------------------------------------------------------------------------- recordings


def test_a_trigger_writes_snapshot_and_clip_of_pre_and_post_roll(scene, tmp_path):
    store = EvidenceStore(tmp_path / "evidence", mp4=False)  # the kept JPEGs themselves (MP4: test_evidence_moment)
    recorder = EvidenceRecorder(store, FrameHistory(seconds=2.0, fps=5.0), post_s=3.0)
    feed(recorder, scene, range(90))  # 0 .. 2.97 s; the newest kept frame is 84 (2.8 s)
    event = {"rule": "line_crossed", "line": "door", "track_id": 7, "label": "bird"}
    event_id = recorder.trigger(event)
    assert EVENT_ID.match(event_id) and "-84-" in event_id
    feed(recorder, scene, range(90, 174))  # the post-roll ends at 2.8 + 3 = 5.8 s: frame 174
    assert recorder.finished() == [] and recorder.recording == 1 and store.list() == []
    feed(recorder, scene, [174])
    [done] = recorder.finished()
    assert recorder.recording == 0 and recorder.finished() == []

    pre, post = list(range(30, 85, STEP)), list(range(90, 175, STEP))
    assert (len(pre), len(post)) == (10, 15)
    assert done["event_id"] == event_id and done["event"] == event
    assert (done["frames"], done["first_frame_id"], done["last_frame_id"]) == (25, 30, 174)
    assert (done["snapshot_frame_id"], done["start"], done["end"]) == (84, ts(30), ts(174))

    snapshot = cv2.imread(done["snapshot"])
    assert snapshot.shape == (360, 640, 3)
    assert np.abs(snapshot.astype(int) - small(make_frame(scene, 84))).mean() < 4
    assert np.abs(snapshot.astype(int) - small(make_frame(scene, 30))).mean() > 8  # the parrot moved

    clip_frames = read_all(open_source(done["clip"]))
    assert len(clip_frames) == 25 and clip_frames[0].shape == (360, 640, 3)
    for index, frame_id in [(0, 30), (9, 84), (10, 90), (24, 174)]:
        assert np.abs(clip_frames[index].astype(int) - small(make_frame(scene, frame_id))).mean() < 4
    if pyav_available():  # the reduced-scale MJPEG reader demuxes it too
        assert len(read_all(MjpegFileSource(done["clip"]).open())) == 25

    [stored] = store.list()
    assert stored.event_id == event_id and store.get(event_id) == stored
    assert sorted(p.name for p in stored.folder.iterdir()) == [CLIP_NAME, META_NAME, PLAIN_SNAPSHOT_NAME,
                                                               SNAPSHOT_NAME]
    assert done["bytes"] == store.total_bytes == sum(p.stat().st_size for p in stored.folder.iterdir())
    assert json.loads((stored.folder / META_NAME).read_text())["event"] == event


def test_the_event_frame_offered_with_keep_is_the_snapshot(scene, tmp_path):
    recorder = EvidenceRecorder(EvidenceStore(tmp_path), FrameHistory(seconds=2.0, fps=5.0), post_s=0.5)
    feed(recorder, scene, range(89))
    recorder.offer(make_frame(scene, 89), 89, ts(89), keep=True)
    recorder.trigger({"rule": "score", "score": 0.91})
    feed(recorder, scene, range(90, 110))
    [done] = recorder.finished()
    assert done["snapshot_frame_id"] == 89 and done["last_frame_id"] == 102  # 89/30 + 0.5 s = frame 104
    assert (done["first_frame_id"], done["frames"]) == (36, 10 + 3)  # the ring (36..84 and 89); 90, 96, 102


def test_overlapping_triggers_share_each_encoded_frame(scene, tmp_path, monkeypatch):
    calls = count_encodes(monkeypatch)
    recorder = EvidenceRecorder(EvidenceStore(tmp_path, mp4=False), FrameHistory(seconds=2.0, fps=5.0), post_s=3.0)
    feed(recorder, scene, range(61))
    first = recorder.trigger({"n": 1})  # newest kept: 60 (2.0 s), ends at 5.0 s
    feed(recorder, scene, range(61, 91))
    second = recorder.trigger({"n": 2})  # newest kept: 90 (3.0 s), ends at 6.0 s
    assert recorder.recording == 2
    feed(recorder, scene, range(91, 181))
    done = {event["event_id"]: event for event in recorder.finished()}
    assert (done[first]["first_frame_id"], done[first]["last_frame_id"], done[first]["frames"]) == (6, 150, 25)
    assert (done[second]["first_frame_id"], done[second]["last_frame_id"], done[second]["frames"]) == (36, 180, 25)
    assert calls["imencode"] == recorder.history.kept == len(range(0, 181, STEP))  # once per kept frame
    first_clip = Path(done[first]["clip"]).read_bytes()
    second_clip = Path(done[second]["clip"]).read_bytes()
    shared = b"".join(frame.jpeg for frame in recorder.history.frames() if frame.frame_id <= 150)
    assert shared and shared in first_clip and shared in second_clip  # the same bytes, not re-encoded


def test_flush_at_shutdown_writes_what_is_pending(scene, tmp_path):
    store = EvidenceStore(tmp_path)
    recorder = EvidenceRecorder(store, FrameHistory(seconds=1.0, fps=5.0), post_s=3.0)
    feed(recorder, scene, range(40))
    recorder.trigger({"n": 1})
    feed(recorder, scene, range(40, 50))
    assert recorder.finished() == []
    recorder.flush()
    [done] = recorder.finished()
    assert (done["first_frame_id"], done["last_frame_id"], done["frames"]) == (12, 48, 5 + 2)  # the ring 12..36; 42, 48
    assert recorder.recording == 0 and len(store) == 1
    assert len(read_all(open_source(done["clip"]))) == 7


def test_a_trigger_before_any_frame_starts_at_the_first(scene, tmp_path):
    recorder = EvidenceRecorder(EvidenceStore(tmp_path), FrameHistory(seconds=2.0, fps=5.0), post_s=0.4)
    recorder.trigger({"n": 0})
    feed(recorder, scene, range(20))
    [done] = recorder.finished()
    assert (done["snapshot_frame_id"], done["first_frame_id"], done["last_frame_id"]) == (0, 0, 12)
    with pytest.raises(TypeError):
        recorder.trigger({"not json": object()})


# ------------------------------------------------------------------------------- the store


def jpeg_of(size: int, seed: int) -> EncodedFrame:
    body = np.random.default_rng(seed).integers(0, 255, size, dtype=np.uint8).tobytes()
    return EncodedFrame(seed, seed / 5, b"\xff\xd8" + body + b"\xff\xd9")


def write_events(store: EvidenceStore, count: int, size: int = 10_000) -> list[str]:
    ids = []
    for index in range(count):
        event_id = new_event_id(index, now=1_700_000_000 + index)
        frames = [jpeg_of(size, index * 10 + k) for k in range(3)]
        store.write(event_id, {"n": index}, frames[-1], frames)
        ids.append(event_id)
    return ids


def test_the_count_bound_deletes_the_oldest_and_survives_a_restart(tmp_path):
    store = EvidenceStore(tmp_path, max_events=3)
    ids = write_events(store, 5)
    assert [event.event_id for event in store.list()] == ids[:1:-1]  # newest first
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(ids[2:])
    reopened = EvidenceStore(tmp_path, max_events=3)
    assert [event.event_id for event in reopened.list()] == ids[:1:-1] and reopened.cleaned == []
    assert reopened.total_bytes == store.total_bytes
    assert [event.event_id for event in EvidenceStore(tmp_path, max_events=1).list()] == ids[-1:]


def test_the_byte_bound_deletes_the_oldest(tmp_path):
    store = EvidenceStore(tmp_path, max_bytes=120_000, mp4=False)
    ids = write_events(store, 6)  # about 50 KB each (a 30 KB clip, the snapshot drawn and plain): two fit
    assert [event.event_id for event in store.list()] == ids[:3:-1]
    assert store.total_bytes <= 120_000
    assert store.total_bytes == sum(p.stat().st_size for p in tmp_path.rglob("*") if p.is_file())
    lone = EvidenceStore(tmp_path / "small", max_bytes=1000)  # the newest is kept even alone over
    assert [event.event_id for event in lone.list()] == []
    assert len(write_events(lone, 2)) == 2 and len(lone) == 1


def test_a_partial_or_corrupt_folder_is_ignored_and_removed_at_start(tmp_path):
    store = EvidenceStore(tmp_path)
    [whole] = write_events(store, 1)
    partial = tmp_path / new_event_id(5)  # a crash before event.json
    partial.mkdir()
    (partial / SNAPSHOT_NAME).write_bytes(b"\xff\xd8\xff\xd9")
    corrupt = tmp_path / new_event_id(6)
    corrupt.mkdir()
    (corrupt / META_NAME).write_text('{"event_id": "trunc')
    mismatched = tmp_path / new_event_id(7)  # event.json whole, the clip cut short behind its back
    mismatched.mkdir()
    meta = json.loads((tmp_path / whole / META_NAME).read_text()) | {"event_id": mismatched.name}
    (mismatched / META_NAME).write_text(json.dumps(meta))
    (mismatched / SNAPSHOT_NAME).write_bytes((tmp_path / whole / SNAPSHOT_NAME).read_bytes())
    (mismatched / CLIP_NAME).write_bytes(b"\xff\xd8")
    (tmp_path / ".clip.123-4.tmp.mjpeg").write_bytes(b"half")
    (tmp_path / "README").write_text("not ours")  # not an event: left alone

    reopened = EvidenceStore(tmp_path)
    assert [event.event_id for event in reopened.list()] == [whole]
    assert sorted(reopened.cleaned) == sorted([partial.name, corrupt.name, mismatched.name, ".clip.123-4.tmp.mjpeg"])
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([whole, "README"])


@pytest.mark.parametrize("hostile", ["../x", "..", ".", "a/b", "/etc/passwd", ".hidden", "", "x\x00y",
                                     "..\\x", "a" * 200, 5])
def test_a_hostile_event_id_never_escapes_the_root(tmp_path, hostile):
    store = EvidenceStore(tmp_path / "evidence")
    with pytest.raises(ValueError):
        store.get(hostile)
    with pytest.raises(ValueError):
        store.write(hostile, {}, jpeg_of(10, 0), [jpeg_of(10, 0)])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["evidence"] and store.list() == []
    assert store.get(new_event_id(1)) is None  # a well-formed id that is not stored

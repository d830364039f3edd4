"""Motion gating on generated clips with known ground truth, built from the shared photos.

The background is ``cat_720p.jpg`` at 640x360 with camera-like noise: Gaussian sensor noise and a
JPEG re-encoding per frame. Objects cut from other photos (a parrot, a face) move across it in
known segments. A frame "moved" when its noiseless rendering differs from the previous frame's;
that is the ground truth every assertion compares against.
"""

from __future__ import annotations

from itertools import cycle, pairwise

import cv2
import numpy as np
import pytest
from support.assets import MOBILENET_V2
from support.pipeline import FACE_IDS, FACES, IMAGENET_LABELS, IMAGES, allocations_per_frame

import edgeinfer
from edgeinfer.errors import InputMismatch
from edgeinfer.pipeline.motion import MotionGate, downscaled_size, row_step

WIDTH, HEIGHT = 640, 360
#: no forced frames: what the detector itself decides
NO_LIMIT = 10_000


def _background() -> np.ndarray:
    return cv2.resize(cv2.imread(str(IMAGES / "cat_720p.jpg")), (WIDTH, HEIGHT), interpolation=cv2.INTER_AREA)


def _objects() -> list[np.ndarray]:
    parrot = cv2.resize(cv2.imread(str(IMAGES / "parrot.jpg")), (150, 272), interpolation=cv2.INTER_AREA)
    face = cv2.resize(cv2.imread(str(IMAGES / "face.jpg"))[60:300, 140:380], (48, 48), interpolation=cv2.INTER_AREA)
    return [parrot, face]


def _paste(image: np.ndarray, obj: np.ndarray, x: int, y: int) -> None:
    h, w = obj.shape[:2]
    x0, y0, x1, y1 = max(x, 0), max(y, 0), min(x + w, image.shape[1]), min(y + h, image.shape[0])
    if x1 > x0 and y1 > y0:
        image[y0:y1, x0:x1] = obj[y0 - y:y1 - y, x0 - x:x1 - x]


def _scenes() -> list[tuple[tuple[int, int, int], ...]]:
    """Per frame, the objects placed (object, x, y): static stretches and four moving segments."""
    parrot_in = np.linspace(-150, 245, 24).round().astype(int)      # walks in from the left, stops
    parrot_out = np.linspace(245, WIDTH, 17).round().astype(int)[1:]  # walks out to the right
    face = np.arange(100, 100 + 8 * 16, 8)                            # small (48 px), slow (8 px/frame)
    scenes: list[tuple[tuple[int, int, int], ...]] = [()] * 60
    scenes += [((0, int(x), 40),) for x in parrot_in]
    scenes += [((0, 245, 40),)] * 60                                   # parked
    scenes += [((0, int(x), 40),) for x in parrot_out]
    scenes += [()] * 40
    scenes += [((1, int(x), 250),) for x in face]
    scenes += [((1, int(face[-1]), 250),)] * 30
    return scenes


def _noisy(clean: np.ndarray, rng: np.random.Generator, noise: np.ndarray, quality: int) -> np.ndarray:
    """``clean`` + a window of a Gaussian noise field at a random offset, JPEG-encoded and decoded."""
    dy, dx = rng.integers(0, 32, 2)
    field = noise[rng.integers(len(noise))][dy:dy + clean.shape[0], dx:dx + clean.shape[1]]
    frame = cv2.add(clean, field, dtype=cv2.CV_8U)
    ok, data = cv2.imencode(".jpg", frame, [cv2.IMWRITE_JPEG_QUALITY, quality])
    assert ok
    return cv2.imdecode(data, cv2.IMREAD_COLOR)


def _noise_fields(rng: np.random.Generator, sigma: float) -> np.ndarray:
    shape = (4, HEIGHT + 32, WIDTH + 32, 3)
    return (rng.standard_normal(shape, dtype=np.float32) * sigma).round().astype(np.int16)


def _render(scenes, *, sigma: float = 4.0, quality: int = 85, gains=None, seed: int = 17):
    """(noisy frames, moved flags): moved[i] when the noiseless frame i differs from frame i - 1."""
    rng = np.random.default_rng(seed)
    noise = _noise_fields(rng, sigma)
    background, objects = _background(), _objects()
    frames, moved, previous = [], [], None
    for index, scene in enumerate(scenes):
        clean = background.copy()
        for obj, x, y in scene:
            _paste(clean, objects[obj], x, y)
        if gains is not None:
            clean = cv2.convertScaleAbs(clean, alpha=float(gains[index]))
        moved.append(previous is not None and not np.array_equal(clean, previous))
        previous = clean
        frames.append(_noisy(clean, rng, noise, quality))
    return frames, moved


def _expected(moved: list[bool], max_skip: int) -> list[int]:
    """The frames a correct gate lets through: the first, every moved frame, and one after each
    ``max_skip`` consecutive skipped frames."""
    passed, run = [], 0
    for index, flag in enumerate(moved):
        if index == 0 or flag or run >= max_skip:
            passed.append(index)
            run = 0
        else:
            run += 1
    return passed


def _gate(frames, gate: MotionGate) -> list[int]:
    return [index for index, frame in enumerate(frames) if gate.changed(frame)]


@pytest.fixture(scope="module")
def clip():
    frames, moved = _render(_scenes())
    # the parrot walks in (24 positions, the first fully outside), out (16), the face appears and moves (16)
    assert sum(moved) == 23 + 16 + 16
    return frames, moved


def test_static_frames_skip_and_every_moving_frame_goes_through(clip):
    frames, moved = clip
    gate = MotionGate(max_skip=NO_LIMIT)
    passed = _gate(frames, gate)
    moving = [i for i, flag in enumerate(moved) if flag]
    # exact: the first frame (no reference yet) and every frame whose scene changed — the small,
    # slow face included — and nothing else: noise never passes, the parked parrot never passes
    assert passed == [0, *moving]
    assert gate.frames == len(frames)
    assert gate.skipped == len(frames) - len(passed)
    assert gate.skipped_fraction == pytest.approx(1 - len(passed) / len(frames))
    assert gate.forced == 0


@pytest.mark.parametrize("max_skip", [30, 9, 1])
def test_max_skip_forces_a_frame_through(clip, max_skip):
    frames, moved = clip
    gate = MotionGate(max_skip=max_skip)
    passed = _gate(frames, gate)
    assert passed == _expected(moved, max_skip)
    assert gate.forced == len(passed) - 1 - sum(moved)


def test_max_skip_zero_never_skips(clip):
    frames, _ = clip
    gate = MotionGate(max_skip=0)
    assert _gate(frames[:20], gate) == list(range(20))
    assert gate.skipped_fraction == 0.0


def test_results_on_moving_frames_are_unchanged(clip):
    """The classifier on what the gate lets through, each skipped frame given the previous result:
    the same top-1 as the classifier on every frame, on every frame of the clip."""
    frames, moved = clip
    gate = MotionGate()
    with edgeinfer.load(MOBILENET_V2) as engine:
        classifier = edgeinfer.ImageClassifier(engine, top_k=1)
        every = [classifier.classify_array(frame)[0].index for frame in frames]
        delivered, reused, last = [], [], None
        for frame in frames:
            if gate.changed(frame):
                last = classifier.classify_array(frame)[0].index
                reused.append(False)
            else:
                reused.append(True)
            delivered.append(last)
    assert len(set(every)) > 1, "the moving parrot must change the answer, or this test shows nothing"
    assert not any(r and m for r, m in zip(reused, moved, strict=True)), "a moving frame was skipped"
    ran = [i for i, r in enumerate(reused) if not r]
    assert [delivered[i] for i in ran] == [every[i] for i in ran]  # frames the gate let through
    assert delivered == every  # and the reused results on the skipped ones
    assert sum(reused) / len(frames) == pytest.approx(gate.skipped_fraction)
    assert gate.skipped_fraction > 0.6


def test_noise_below_the_threshold_is_ignored():
    """Heavy sensor noise (sigma 24) and coarse JPEG (quality 30) on a static scene: the 8x8 block
    means of the downscaled copy keep it under the default threshold; a threshold of 3 does not."""
    frames, moved = _render([()] * 60, sigma=24.0, quality=30)
    assert not any(moved)
    assert _gate(frames, MotionGate(max_skip=NO_LIMIT)) == [0]
    sensitive = MotionGate(threshold=3, min_area=0.0, max_skip=NO_LIMIT)
    assert len(_gate(frames, sensitive)) > 30  # the same noise, a threshold below it


def test_a_slow_brightness_ramp_is_not_motion():
    """The scene dims by 30 % over 90 frames (dusk, auto exposure). With gain compensation the
    gate sees no change; without it the drift accumulates against the reference and goes through
    now and then — never frame after frame, since each pass takes a new reference."""
    gains = np.linspace(1.0, 0.7, 90)
    frames, _ = _render([()] * 90, gains=gains)
    assert _gate(frames, MotionGate(max_skip=NO_LIMIT)) == [0]
    plain = _gate(frames, MotionGate(max_skip=NO_LIMIT, gain=False))
    assert 2 <= len(plain) <= 15, plain
    assert all(b - a > 1 for a, b in pairwise(plain)), plain


def test_a_new_frame_size_and_reset_start_over(clip):
    frames, _ = clip
    gate = MotionGate(max_skip=NO_LIMIT)
    small = [cv2.resize(f, (320, 180), interpolation=cv2.INTER_AREA) for f in frames[:3]]
    assert [gate.changed(f) for f in frames[:3]] == [True, False, False]
    assert gate.size == (80, 45)
    assert [gate.changed(f) for f in small] == [True, False, False]  # reduced-size frames: a new reference
    assert gate.size == (80, 45)
    assert gate.changed(frames[3]) is True  # back to full size
    gate.reset()
    assert [gate.changed(f) for f in frames[4:6]] == [True, False]
    assert (gate.frames, gate.skipped) == (9, 5)
    gate.reset(counters=True)
    assert (gate.frames, gate.skipped, gate.forced, gate.skipped_fraction) == (0, 0, 0, 0.0)
    assert gate.changed(frames[6]) is True


def test_gray_frames_and_bad_frames(clip):
    frames, _ = clip
    gate = MotionGate(max_skip=NO_LIMIT)
    gray = [cv2.cvtColor(f, cv2.COLOR_BGR2GRAY) for f in frames[:3]]
    assert [gate.changed(g) for g in gray] == [True, False, False]
    with pytest.raises(InputMismatch, match="uint8"):
        gate.changed(gray[0].astype(np.float32))
    with pytest.raises(InputMismatch, match="uint8"):
        gate.changed(frames[0].astype(np.uint16))
    with pytest.raises(InputMismatch, match="BGR"):
        gate.changed(np.zeros((HEIGHT, WIDTH, 4), np.uint8))


def test_no_allocation_per_frame(clip):
    frames, _ = clip
    gate = MotionGate(max_skip=9)
    for frame in frames[:20]:
        gate.changed(frame)
    per_frame, growth = allocations_per_frame((gate.changed(f) for f in cycle(frames[50:100])), frames=200)
    # a few Python floats and ints (cv2.mean's tuple, the count); a 80x45 buffer alone is 3.6 kB
    assert per_frame < 512, f"{per_frame:.0f} B per frame"
    assert growth < 4096


def test_downscaled_size_takes_exact_divisors():
    assert downscaled_size(1280, 720, 96) == (80, 45)
    assert downscaled_size(1920, 1080, 96) == (96, 54)
    assert downscaled_size(640, 480, 96) == (80, 60)
    assert downscaled_size(64, 48, 96) == (64, 48)  # narrower than the target: as it is
    w, h = downscaled_size(1021, 769, 96)  # primes: a fractional block mean, the aspect kept
    assert w == 96 and h == round(769 * 96 / 1021)
    # rows read: about four per block of an exact block mean, all of them otherwise
    assert row_step(720, 45) == 4  # blocks of 16 rows
    assert row_step(1080, 54) == 5  # 20
    assert row_step(360, 45) == 2  # 8
    assert row_step(240, 60) == 1  # 4
    assert row_step(769, 72) == 1  # fractional


@pytest.mark.parametrize(("options", "message"), [
    ({"threshold": 0}, "threshold"),
    ({"threshold": 255}, "threshold"),
    ({"threshold": "20"}, "threshold"),
    ({"min_area": -0.1}, "min_area"),
    ({"min_area": 1.5}, "min_area"),
    ({"max_skip": -1}, "max_skip"),
    ({"max_skip": 2.5}, "max_skip"),
    ({"max_skip": True}, "max_skip"),
    ({"width": 4}, "width"),
    ({"width": 96.0}, "width"),
])
def test_invalid_settings(options, message):
    with pytest.raises(ValueError, match=message):
        MotionGate(**options)


@pytest.mark.parametrize("face", FACES, ids=FACE_IDS)
def test_the_pipeline_reuses_results_on_unchanged_frames_and_runs_every_moving_one(clip, tmp_path, face):
    """Motion gating inside a real run, on both faces (MobileNet v2 on the clip, as a folder of lossless frames;
    several streams of it for a MultiPipeline): the frames inferred are exactly the ones a correct gate lets
    through, per stream; the others carry the last inferred frame's result, marked reused; inferred frames
    answer as they do without the gate."""
    frames, moved = clip
    folder = tmp_path / "frames"
    folder.mkdir()
    for index, frame in enumerate(frames):
        cv2.imwrite(str(folder / f"{index:04d}.bmp"), frame)
    options = {"labels": IMAGENET_LABELS, "top_k": 1, "threads": 2, "policy": "every"}
    with face.build(MOBILENET_V2, folder, motion_gate=True, **options) as gated:
        streams = face.collect(gated)
        assert gated.wait(120), "the run did not end"
        stats = face.stats(gated)
    with edgeinfer.Pipeline(MOBILENET_V2, folder, **options) as plain:
        reference = [r.result[0].label for r in plain]
    for name, results in streams.items():
        _check_gated(results, stats[name], frames, moved, reference)


def _check_gated(results: list, stats, frames: list, moved: list[bool], reference: list[str]) -> None:
    assert [r.frame_id for r in results] == list(range(len(frames)))
    inferred = [r.frame_id for r in results if not r.reused]
    assert inferred == _expected(moved, max_skip=30)
    assert stats.reused == len(frames) - len(inferred) and stats.frames == len(inferred)
    last = None
    for result in results:
        if result.reused:
            assert result.result[0].label == last and result.timings.infer == 0.0
        else:
            assert result.result[0].label == reference[result.frame_id]
            last = result.result[0].label

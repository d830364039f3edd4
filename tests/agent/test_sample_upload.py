"""Capture samples from the device's disk to a real fleet manager (its Mosquitto, a real PostgreSQL, HTTP on a real
socket) with the device's own credential: what an earlier run left is sent once the manager answers (retried with
backoff while it does not), a sample the manager refuses is marked, reported once and not tried again, one whose
``sample.json`` is torn is refused the same way; the perceptual hash the device computes keeps a static scene once."""

from __future__ import annotations

import json
import time

import cv2
import numpy as np
from support.assets import ASSETS

from edgeinfer._backoff import Backoff
from edgeinfer._samples import DUPLICATE_BITS, PHASH, SAMPLE_META_NAME, hamming
from edgeinfer.agent.uploads import REFUSED_MARK, SAMPLES, UPLOADED_MARK, DeviceUploader
from edgeinfer.fleet.broker import free_port
from edgeinfer.fleet.client import FleetClient
from edgeinfer.fleet.manager import FleetManager, FleetSettings
from edgeinfer.pipeline.postprocess import Detection, Detections
from edgeinfer.pipeline.sampling import CaptureRule, SampleStore, StreamSampler, perceptual_hash

W, H = 320, 240


def scene(seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return cv2.resize(rng.integers(0, 256, (6, 8, 3), dtype=np.uint8), (W, H), interpolation=cv2.INTER_NEAREST)


def keep(folder, frames: list[np.ndarray]) -> list:
    """Samples of ``frames`` kept by a real sampler (rule random:1), each with one box scored 0.4."""
    sampler = StreamSampler((CaptureRule.parse("random:1"),), SampleStore(folder, 10 << 20), per_minute=1000)
    sampler.pipeline, sampler.model_version = "door", "3"
    result = Detections((Detection((10.0, 20.0, 110.0, 400.0), 0.4, 0, "person"),))  # reaches past the frame
    for n, frame in enumerate(frames):
        assert sampler.check(result, frame, n, n / 10) == "random:1"
        time.sleep(0.01)  # one sample a frame: the store's queue holds four
    sampler.close()
    assert sampler.counts()["written"] == len(frames)
    return sampler.store.list()


def drain(uploader: DeviceUploader, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while uploader.pending and time.monotonic() < deadline:
        time.sleep(0.05)


def test_the_perceptual_hash_keeps_a_scene_through_jpeg_noise_and_light_and_tells_scenes_apart():
    photos = [cv2.imread(str(ASSETS / "images" / name)) for name in ("kite_and_cold.jpg", "parrot.jpg", "pets.jpg",
                                                                      "face.jpg", "grace_hopper.bmp")]
    frame = photos[0]
    jpeg = cv2.imdecode(cv2.imencode(".jpg", frame, [cv2.IMWRITE_JPEG_QUALITY, 60])[1], cv2.IMREAD_COLOR)
    noisy = np.clip(frame.astype(np.int16) + np.random.default_rng(0).integers(-8, 9, frame.shape), 0, 255)
    brighter = cv2.convertScaleAbs(frame, alpha=1.0, beta=10)
    same = [perceptual_hash(f) for f in (frame, jpeg, noisy.astype(np.uint8), brighter)]
    others = [perceptual_hash(f) for f in photos[1:]]
    assert all(PHASH.match(h) for h in same + others)
    assert max(hamming(same[0], h) for h in same[1:]) <= DUPLICATE_BITS
    assert min(hamming(same[0], h) for h in others) > 3 * DUPLICATE_BITS


def test_samples_left_by_an_earlier_run_reach_the_manager_once_it_answers_and_refusals_are_reported_once(tmp_path):
    root = tmp_path / "samples" / "door"
    folders = keep(root, [scene(1), scene(2), scene(1), scene(3), scene(4)])
    ok, static, dup, bad_hash, torn = folders
    meta = json.loads((bad_hash / SAMPLE_META_NAME).read_text())
    (bad_hash / SAMPLE_META_NAME).write_text(json.dumps({**meta, "phash": "not-a-hash"}))
    (torn / SAMPLE_META_NAME).write_text('{"phash": "0123')  # a disk that lost the end of it
    (static / UPLOADED_MARK).write_text("{}")  # sent by the earlier run: not sent again
    port = free_port()
    emitted: list[tuple] = []
    settings = FleetSettings(broker=None, broker_port=free_port(), http=f"127.0.0.1:{port}",
                             data_dir=tmp_path / "fleet")
    with FleetManager(settings) as manager:
        admin = FleetClient(manager.http.url, token=manager.admin_token)
        [device] = admin.enroll_many(["cam-9"], "f")
    # the manager is down: the uploader keeps what it has and retries
    uploader = DeviceUploader(f"http://127.0.0.1:{port}", "cam-9", credentials=(device["username"],
                              device["password"]), emit=lambda *a, **k: emitted.append((a, k)),
                              backoff=Backoff(initial_s=0.1, max_s=0.5))
    assert uploader.scan([("door", tmp_path / "samples" / "door")], SAMPLES) == 4
    uploader.start()
    try:
        deadline = time.monotonic() + 10
        while uploader.retries < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert uploader.retries >= 2 and uploader.sent == 0 and uploader.pending == 4
        with FleetManager(settings) as manager:  # back, on the same address and database
            drain(uploader)
            stored = FleetClient(manager.http.url, token=manager.admin_token).samples(device="cam-9")
    finally:
        uploader.close()
    assert {s["sample_id"] for s in stored} == {ok.name}  # scene 1 again: a duplicate, answered but not stored
    [sample] = stored
    assert (sample["pipeline"], sample["rule"], sample["model_version"], sample["width"]) == ("door", "random:1",
                                                                                             "3", W)
    assert sample["detections"] == [{"label": "person", "score": 0.4, "box": [10.0, 20.0, 110.0, float(H)]}]
    assert all((f / UPLOADED_MARK).exists() for f in (ok, static, dup))
    assert all((f / REFUSED_MARK).exists() and not (f / UPLOADED_MARK).exists() for f in (bad_hash, torn))
    assert uploader.sent == 2 and uploader.refused == 2
    assert sorted(k["data"]["sample_id"] for a, k in emitted) == sorted([bad_hash.name, torn.name])
    assert {a[0] for a, _ in emitted} == {"sample_upload_failed"}
    assert DeviceUploader("http://127.0.0.1:1", "cam-9", credentials=None).scan([("door", root)], SAMPLES) == 0
    assert len(SampleStore(root, 10 << 20)) == 4  # the marks do not upset the store; the torn one is partial: gone

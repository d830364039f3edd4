"""Capture samples from the device's disk to a real fleet manager (its Mosquitto, a real PostgreSQL, HTTP on a real
socket) with the device's own credential: what an earlier run left is sent once the manager answers (retried with
backoff while it does not), a sample the manager refuses is marked, reported once and not tried again, one whose
``sample.json`` is torn is refused the same way; the perceptual hash the device computes keeps a static scene once."""

from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
import time
import zipfile

import cv2
import numpy as np
import pytest
from pycocotools.coco import COCO
from support.assets import ASSETS, IMAGES, MODELS
from support.ports import free_port
from support.processes import edgeinfer_cmd

from edgeinfer import Pipeline
from edgeinfer.agent.uploads import REFUSED_MARK, SAMPLES, UPLOADED_MARK, DeviceUploader
from edgeinfer.errors import FleetRequestError
from edgeinfer.fleet.client import FleetClient
from edgeinfer.fleet.manager import FleetManager, FleetSettings
from edgeinfer.forms.samples import (
    COCO_FLIP,
    COCO_KEYPOINT_NAMES,
    COCO_SKELETON,
    DUPLICATE_BITS,
    KEYPOINT_VISIBLE,
    PHASH,
    SAMPLE_META_NAME,
    hamming,
)
from edgeinfer.pipeline.postprocess import Detection, Detections
from edgeinfer.pipeline.sampling import SampleStore, SamplingRule, StreamSampler, perceptual_hash
from edgeinfer.util.backoff import Backoff

W, H = 320, 240
YOLO_POSE = MODELS / "yolo11n-pose.onnx"


def scene(seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return cv2.resize(rng.integers(0, 256, (6, 8, 3), dtype=np.uint8), (W, H), interpolation=cv2.INTER_NEAREST)


def keep(folder, frames: list[np.ndarray]) -> list:
    """Samples of ``frames`` kept by a real sampler (rule random:1), each with one box scored 0.4."""
    sampler = StreamSampler((SamplingRule.parse("random:1"),), SampleStore(folder, 10 << 20), per_minute=1000)
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


def test_a_pose_samples_keypoints_go_from_the_device_to_the_exports_and_corrected_ones_come_back(tmp_path):
    """YOLO11n-pose keeps two real photos with people; each detection's keypoints ([x, y, confidence] in the
    frame's pixels) travel in sample.json, the upload, the manager's row and its API; the COCO export opens in
    pycocotools with COCO keypoints (the category's names and 19 limbs, a seen keypoint flagged 2, an unsure one
    0); the YOLO export is an Ultralytics pose dataset (kpt_shape, flip_idx, 5 + 17 x 3 values a line); a
    labeller's corrected keypoints come back through both imports, and a malformed one changes nothing."""
    photos = tmp_path / "photos"
    photos.mkdir()
    for name in ("squat.bmp", "grace_hopper.bmp"):
        (photos / name).symlink_to(IMAGES / name)
    root = tmp_path / "samples" / "gym"
    with Pipeline(YOLO_POSE, str(photos), sample=["random:1"], samples_dir=root, samples_per_minute=100) as run:
        results = {r.frame_id: r.result for r in run}
    folders = SampleStore(root, 10 << 20).list()
    assert len(folders) == 2
    metas = [json.loads((f / SAMPLE_META_NAME).read_text()) for f in folders]
    for meta in metas:  # what the device wrote: every person's 17 keypoints, as the model found them
        found = results[meta["frame_id"]]
        assert [len(d["keypoints"]) for d in meta["detections"]] == [17] * len(found)
        for written, detection in zip(meta["detections"], found):
            assert np.allclose(written["keypoints"], [[k.x, k.y, k.score] for k in detection.keypoints], atol=0.06)
    squat = next(m for m in metas if m["width"] == cv2.imread(str(IMAGES / "squat.bmp")).shape[1]
                 and len(m["detections"]) == 1 and m["detections"][0]["keypoints"][3][2] < 0.5)
    with FleetManager(FleetSettings(broker=None, broker_port=free_port(), http="127.0.0.1:0",
                                    data_dir=tmp_path / "fleet")) as manager:
        admin = FleetClient(manager.http.url, token=manager.admin_token)
        [device] = admin.enroll_many(["cam-gym"], "f")
        uploader = DeviceUploader(manager.http.url, "cam-gym", credentials=(device["username"], device["password"]))
        assert uploader.scan([("gym", root)], SAMPLES) == 2
        uploader.start()
        try:
            drain(uploader)
        finally:
            uploader.close()
        assert uploader.sent == 2 and uploader.refused == 0
        stored = {s["sample_id"]: s for s in admin.samples(device="cam-gym")}
        assert sorted(stored) == sorted(m["sample_id"] for m in metas)
        row = stored[squat["sample_id"]]
        assert row["detections"] == squat["detections"]  # the keypoints as the device wrote them, from the API

        # COCO: keypoints, num_keypoints, the category's names and skeleton (COCO counts from 1)
        coco_dir = tmp_path / "coco"
        admin.save_export("coco", tmp_path / "coco.zip", device="cam-gym")
        zipfile.ZipFile(tmp_path / "coco.zip").extractall(coco_dir)
        with contextlib.redirect_stdout(io.StringIO()):
            coco = COCO(str(coco_dir / "annotations.json"))
        [person] = coco.loadCats(coco.getCatIds(catNms=["person"]))
        assert person["keypoints"] == list(COCO_KEYPOINT_NAMES)
        assert person["skeleton"] == [[a + 1, b + 1] for a, b in COCO_SKELETON] and len(person["skeleton"]) == 19
        [image] = [i for i in coco.loadImgs(coco.getImgIds()) if i["file_name"].endswith(f"{row['sample_id']}.jpg")]
        [ann] = coco.loadAnns(coco.getAnnIds(imgIds=[image["id"]]))
        sent = squat["detections"][0]["keypoints"]
        flat = [value for x, y, v in sent for value in ((x, y, 2) if v >= KEYPOINT_VISIBLE else (0, 0, 0))]
        assert ann["keypoints"] == pytest.approx(flat) and ann["keypoints"][3 * 3 + 2] == 0  # the hidden left ear
        assert ann["num_keypoints"] == sum(1 for _, _, v in sent if v >= KEYPOINT_VISIBLE) >= 15

        # YOLO pose: Ultralytics' layout
        archive = zipfile.ZipFile(io.BytesIO(admin.export_samples("yolo", device="cam-gym")))
        data_yaml = archive.read("data.yaml").decode()
        assert "kpt_shape: [17, 3]\n" in data_yaml and f"flip_idx: {list(COCO_FLIP)}\n" in data_yaml
        label_name = f"labels/cam-gym/{row['sample_id']}.txt"
        [line] = archive.read(label_name).decode().splitlines()
        values = [float(v) for v in line.split()]
        assert len(values) == 5 + 17 * 3 and values[0] == 0
        width, height = squat["width"], squat["height"]
        assert values[5:8] == pytest.approx([sent[0][0] / width, sent[0][1] / height, 2], abs=1e-5)

        # a labeller moves the nose 10 px right and marks the right wrist hidden (1), in the YOLO files...
        values[5] += 10 / width
        values[5 + 10 * 3 + 2] = 1
        corrected = io.BytesIO()
        with zipfile.ZipFile(corrected, "w") as out:
            out.writestr("data.yaml", data_yaml)
            out.writestr(label_name, " ".join(["0", *(f"{v:.6f}" for v in values[1:])]) + "\n")
        assert admin.import_labels("yolo", corrected.getvalue()) == {"samples": 1}
        [labelled] = admin.samples(device="cam-gym", labelled="true")
        points = labelled["labels"][0]["keypoints"]
        assert points[0][:2] == pytest.approx([sent[0][0] + 10, sent[0][1]], abs=0.01) and points[0][2] == 2
        assert points[10][2] == 1 and points[3] == [0, 0, 0]
        assert labelled["detections"] == squat["detections"]  # what the model said stays

        # ... and in COCO: the left ear placed and seen, the left wrist hidden; a keypoint list of the wrong length
        # changes nothing
        document = json.loads((coco_dir / "annotations.json").read_text())
        [mine] = [a for a in document["annotations"] if a["id"] == ann["id"]]
        mine["keypoints"][9:12] = [300.0, 195.0, 2]
        mine["keypoints"][9 * 3 + 2] = 1
        assert admin.import_labels("coco", json.dumps(document).encode()) == {"samples": 2}
        labels = {s["sample_id"]: s["labels"] for s in admin.samples(device="cam-gym")}
        assert labels[row["sample_id"]][0]["keypoints"][3] == [300.0, 195.0, 2]
        imported, mine["keypoints"] = mine["keypoints"], mine["keypoints"][:-3]
        with pytest.raises(FleetRequestError, match="keypoints is a flat list of x, y, v"):
            admin.import_labels("coco", json.dumps(document).encode())
        assert {s["sample_id"]: s["labels"] for s in admin.samples(device="cam-gym")} == labels

        # the export of a person's labels keeps their flags: the hidden left wrist stays 1
        again = json.loads(zipfile.ZipFile(io.BytesIO(admin.export_samples("coco", device="cam-gym")))
                           .read("annotations.json"))
        [exported] = [a for a in again["annotations"] if a["image_id"] == image["id"]]
        assert exported["keypoints"] == imported and exported["keypoints"][9 * 3 + 2] == 1

        # the fleet's labelled samples score the pose model on its keypoints (OKS) as well as its boxes
        scored = subprocess.run(edgeinfer_cmd("evaluate", str(YOLO_POSE), "--fleet", "--json", "-q",
                                              "--fleet-url", manager.http.url), capture_output=True, text=True,
                                env={**os.environ, "EDGEINFER_FLEET_TOKEN": manager.admin_token}, timeout=240)
        assert scored.returncode == 0, scored.stderr
        scores = json.loads(scored.stdout)
        assert scores["map50_95"] > 0.9 and scores["keypoints"]["instances"] == 2, scores
        assert scores["keypoints_map50_95"] > 0.8 and scores["keypoints"]["sigmas"] == "coco", scores["keypoints"]

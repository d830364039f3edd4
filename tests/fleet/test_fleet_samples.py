"""Samples at a real fleet manager (its managed Mosquitto, a real PostgreSQL, HTTP on a real socket)
and real JPEGs: devices upload samples with their own credential, idempotent by id, a static scene's near-identical
frame kept once, the quota; listing, review, delete; the COCO export opens in pycocotools with the right boxes and
categories, YOLO labels normalised, Label Studio tasks with predictions; corrected labels imported back; hostile
requests refused with nothing stored lost."""

from __future__ import annotations

import base64
import io
import json
import os
import subprocess
import zipfile
from typing import Any

import cv2
import numpy as np
import pytest
from pycocotools.coco import COCO
from support.live_view import basic, request
from support.processes import edgeinfer_cmd

from edgeinfer.fleet.client import FleetClient
from edgeinfer.fleet.manager import FleetManager, FleetSettings
from edgeinfer.pipeline.sampling import perceptual_hash  # the device's own hash

FLEET = "data"
W, H = 320, 240


def scene(seed: int) -> np.ndarray:
    """A frame of its own scene: blocks of the seed's colours (a different seed hashes far apart)."""
    rng = np.random.default_rng(seed)
    blocks = rng.integers(0, 256, (6, 8, 3), dtype=np.uint8)
    return cv2.resize(blocks, (W, H), interpolation=cv2.INTER_NEAREST)


def encode(image: np.ndarray) -> bytes:
    ok, data = cv2.imencode(".jpg", image, [cv2.IMWRITE_JPEG_QUALITY, 90])
    assert ok
    return data.tobytes()


def sample(seed: int, *, detections: list[dict] | None = None, image: np.ndarray | None = None,
           **extra: Any) -> dict:
    image = scene(seed) if image is None else image
    body = {"jpeg": base64.b64encode(encode(image)).decode(), "phash": perceptual_hash(image), "width": W, "height": H,
            "captured_at": 1795652031.0 + seed, "pipeline": "door", "stream": "", "rule": "detection:0.5",
            "model": {"name": "yolov8n", "sha256": "ab" * 32, "version": "3"},
            "detections": detections if detections is not None else [
                {"label": "person", "score": 0.91, "box": [10.0, 20.0, 110.0, 220.0]},
                {"label": "car", "score": 0.62, "box": [150.0, 100.0, 310.0, 200.0]}]}
    return {**body, **extra}


class Fleet:
    def __init__(self, manager: FleetManager, devices: dict[str, tuple[str, str]], tokens: dict[str, str]) -> None:
        self.manager, self.devices, self.tokens = manager, devices, tokens
        self.url = manager.http.url

    def put(self, device: str, sample_id: str, body: Any, *, as_: str | None = None) -> tuple[int, dict]:
        who = as_ or device
        auth = basic(*self.devices[who]) if who in self.devices else f"Bearer {self.tokens[who]}"
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        status, _, answer = request(self.url, "PUT", f"/api/devices/{device}/samples/{sample_id}", body=data,
                                    auth=auth, headers={"Content-Type": "application/json"})
        return status, json.loads(answer)

    def call(self, method: str, path: str, role: str = "viewer", body: bytes | None = None,
             content_type: str = "application/json") -> tuple[int, bytes]:
        status, _, answer = request(self.url, method, path, body=body, auth=f"Bearer {self.tokens[role]}",
                                    headers={"Content-Type": content_type} if body is not None else None)
        return status, answer

    def list(self, query: str = "") -> list[dict]:
        status, body = self.call("GET", f"/api/samples?{query}")
        assert status == 200, body
        return json.loads(body)


@pytest.fixture(scope="module")
def fleet(postgres, tmp_path_factory):
    from support.ports import free_port

    settings = FleetSettings(broker=None, broker_port=free_port(), http="127.0.0.1:0",
                             db_url=postgres.create_database(), data_dir=tmp_path_factory.mktemp("samples") / "fleet")
    with FleetManager(settings) as manager:
        assert manager.wait_connected(10)
        admin = FleetClient(manager.http.url, token=manager.admin_token)
        issued = admin.enroll_many(["cam-a", "cam-b"], FLEET)
        tokens = {role: admin.create_token(f"samples-{role}", role)["token"] for role in ("viewer", "operator")}
        yield Fleet(manager, {e["device_id"]: (e["username"], e["password"]) for e in issued}, tokens)


@pytest.fixture(autouse=True)
def empty(fleet):
    with fleet.manager.db.engine.begin() as conn:
        conn.execute(fleet.manager.db.t.samples.delete())


def test_upload_is_idempotent_and_a_static_scene_is_kept_once(fleet):
    body = sample(1)
    status, answer = fleet.put("cam-a", "s1", body)
    assert status == 201, answer
    assert fleet.put("cam-a", "s1", body) == (200, answer)  # a retry after a lost answer
    status, answer = fleet.put("cam-a", "s1", sample(2))
    assert status == 409 and "another frame" in answer["error"]
    # the same scene a moment later: noise, not a new picture -> not stored again
    still = np.clip(scene(1).astype(int) + np.random.default_rng(5).integers(-3, 4, (H, W, 3)), 0, 255)
    status, answer = fleet.put("cam-a", "s2", sample(1, image=still.astype(np.uint8)))
    assert (status, answer["duplicate_of"]) == (200, "s1")
    assert fleet.put("cam-a", "s3", sample(3))[0] == 201  # another scene is
    # another camera's scene is its own; a box reaching past the frame's edge (as a detector's may) is cut to it
    spilling = [{"label": "person", "score": 0.5, "box": [300.0, 200.0, W + 40.0, H + 9.0]}]
    assert fleet.put("cam-b", "s4", sample(1, detections=spilling))[0] == 201
    assert sorted(s["sample_id"] for s in fleet.list()) == ["s1", "s3", "s4"]
    assert fleet.list("device=cam-b")[0]["detections"][0]["box"] == [300.0, 200.0, W, H]
    status, frame = fleet.call("GET", "/api/devices/cam-a/samples/s1/frame.jpg")
    assert status == 200 and frame == base64.b64decode(body["jpeg"])


def test_who_may_upload_and_hostile_bodies(fleet):
    assert fleet.put("cam-a", "x1", sample(1), as_="cam-b")[0] == 403
    assert fleet.put("cam-a", "x1", sample(1), as_="viewer")[0] == 403
    status, _, _ = request(fleet.url, "PUT", "/api/devices/cam-a/samples/x1", body=json.dumps(sample(1)).encode(),
                           auth=basic(fleet.devices["cam-a"][0], "wrong"))
    assert status == 401
    hostile = [b"{", b"[]", json.dumps({**sample(1), "jpeg": "not base64!"}).encode(),
               json.dumps({**sample(1), "jpeg": base64.b64encode(b"GIF89a....").decode()}).encode(),
               json.dumps({**sample(1), "phash": "xyz"}).encode(),
               json.dumps({**sample(1), "width": 0}).encode(),
               json.dumps(sample(1, detections=[{"label": "p", "box": [5, 5, -1, 1]}])).encode(),
               json.dumps(sample(1, detections=[{"label": "p", "box": [0, 0, 1]}])).encode(),
               json.dumps(sample(1, detections=[{"label": "p", "score": 2, "box": [0, 0, 1, 1]}])).encode(),
               json.dumps({**sample(1), "pipeline": "a\x00b"}).encode()]
    for body in hostile:
        status, answer = fleet.put("cam-a", "x1", body)
        assert status == 400 and answer["error"], (body[:80], answer)
    assert fleet.put("cam-a", "bad%21id", sample(1))[0] == 400
    status, _, _ = request(fleet.url, "PUT", "/api/devices/cam-a/samples/x1", body=b"x" * 10,
                           auth=basic(*fleet.devices["cam-a"]), headers={"Content-Length": str(1 << 40)})
    assert status == 413
    assert fleet.list() == []


def test_quota_deletes_the_oldest_unreviewed_first(fleet):
    limits = fleet.manager.samples.limits
    for index in range(4):
        assert fleet.put("cam-a", f"q{index}", sample(10 + index))[0] == 201
    assert fleet.call("PATCH", "/api/devices/cam-a/samples/q0", "operator", b'{"reviewed": true}')[0] == 200
    sizes = {s["sample_id"]: s["size"] for s in fleet.list()}
    try:  # a quota that holds three of them: q1, the oldest unreviewed, goes; q0 was reviewed
        object.__setattr__(limits, "total_bytes", sum(sizes.values()) - sizes["q1"] + 1)
        assert fleet.manager.samples.prune() == 1
    finally:
        object.__setattr__(limits, "total_bytes", 4096 << 20)
    assert sorted(s["sample_id"] for s in fleet.list()) == ["q0", "q2", "q3"]
    assert fleet.manager.samples.prune(now=1e12) == 3  # retention by age: all are older than 90 days then


def test_listing_filters_review_and_delete(fleet):
    fleet.put("cam-a", "a1", sample(21))
    fleet.put("cam-a", "a2", sample(22, detections=[{"label": "dog", "score": 0.7, "box": [1, 1, 50, 50]}],
                                     model={"name": "yolov8n", "sha256": "", "version": "4"}))
    fleet.put("cam-b", "b1", sample(23, pipeline="gate", rule="line_crossed:door"))
    ids = lambda query: sorted(s["sample_id"] for s in fleet.list(query))  # noqa: E731
    assert ids("device=cam-a") == ["a1", "a2"]
    assert ids("pipeline=gate") == ["b1"]
    assert ids("model_version=4") == ["a2"]
    assert ids("rule=line_crossed:door") == ["b1"]
    assert ids("label=dog") == ["a2"] and ids("label=do") == [] and ids("label=%25") == []
    assert ids("reviewed=false") == ["a1", "a2", "b1"]
    assert fleet.call("PATCH", "/api/devices/cam-a/samples/a1", "viewer", b'{"reviewed": true}')[0] == 403
    status, body = fleet.call("PATCH", "/api/devices/cam-a/samples/a1", "operator", b'{"reviewed": true}')
    assert status == 200 and json.loads(body)["reviewed"] is True
    assert ids("reviewed=true") == ["a1"]
    assert fleet.call("DELETE", "/api/devices/cam-a/samples/a2", "viewer")[0] == 403
    assert fleet.call("DELETE", "/api/devices/cam-a/samples/a2", "operator")[0] == 204
    assert fleet.call("DELETE", "/api/devices/cam-a/samples/a2", "operator")[0] == 404
    assert ids("") == ["a1", "b1"]


def test_facets_offer_each_filters_values_and_count_the_selection(fleet):
    facets = lambda query="": json.loads(fleet.call("GET", f"/api/samples/facets?{query}")[1])  # noqa: E731
    assert facets() == {"total": 0, "devices": [], "pipelines": [], "model_versions": [], "rules": [], "labels": []}
    fleet.put("cam-a", "f1", sample(61))
    fleet.put("cam-a", "f2", sample(62, detections=[{"label": "traffic light", "score": 0.4, "box": [1, 1, 9, 9]}],
                                     model={"name": "yolov8n", "sha256": "", "version": "4"}))
    fleet.put("cam-b", "f3", sample(63, pipeline="gate", rule="", detections=[], model={"name": "", "version": ""}))
    assert facets() == {"total": 3, "devices": ["cam-a", "cam-b"], "pipelines": ["door", "gate"],
                        "model_versions": ["3", "4"], "rules": ["detection:0.5"],  # no empty value is offered
                        "labels": ["car", "person", "traffic_light"]}
    assert facets("device=cam-a")["total"] == 2 and facets("device=cam-a&label=person")["total"] == 1
    assert facets("reviewed=true&device=")["total"] == 0  # an empty filter is no filter
    assert [s["sample_id"] for s in fleet.list("label=traffic_light")] == ["f2"]  # each offered label selects
    # a person's labels replace the model's in what the label filter (and so the facets) sees
    labels = json.dumps({"labels": [{"label": "child", "box": [1, 1, 5, 5]}]}).encode()
    assert fleet.call("PATCH", "/api/devices/cam-a/samples/f1", "operator", labels)[0] == 200
    assert facets()["labels"] == ["child", "traffic_light"] and facets("label=child")["total"] == 1
    for hostile in ("device=bad%21id", "label=a%00b", "reviewed=maybe", f"rule={'x' * 200}"):
        status, body = fleet.call("GET", f"/api/samples/facets?{hostile}")
        assert status == 400 and json.loads(body)["error"], (hostile, body)
    assert request(fleet.url, "GET", "/api/samples/facets")[0] == 401


def export(fleet: Fleet, fmt: str, query: str = "") -> zipfile.ZipFile:
    status, body = fleet.call("GET", f"/api/samples/export?format={fmt}&{query}")
    assert status == 200, body
    return zipfile.ZipFile(io.BytesIO(body))


def test_coco_export_opens_in_pycocotools(fleet, tmp_path):
    fleet.put("cam-a", "c1", sample(31))
    fleet.put("cam-b", "c2", sample(32, detections=[{"label": "person", "score": 0.8, "box": [0, 0, 32, 24]}]))
    archive = export(fleet, "coco")
    archive.extractall(tmp_path)
    coco = COCO(str(tmp_path / "annotations.json"))
    assert sorted(c["name"] for c in coco.loadCats(coco.getCatIds())) == ["car", "person"]
    [image] = coco.loadImgs([i for i in coco.getImgIds() if coco.imgs[i]["file_name"] == "cam-a/c1.jpg"])
    assert (tmp_path / "images" / image["file_name"]).read_bytes()[:2] == b"\xff\xd8"
    boxes = {coco.cats[a["category_id"]]["name"]: a["bbox"] for a in coco.loadAnns(coco.getAnnIds(image["id"]))}
    assert boxes == {"person": [10.0, 20.0, 100.0, 200.0], "car": [150.0, 100.0, 160.0, 100.0]}
    assert len(coco.getAnnIds(catIds=coco.getCatIds(catNms=["person"]))) == 2


def test_yolo_and_label_studio_exports(fleet):
    fleet.put("cam-a", "y1", sample(41))
    archive = export(fleet, "yolo")
    assert "images/cam-a/y1.jpg" in archive.namelist()
    assert archive.read("data.yaml").decode().endswith('names:\n  0: "car"\n  1: "person"\n')
    lines = archive.read("labels/cam-a/y1.txt").decode().splitlines()
    assert lines == ["1 0.187500 0.500000 0.312500 0.833333", "0 0.718750 0.625000 0.500000 0.416667"]
    [task] = json.loads(export(fleet, "label-studio").read("tasks.json"))
    assert task["data"]["image"] == "images/cam-a/y1.jpg"
    [prediction] = task["predictions"]
    assert prediction["model_version"] == "3"
    first = prediction["result"][0]
    assert first["value"]["rectanglelabels"] == ["person"] and first["score"] == 0.91
    assert first["value"]["x"] == pytest.approx(100 * 10 / W) and first["value"]["height"] == pytest.approx(
        100 * 200 / H)
    assert fleet.call("GET", "/api/samples/export?format=voc")[0] == 400


def test_corrected_labels_come_back(fleet, tmp_path):
    fleet.put("cam-a", "i1", sample(51))
    fleet.put("cam-a", "i2", sample(52))
    document = json.loads(export(fleet, "coco").read("annotations.json"))
    # the labeller drops the car of i1 and makes its person a "child"
    i1 = next(i["id"] for i in document["images"] if i["file_name"] == "cam-a/i1.jpg")
    document["categories"].append({"id": 9, "name": "child"})
    document["annotations"] = [a for a in document["annotations"] if a["image_id"] != i1] + [
        {"id": 99, "image_id": i1, "category_id": 9, "bbox": [12, 22, 96, 190], "area": 1, "iscrowd": 0}]
    status, body = fleet.call("POST", "/api/samples/import?format=coco", "operator", json.dumps(document).encode())
    assert status == 200 and json.loads(body) == {"samples": 2}, body
    [stored] = fleet.list("label=child")
    assert stored["sample_id"] == "i1" and stored["reviewed"] is True
    assert stored["labels"] == [{"label": "child", "score": None, "box": [12.0, 22.0, 108.0, 212.0]}]
    assert stored["detections"][0]["label"] == "person"  # what the model said stays

    # YOLO: the zip of labels/ and data.yaml, i2 left with one box
    zipped = io.BytesIO()
    with zipfile.ZipFile(zipped, "w") as archive:
        archive.writestr("data.yaml", 'names:\n  0: "bike"\n')
        archive.writestr("labels/cam-a/i2.txt", "0 0.5 0.5 0.25 0.5\n")
    status, body = fleet.call("POST", "/api/samples/import?format=yolo", "operator", zipped.getvalue(),
                              "application/zip")
    assert status == 200, body
    [stored] = fleet.list("label=bike")
    assert stored["labels"] == [{"label": "bike", "score": None, "box": [120.0, 60.0, 200.0, 180.0]}]


def test_a_malformed_import_changes_nothing(fleet):
    fleet.put("cam-a", "m1", sample(61))
    before = fleet.list()
    good = json.loads(export(fleet, "coco").read("annotations.json"))
    def annotated(category: int, bbox: list) -> bytes:
        return json.dumps({**good, "annotations": [{"image_id": 1, "category_id": category, "bbox": bbox}]}).encode()

    hostile = [b"not json", b"[]", json.dumps({**good, "images": [{"id": 1, "file_name": "../../etc.jpg"}]}).encode(),
               annotated(77, [0, 0, 1, 1]), annotated(1, [0, 0, -1, 1]), annotated(1, [0, 0, "1", 1]),
               annotated(1, [0, 0, 1])]
    for body in hostile:
        status, answer = fleet.call("POST", "/api/samples/import?format=coco", "operator", body)
        assert status == 400 and json.loads(answer)["error"], (body[:60], answer)
    # well-formed, and not what is stored: a sample that is not there (404), a box outside its sample's frame (409)
    for body, refused in ((json.dumps({**good, "images": [{"id": 1, "file_name": "cam-a/nope.jpg"}]}).encode(), 404),
                          (annotated(1, [0, 0, 9999, 1]), 409)):
        status, answer = fleet.call("POST", "/api/samples/import?format=coco", "operator", body)
        assert status == refused and json.loads(answer)["error"], (body[:60], answer)
    for body in (b"PK not a zip", _zip({"labels/cam-a/m1.txt": "0 0.5 0.5 0.1 0.1\n"}),
                 _zip({"data.yaml": "names:\n  0: a\n", "labels/cam-a/m1.txt": "0 0.5 0.5 2 0.1\n"}),
                 _zip({"data.yaml": "names:\n  0: a\n", "labels/cam-a/m1.txt": "3 0.5 0.5 0.1 0.1\n"}),
                 _zip({"data.yaml": "names:\n  0: a\n", "labels/cam-a/m1.txt": "zero 0.5\n"})):
        status, answer = fleet.call("POST", "/api/samples/import?format=yolo", "operator", body, "application/zip")
        assert status == 400 and json.loads(answer)["error"], answer
    assert fleet.call("POST", "/api/samples/import?format=coco", "viewer", json.dumps(good).encode())[0] == 403
    assert fleet.list() == before


def _zip(files: dict[str, str]) -> bytes:
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as archive:
        for name, text in files.items():
            archive.writestr(name, text)
    return out.getvalue()


def cli(fleet: Fleet, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "EDGEINFER_FLEET_URL": fleet.url, "EDGEINFER_FLEET_TOKEN": fleet.tokens["operator"]}
    return subprocess.run(edgeinfer_cmd("fleet", "dataset", *args), capture_output=True, text=True, env=env,
                          timeout=60)


def test_the_cli_exports_a_folder_and_imports_it_back(fleet, tmp_path):
    fleet.put("cam-a", "k1", sample(71))
    fleet.put("cam-b", "k2", sample(72))
    done = cli(fleet, "export", "--format", "yolo", "--device", "cam-a", "-o", str(tmp_path / "yolo"))
    assert done.returncode == 0, done.stderr
    assert "1 sample(s) as yolo" in done.stdout
    labels = tmp_path / "yolo" / "labels" / "cam-a" / "k1.txt"
    assert (tmp_path / "yolo" / "images" / "cam-a" / "k1.jpg").is_file() and labels.is_file()
    labels.write_text("1 0.5 0.5 0.5 0.5\n")  # the labeller: one person in the middle, no car
    done = cli(fleet, "import", "--format", "yolo", str(tmp_path / "yolo"))
    assert done.returncode == 0, done.stderr
    [stored] = fleet.list("device=cam-a")
    assert stored["labels"] == [{"label": "person", "score": None, "box": [80.0, 60.0, 240.0, 180.0]}]
    done = cli(fleet, "export", "--format", "coco", "-o", str(tmp_path / "coco"))
    assert done.returncode == 0 and (tmp_path / "coco" / "annotations.json").is_file(), done.stderr
    (tmp_path / "broken.json").write_text("{not json")
    done = cli(fleet, "import", "--format", "coco", str(tmp_path / "broken.json"))
    assert done.returncode == 1 and "not a COCO detection document" in done.stderr, done.stderr
    assert fleet.list("device=cam-a")[0]["labels"] == stored["labels"]


def pose(*points: tuple[float, float, float], label: str = "person") -> dict:
    return {"label": label, "score": 0.8, "box": [10.0, 20.0, 110.0, 220.0], "keypoints": [list(p) for p in points]}


def test_keypoints_are_bounded_cut_to_the_frame_and_each_pose_models_exported_apart(fleet):
    """A detection's keypoints are [x, y, v] triples, at most 1000 (the manager says which field is wrong); one a
    model put past the frame's edge is cut to it, unseen; a person's label flags come back as set; a COCO export
    holds one keypoint count per class, a YOLO export one for all (else a 400 saying to export them apart); a
    YOLO pose file of the wrong shape is refused whole."""
    hostile = {"detections.0.keypoints.0.2: Field required": [[1.0, 2.0]],
               "keypoints.0.2: Input should be less than or equal to 2": [[1.0, 2.0, 3.0]],
               "keypoints.0.0: Input should be greater than or equal to 0": [[-1.0, 2.0, 0.5]],
               "keypoints.0.1: Input should be a valid number": [[1.0, "2", 0.5]],
               "keypoints: List should have at most 1000 items": [[1.0, 1.0, 1.0]] * 1001}
    for error, points in hostile.items():
        status, answer = fleet.put("cam-a", "k0", sample(81, detections=[pose(*points)]))
        assert status == 400 and error in answer["error"], (error, answer)
    assert fleet.list() == []
    seventeen = [(20.0 + i, 30.0 + i, 0.9) for i in range(16)] + [(W + 30.0, H + 5.0, 0.95)]  # an ankle below
    assert fleet.put("cam-a", "k1", sample(81, detections=[pose(*seventeen)]))[0] == 201
    [stored] = fleet.list()
    assert stored["detections"][0]["keypoints"][:16] == [list(p) for p in seventeen[:16]]
    assert stored["detections"][0]["keypoints"][16] == [W, H, 0.0]  # cut to the frame, not seen
    labels = {"labels": [pose((12.0, 22.0, 2), (30.0, 40.0, 1), (0, 0, 0))]}
    status, body = fleet.call("PATCH", "/api/devices/cam-a/samples/k1", "operator", json.dumps(labels).encode())
    assert status == 200 and json.loads(body)["labels"][0]["keypoints"] == [[12, 22, 2], [30, 40, 1], [0, 0, 0]]

    # a face model's six landmarks beside the pose model's people: COCO keeps each class's count, YOLO cannot
    face = pose(*[(50.0 + i, 60.0, 0.9) for i in range(6)], label="face")
    assert fleet.put("cam-b", "k2", sample(82, detections=[pose(*seventeen), face]))[0] == 201
    document = json.loads(export(fleet, "coco", "device=cam-b").read("annotations.json"))
    assert {c["name"]: len(c["keypoints"]) for c in document["categories"]} == {"face": 6, "person": 17}
    assert [c["skeleton"] for c in document["categories"] if c["name"] == "face"] == [[]]  # points, no limbs
    status, body = fleet.call("GET", "/api/samples/export?format=yolo&device=cam-b")
    assert status == 400 and "6 and 17 keypoints" in json.loads(body)["error"]
    assert fleet.put("cam-b", "k3", sample(83, detections=[pose(*seventeen[:6])]))[0] == 201
    status, body = fleet.call("GET", "/api/samples/export?format=coco&device=cam-b")
    assert status == 400 and "'person' boxes carry 6 and 17 keypoints" in json.loads(body)["error"]

    # YOLO pose files of the wrong shape: refused, nothing changes
    before = fleet.list()
    pose_yaml = 'kpt_shape: [2, 3]\nnames:\n  0: "person"\n'
    for files, error in (
            ({"data.yaml": pose_yaml, "labels/cam-a/k1.txt": "0 0.5 0.5 0.2 0.2 0.1 0.1 2\n"}, "(11 numbers)"),
            ({"data.yaml": pose_yaml, "labels/cam-a/k1.txt": "0 0.5 0.5 0.2 0.2 0.1 0.1 2 0.2 0.2 3\n"},
             "visibility is 0 (not labelled), 1 (hidden) or 2 (visible)"),
            ({"data.yaml": pose_yaml, "labels/cam-a/k1.txt": "0 0.5 0.5 0.2 0.2 1.5 0.1 2 0.2 0.2 2\n"},
             "normalised to 0..1"),
            ({"data.yaml": pose_yaml.replace("[2, 3]", "[2, 4]"), "labels/cam-a/k1.txt": "0 0.5 0.5 0.2 0.2\n"},
             "kpt_shape is [keypoints, 2 or 3]")):
        status, answer = fleet.call("POST", "/api/samples/import?format=yolo", "operator", _zip(files),
                                    "application/zip")
        assert status == 400 and error in json.loads(answer)["error"], (files, answer)
    assert fleet.list() == before
    two_d = {"data.yaml": pose_yaml.replace("[2, 3]", "[2, 2]"),
             "labels/cam-a/k1.txt": "0 0.5 0.5 0.2 0.2 0.25 0.5 0 0\n"}
    status, _ = fleet.call("POST", "/api/samples/import?format=yolo", "operator", _zip(two_d), "application/zip")
    assert status == 200
    [k1] = fleet.list("device=cam-a")
    assert k1["labels"][0]["keypoints"] == [[W * 0.25, H * 0.5, 2.0], [0.0, 0.0, 0.0]]  # x y only: 0 0 unlabelled


def test_a_masks_outline_and_an_oriented_box_are_kept_and_coco_exports_the_outline(fleet, tmp_path):
    """A segmentation model's ``polygons`` and an oriented-box model's ``rotated_box`` come back as sent (the manager
    says which field is wrong); COCO's export holds the outline as the annotation's ``segmentation``."""
    square = [[40.0, 40.0], [120.0, 40.0], [120.0, 100.0], [40.0, 100.0]]
    mask = {"label": "dog", "score": 0.9, "box": [40.0, 40.0, 120.0, 100.0], "polygons": [square]}
    ship = {"label": "ship", "score": 0.7, "box": [150.0, 60.0, 250.0, 140.0],
            "rotated_box": [200.0, 100.0, 90.0, 40.0, 0.5236]}
    hostile = {"polygons.0: List should have at least 3 items": {**mask, "polygons": [square[:2]]},
               "polygons.0.0.0: Input should be greater than or equal to 0": {**mask, "polygons": [[[-1.0, 2.0],
                                                                                                    *square[1:]]]},
               "rotated_box: List should have at least 5 items": {**ship, "rotated_box": [1.0, 2.0, 3.0, 4.0]},
               "rotated_box.4: Input should be a valid number": {**ship, "rotated_box": [1.0, 2.0, 3.0, 4.0, "nan"]}}
    for error, detection in hostile.items():
        status, answer = fleet.put("cam-a", "p0", sample(91, detections=[detection]))
        assert status == 400 and error in answer["error"], (error, answer)
    assert fleet.put("cam-a", "p1", sample(91, detections=[mask, ship]))[0] == 201
    [stored] = fleet.list()
    assert stored["detections"] == [mask, ship]
    archive = export(fleet, "coco")
    archive.extractall(tmp_path)
    coco = COCO(str(tmp_path / "annotations.json"))
    [dog] = coco.loadAnns(coco.getAnnIds(catIds=coco.getCatIds(catNms=["dog"])))
    assert dog["segmentation"] == [[v for point in square for v in point]] and dog["area"] == 80 * 60
    assert 80 * 60 <= coco.annToMask(dog).sum() <= 81 * 61  # pycocotools reads it as the square it is

"""A model judged on the fleet's own data, against the model the fleet runs now: a real fleet manager (its managed
Mosquitto, a real PostgreSQL, HTTP on a real socket), simulated devices answering rollouts with the real protocol,
samples uploaded with a device's own credential, corrected labels imported, and real models run by the CLI.

The frames are shared photos with people; what the camera's model said is the Coral SSD's own reference output
(../shared/assets/references), and the corrected labels are YOLO11n-pose's Ultralytics reference boxes (a stronger
detector's people). On those labels the SSD really is the worse model (mAP50-95 about 0.57 against 1.0); on labels
made of the SSD's own boxes, YOLO11n-pose is (about 0.53 against 0.67).
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import subprocess
import urllib.request
import zipfile
from pathlib import Path

import cv2
import pytest
from support.agent import AgentProcess, write_config
from support.assets import IMAGES, LABELS, MODELS, REFERENCES
from support.fleet import simulated_fleet
from support.metadata import ssd_with_coco_names
from support.optimize import YOLO_POSE, error_line, run_cli
from support.processes import wait_until

from edgeinfer.fleet.client import FleetClient

pytest.importorskip("pycocotools")

SSD = MODELS / "mobilenet_ssd_v2_coco_quant_postprocess.tflite"
COCO_LABELS = LABELS / "coco_labels.txt"  # both detectors' class ids are its lines: person is 0
FRAMES = ("squat.bmp", "grace_hopper.bmp", "kite_and_cold.jpg", "face.jpg")
CAMERA = "sim-00000"
PIPELINE = "main"


def _reference(name: str) -> dict[str, list[dict]]:
    return json.loads((REFERENCES / name).read_text())["detections"]


SSD_SAID = _reference("mobilenet_ssd_v2_coco_quant_postprocess_litert.json")
POSE_PEOPLE = _reference("yolo11n-pose_ultralytics.json")


def _frame(name: str) -> tuple[bytes, str, int, int]:
    """The photo as the camera's JPEG, its 64-bit average hash (the device's), and its size."""
    image = cv2.imread(str(IMAGES / name))
    ok, jpeg = cv2.imencode(".jpg", image, [cv2.IMWRITE_JPEG_QUALITY, 90])
    assert ok
    small = cv2.resize(cv2.cvtColor(image, cv2.COLOR_BGR2GRAY), (8, 8), interpolation=cv2.INTER_AREA)
    bits = "".join("1" if b else "0" for b in (small > small.mean()).flatten())
    return jpeg.tobytes(), f"{int(bits, 2):016x}", image.shape[1], image.shape[0]


def sample_id(name: str) -> str:
    return Path(name).stem.replace("_", "-")


def upload(url: str, credential: tuple[str, str], name: str, device: str = CAMERA) -> int:
    """PUT one frame as the camera's sample, signed in as the device itself; the answer's status."""
    jpeg, phash, width, height = _frame(name)
    body = {"jpeg": base64.b64encode(jpeg).decode(), "phash": phash, "width": width, "height": height,
            "captured_at": 1795652031.0 + FRAMES.index(name), "pipeline": PIPELINE, "stream": "",
            "rule": "uncertain:0.4-0.6", "model": {"name": SSD.name, "sha256": hashlib.sha256(SSD.read_bytes())
                                                   .hexdigest(), "version": "1"},
            "detections": [{"label": d["label"], "score": d["score"], "box": d["box_xyxy_px"]}
                           for d in SSD_SAID[name]]}
    auth = base64.b64encode(":".join(credential).encode()).decode()
    request = urllib.request.Request(f"{url}/api/devices/{device}/samples/{sample_id(name)}", method="PUT",
                                     data=json.dumps(body).encode(), headers={
                                         "Authorization": f"Basic {auth}", "Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as answer:
        return answer.status


def coco_labels(boxes: dict[str, list[dict]], *, only: str = "person", device: str = CAMERA) -> bytes:
    """A COCO document of corrected labels for the uploaded frames, named as the export names them (a detector's
    box may reach past the frame: a label may not)."""
    images, annotations = [], []
    for image_id, name in enumerate(FRAMES, 1):
        images.append({"id": image_id, "file_name": f"images/{device}/{sample_id(name)}.jpg"})
        _, _, width, height = _frame(name)
        for d in boxes.get(name, []):
            if d.get("label", "person") == only:
                x1, y1, x2, y2 = d["box_xyxy_px"]
                x2, y2 = min(x2, width), min(y2, height)
                annotations.append({"id": len(annotations) + 1, "image_id": image_id, "category_id": 1,
                                    "bbox": [x1, y1, x2 - x1, y2 - y1]})
    return json.dumps({"images": images, "annotations": annotations,
                       "categories": [{"id": 1, "name": only}]}).encode()


class Fleet:
    def __init__(self, simulated, folder: Path) -> None:
        self.manager, self.credentials = simulated.manager, simulated.credentials
        self.url = self.manager.http.url
        self.admin = admin = simulated.admin
        self.files = {}
        for role in ("viewer", "operator"):
            path = folder / f"{role}.token"
            path.write_text(admin.create_token(f"evaluate-{role}", role)["token"])
            self.files[role] = str(path)
        self.operator = FleetClient(self.url, token_file=self.files["operator"])

    def cli(self, *args: object, role: str = "operator") -> subprocess.CompletedProcess:
        return run_cli(*args, "--fleet-url", self.url, "--token-file", self.files[role], timeout=300)

    def evaluate(self, model: Path, *args: object) -> subprocess.CompletedProcess:
        return self.cli("evaluate", model, "--fleet", "--labels", COCO_LABELS, *args, role="viewer")

    def deploy(self, model: Path, version: int, *args: object, pipeline: str = PIPELINE
               ) -> subprocess.CompletedProcess:
        return self.cli("deploy", model, "--version", version, "--pipeline", pipeline, "--no-canary-analysis",
                        "--labels", COCO_LABELS, *args)

    def patch(self, sample: str, change: dict) -> None:
        """PATCH a sample as a reviewer (operator) does."""
        request = urllib.request.Request(f"{self.url}/api/devices/{CAMERA}/samples/{sample}", method="PATCH",
                                         data=json.dumps(change).encode(), headers={
                                             "Authorization": f"Bearer {self.operator.token}",
                                             "Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=30) as answer:
            assert answer.status == 200

    def import_labels(self, boxes: dict[str, list[dict]], device: str = CAMERA) -> None:
        assert self.operator.import_labels("coco", coco_labels(boxes, device=device)) == {"samples": len(FRAMES)}


@pytest.fixture(scope="module")
def fleet(postgres, tmp_path_factory):
    folder = tmp_path_factory.mktemp("evaluate")
    with simulated_fleet(folder / "fleet", devices=2, fleet="field", db_url=postgres.create_database(),
                         groups=("lab",)) as simulated:
        yield Fleet(simulated, folder)


@pytest.fixture(autouse=True)
def samples(fleet):
    """Each test starts from the camera's four samples as it uploaded them: none labelled yet."""
    with fleet.manager.db.engine.begin() as conn:
        conn.execute(fleet.manager.db.t.samples.delete())
    assert [upload(fleet.url, fleet.credentials[CAMERA], name) for name in FRAMES] == [201] * len(FRAMES)


def headline(pattern: str, text: str) -> tuple[float, float]:
    """The candidate's and the baseline's mAP50-95 as a deploy line states them."""
    found = re.search(pattern, text)
    assert found, text
    return float(found.group(1)), float(found.group(2))


def _json(result: subprocess.CompletedProcess) -> dict:
    assert result.stdout, result.stderr
    return json.loads(result.stdout)


def test_labelled_selects_the_corrected_and_the_reviewed_samples(fleet, tmp_path):
    client = FleetClient(fleet.url, token_file=fleet.files["viewer"])
    squat, grace, kite, face = (sample_id(name) for name in FRAMES)
    assert fleet.operator.import_labels("coco", json.dumps({
        "images": [{"id": 1, "file_name": f"images/{CAMERA}/{squat}.jpg"}],
        "annotations": [{"id": 1, "image_id": 1, "category_id": 7, "bbox": [100, 130, 260, 470]}],
        "categories": [{"id": 7, "name": "person"}]}).encode()) == {"samples": 1}
    fleet.patch(grace, {"reviewed": True})  # the model's detections accepted as they are
    fleet.patch(kite, {"labels": [{"label": "kite", "box": [592, 76, 667, 148]}]})  # corrected, not marked reviewed
    assert sorted(s["sample_id"] for s in client.samples(labelled=True)) == sorted([squat, grace, kite])
    assert [s["sample_id"] for s in client.samples(labelled=False)] == [face]
    assert client.samples(labelled=True, device="sim-00001") == []
    assert [s["sample_id"] for s in client.samples(labelled=True, reviewed=False)] == [kite]

    # the export of the labelled ones: each sample's ground truth
    client.save_export("coco", tmp_path / "labelled.zip", labelled=True, pipeline=PIPELINE)
    with zipfile.ZipFile(tmp_path / "labelled.zip") as archive:
        document = json.loads(archive.read("annotations.json"))
        assert sorted(archive.namelist()) == sorted(["annotations.json", *(
            f"images/{CAMERA}/{s}.jpg" for s in (squat, grace, kite))])
    names = {c["id"]: c["name"] for c in document["categories"]}
    files = {i["id"]: Path(i["file_name"]).stem for i in document["images"]}
    truth: dict[str, list] = {}
    for ann in document["annotations"]:
        truth.setdefault(files[ann["image_id"]], []).append((names[ann["category_id"]], ann["bbox"]))
    assert truth[squat] == [("person", [100, 130, 260, 470])]  # the corrected labels
    assert sorted(name for name, _ in truth[grace]) == ["person", "tie"]  # reviewed: the detections accepted
    assert truth[kite] == [("kite", [592, 76, 75, 72])]


def test_labelled_on_sqlite_and_postgresql_alike(db_url):
    """No labels is JSON null in the column, not SQL NULL: the filter reads it the same on both databases."""
    from edgeinfer.fleet.db import FleetDB
    from edgeinfer.fleet.db.samples import Filters

    rows = FleetDB(db_url).samples
    row = {"device_id": "d", "pipeline": "p", "stream": "", "rule": "r", "model_name": "m", "model_sha256": "a" * 64,
           "model_version": "1", "width": 10, "height": 10, "size": 3, "sha256": "b" * 64, "phash": "0" * 16,
           "jpeg": b"\xff\xd8\xff\xd9", "labels": None,
           "detections": [{"label": "a", "score": 0.5, "box": [0, 0, 1, 1]}]}
    for number in range(4):
        rows.insert({**row, "sample_id": f"s{number}", "captured_at": float(number)})
    rows.update("d", "s1", reviewed=True, labels=None)
    rows.update("d", "s2", reviewed=None, labels=[{"label": "b", "score": None, "box": [0, 0, 2, 2]}])
    rows.set_labels([("d", "s3", [])])  # labelled as showing nothing: a ground truth too
    assert sorted(r["sample_id"] for r in rows.select(Filters(labelled=True), limit=10)) == ["s1", "s2", "s3"]
    assert [r["sample_id"] for r in rows.select(Filters(labelled=False), limit=10)] == ["s0"]


def test_a_fleet_without_labelled_samples_is_one_clear_error_and_nothing_is_deployed(fleet):
    before = len(fleet.operator.deployments())
    evaluated = fleet.evaluate(YOLO_POSE, "-q")
    assert evaluated.returncode == 1
    assert "has no labelled samples (all devices and pipelines)" in error_line(evaluated)
    filtered = fleet.evaluate(YOLO_POSE, "--device", "sim-00001", "-q")
    assert "has no labelled samples (device=sim-00001)" in error_line(filtered)
    fleet.import_labels(POSE_PEOPLE)  # labelled now, but of another pipeline than the one asked for
    other = fleet.evaluate(YOLO_POSE, "--pipeline", "door", "-q")
    assert "has no labelled samples (pipeline=door)" in error_line(other)
    refused = fleet.deploy(YOLO_POSE, 9, "--all", "--require-eval", "--baseline", SSD, "--json", pipeline="door")
    assert refused.returncode == 1 and "has no labelled samples (pipeline=door)" in error_line(refused)
    assert len(fleet.operator.deployments()) == before


def test_evaluate_on_the_fleet_scores_change_when_the_labels_are_corrected_again(fleet):
    fleet.import_labels(POSE_PEOPLE)
    first = fleet.evaluate(YOLO_POSE, "--baseline", SSD, "--pipeline", PIPELINE, "--json", "-q")
    assert first.returncode == 0, first.stderr
    result = _json(first)
    assert result["baseline_model"] == {"source": "file", "path": str(SSD)}
    ours, theirs = result["candidate"], result["baseline"]
    assert ours["images"] == theirs["images"] == 4 and ours["boxes"] == 8
    assert ours["dataset"] == "the fleet's labelled samples (pipeline=main)"
    assert ours["map50_95"] > 0.9 and theirs["map50_95"] < ours["map50_95"] - 0.2
    assert result["worse"] is False

    fleet.import_labels(SSD_SAID)  # a reviewer's second thoughts: the people as the SSD saw them
    second = fleet.evaluate(YOLO_POSE, "--baseline", SSD, "--json", "-q")
    assert second.returncode == 1  # the candidate is now the worse one
    again = _json(second)
    assert again["candidate"]["boxes"] == 12
    assert again["candidate"]["map50_95"] < ours["map50_95"] - 0.3
    assert again["baseline"]["map50_95"] > theirs["map50_95"] and again["worse"] is True


def test_deploy_require_eval_judges_the_candidate_against_the_model_the_fleet_runs_now(fleet):
    fleet.import_labels(POSE_PEOPLE)
    assert fleet.operator.deployments() == []
    # nothing deployed yet: the devices run their agent.yaml's model, which the manager does not hold (the simulated
    # devices report a sha256 of zeros) — said, with what to do; the deploy gate refuses to guess either
    alone = fleet.evaluate(YOLO_POSE, "--json", "-q")
    assert alone.returncode == 1
    assert error_line(alone) == (
        f"edgeinfer: error: 2 devices run model.tflite (sha256 {'0' * 64}) in pipeline main, from agent.yaml (no "
        f"deployment that succeeded put it there), and the fleet manager at {fleet.url} has no artifact of it to "
        "compare with: pass --baseline FILE, that model's file")
    unknown = fleet.deploy(YOLO_POSE, 2, "--all", "--require-eval", "--json")
    assert unknown.returncode == 1 and "model.tflite (sha256 0000" in error_line(unknown)
    assert "pass --baseline FILE" in error_line(unknown)
    assert fleet.operator.deployments() == []

    # the fleet's first model, without a gate: the SSD
    first = fleet.deploy(SSD, 2, "--all", "--json")
    assert first.returncode == 0 and _json(first)["status"] == "succeeded", first.stderr
    compared = fleet.evaluate(YOLO_POSE, "--pipeline", PIPELINE, "-q")
    assert compared.returncode == 0, compared.stderr
    assert f"baseline: the fleet's current model {SSD.name} v2 (deployment" in compared.stdout
    assert "→ not worse" in compared.stdout
    # the baseline's scores: named as the fleet names it, not by the temporary file it was run from
    assert any(line.startswith(f"{SSD.name} v2 (deployment") for line in compared.stdout.splitlines())
    assert "edgeinfer-evaluate-" not in compared.stdout

    # a better candidate goes ahead, judged against the SSD the group runs
    better = fleet.deploy(YOLO_POSE, 3, "--group", "lab", "--require-eval")
    assert better.returncode == 0, better.stderr
    assert f"baseline: the fleet's current model {SSD.name} v2" in better.stderr
    ours, theirs = headline(r"evaluation passed: map50_95 ([\d.]+) vs ([\d.]+)", better.stderr)
    assert ours > 0.9 and theirs < ours - 0.2

    # the SSD again is now the worse model: refused, nothing deployed
    deployments = fleet.operator.deployments()
    worse = fleet.deploy(SSD, 4, "--device", CAMERA, "--require-eval", "--json")
    assert worse.returncode == 1
    line = error_line(worse)
    assert f"{SSD.name} scores worse than the fleet's current model {YOLO_POSE.name} v3" in line
    ours, theirs = headline(r"map50_95 ([\d.]+) vs ([\d.]+)", line)
    assert theirs > 0.9 and ours < theirs - 0.2 and line.endswith("not deployed")
    assert fleet.operator.deployments() == deployments


def test_a_baseline_whose_bytes_are_not_its_sha256_is_never_run(fleet, tmp_path):
    """The artifact is checked as it arrives: one damaged in the manager's store is refused, and not kept."""
    from edgeinfer.errors import DownloadError

    model = MODELS / "mobilenet_v1_0.25_128_quant.tflite"  # an artifact no other test deploys
    sha256 = fleet.operator.upload(model)["sha256"]
    viewer = FleetClient(fleet.url, token_file=fleet.files["viewer"])
    assert viewer.download_artifact(sha256, tmp_path / "good.tflite").read_bytes() == model.read_bytes()
    stored = fleet.manager.store.get(sha256)
    data = stored.read_bytes()
    stored.write_bytes(data[:-1] + bytes([data[-1] ^ 0xFF]))  # a flipped last byte on the manager's disk
    with pytest.raises(DownloadError, match=f"artifact {sha256} .* arrived as"):
        viewer.download_artifact(sha256, tmp_path / "bad.tflite")
    assert not (tmp_path / "bad.tflite").exists()
    with pytest.raises(DownloadError, match="has no artifact"):
        viewer.download_artifact("0" * 64, tmp_path / "none.tflite")


def test_evaluate_on_the_fleet_finds_the_model_agent_yaml_names_by_the_sha256_the_device_reports(fleet, tmp_path):
    """A device that runs the model its agent.yaml names (no deployment sent it): the baseline is that model when the
    manager's artifact store holds its sha256, else one error naming it and what to do. A real agent reports it."""
    model = ssd_with_coco_names(tmp_path / "models")  # bytes no other test uploads: the store starts without them
    sha256 = hashlib.sha256(model.read_bytes()).hexdigest()
    [device] = fleet.admin.enroll_many(["cam-yaml"], "field")
    config = write_config(tmp_path / "agent.yaml", device_id="cam-yaml", fleet="field",
                          broker=fleet.manager.broker_url, username=device["username"], password=device["password"],
                          data_dir=str(tmp_path / "data"), telemetry_interval_s=0.5, pipelines=[
                              {"name": PIPELINE, "model": str(model), "version": "7", "source": str(IMAGES),
                               "loop": True, "max_fps": 2}])

    def reported() -> str | None:
        pipelines = ((fleet.manager.db.get_device("cam-yaml") or {}).get("state") or {}).get("pipelines") or []
        return pipelines[0]["model"]["sha256"] if pipelines else None

    with AgentProcess(config, tmp_path / "agent.log") as agent:
        assert wait_until(lambda: reported() == sha256, 60, 0.2), agent.output()
        credential = (device["username"], device["password"])
        assert [upload(fleet.url, credential, name, "cam-yaml") for name in FRAMES] == [201] * len(FRAMES)
        fleet.import_labels(POSE_PEOPLE, "cam-yaml")
        deployments = fleet.operator.deployments()

        missing = fleet.evaluate(YOLO_POSE, "--device", "cam-yaml", "-q")
        assert missing.returncode == 1
        assert error_line(missing) == (
            f"edgeinfer: error: cam-yaml runs {model.name} (sha256 {sha256}) in pipeline {PIPELINE}, from agent.yaml "
            f"(no deployment that succeeded put it there), and the fleet manager at {fleet.url} has no artifact of it "
            "to compare with: pass --baseline FILE, that model's file")
        gate = fleet.deploy(YOLO_POSE, 9, "--device", "cam-yaml", "--require-eval")
        assert gate.returncode == 1 and f"cam-yaml runs {model.name} (sha256 {sha256})" in error_line(gate)
        assert fleet.operator.deployments() == deployments  # refused before anything was sent

        assert fleet.operator.upload(model)["sha256"] == sha256  # the store holds it now: found by its sha256
        found = fleet.evaluate(YOLO_POSE, "--device", "cam-yaml", "--pipeline", PIPELINE, "--json", "-q")
        assert found.returncode == 0, found.stderr
        result = _json(found)
        assert result["baseline_model"] == {"source": "devices", "model_name": model.name, "version": "7",
                                            "sha256": sha256, "devices": ["cam-yaml"]}
        named = f"{model.name} v7 (reported by cam-yaml, no deployment; sha256 {sha256[:12]})"
        assert result["baseline"]["model"] == named
        assert result["candidate"]["images"] == result["baseline"]["images"] == len(FRAMES)
        assert result["baseline"]["map50_95"] < result["candidate"]["map50_95"] - 0.2  # the SSD, really run
        printed = fleet.evaluate(YOLO_POSE, "--device", "cam-yaml", "-q")
        assert printed.returncode == 0 and f"baseline: the fleet's current model {named}" in printed.stdout
        assert agent.alive()

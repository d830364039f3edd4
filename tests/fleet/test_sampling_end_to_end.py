"""From the field back to the model, with no stand-in on either side: a real agent process (its enrolled credential,
the manager's own Mosquitto) runs the COCO SSD detector over photos, keeps the frames with a box it is unsure of,
and uploads them; the manager stores each scene once; an operator asks for the next frames; the export opens in
pycocotools; corrected labels imported back change what ``edgeinfer evaluate`` says of the model. A device whose
disk is full says so once, goes on running, and what it had stored still reaches the manager."""

from __future__ import annotations

import json
import shutil
import subprocess
import urllib.error
import urllib.request

import cv2
import pytest
from support.agent import AgentProcess, write_config
from support.assets import ASSETS
from support.disk import small_disk
from support.metadata import ssd_with_coco_names
from support.ports import free_port
from support.processes import edgeinfer_cmd, env_with_repo, wait_until

from edgeinfer.agent.uploads import UPLOADED_MARK
from edgeinfer.fleet.client import FleetClient
from edgeinfer.fleet.manager import FleetManager, FleetSettings
from edgeinfer.forms.samples import SAMPLE_META_NAME
from edgeinfer.util.fs import sha256_file

pycocotools = pytest.importorskip("pycocotools.coco", reason="the evaluate extra (pycocotools) is not installed")

POSE = ASSETS / "models" / "yolo11n-pose.onnx"
#: photos where the detector reports a box scored within [0.3, 0.6) (a bench, a person, a kite), and two where
#: it does not (a cat and dogs, all above 0.9)
UNSURE = ("dog_segmentation.bmp", "face.jpg", "kite_and_cold.jpg")
SURE = ("cat.bmp", "pets.jpg")
RULE = "uncertain:0.3-0.6"


def _cli(*args: str, env: dict[str, str], timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(edgeinfer_cmd(*args), capture_output=True, text=True, timeout=timeout, env=env)


def _uploaded(folder) -> int:
    return sum(1 for meta in folder.glob(f"*/{SAMPLE_META_NAME}") if (meta.parent / UPLOADED_MARK).exists())


def test_uncertain_frames_reach_the_manager_once_per_scene_and_corrected_labels_change_the_evaluation(tmp_path):
    ssd = ssd_with_coco_names(tmp_path / "models")  # the COCO SSD, saying its own class names
    photos = tmp_path / "photos"
    photos.mkdir()
    for index, name in enumerate(UNSURE + SURE):  # the order the source reads them in
        shutil.copy(ASSETS / "images" / name, photos / f"{index}_{name}")
    settings = FleetSettings(broker=None, broker_port=free_port(), http="127.0.0.1:0", data_dir=tmp_path / "fleet")
    with FleetManager(settings) as manager:
        assert manager.wait_connected(10)
        url = manager.http.url
        admin = FleetClient(url, token=manager.admin_token)
        [device] = admin.enroll_many(["cam-field"], "f")
        operator = admin.create_token("labeller", "operator")["token"]
        config = write_config(
            tmp_path / "agent.yaml", device_id="cam-field", fleet="f", broker=manager.broker_url,
            username=device["username"], password=device["password"], data_dir=str(tmp_path / "data"),
            telemetry_interval_s=0.5, manager_url=url, update_public_key=manager.key.public_key_b64(),
            pipelines=[{"name": "door", "model": str(ssd), "version": "7",
                        "source": str(photos), "loop": True, "max_fps": 10, "score_threshold": 0.3,
                        "sample": [RULE, "request"], "samples_per_minute": 600}])
        store = tmp_path / "data" / "samples" / "door"  # the agent's default: <data_dir>/samples/<pipeline>
        with AgentProcess(config, tmp_path / "agent.log") as agent:
            # the photos loop: each unsure one is kept and sent again and again, and stored once
            assert wait_until(lambda: _uploaded(store) >= 3 * len(UNSURE), 120, 0.5), agent.output()
            samples = admin.samples(device="cam-field")
            assert len(samples) == len(UNSURE), samples
            for sample in samples:
                assert (sample["pipeline"], sample["rule"], sample["model_name"], sample["model_version"]) == (
                    "door", RULE, ssd.name, "7")
                assert any(0.3 <= d["score"] < 0.6 for d in sample["detections"])
            # an operator asks for the next frames: the scenes not stored yet arrive under the rule "request"
            asked = FleetClient(url, token=operator).sample("cam-field", "door", frames=len(UNSURE + SURE))
            assert asked["args"] == {"pipeline": "door", "frames": len(UNSURE + SURE)}
            assert wait_until(lambda: len(admin.samples(device="cam-field", rule="request")) >= len(SURE), 60,
                              0.5), agent.output()
            requested = admin.samples(device="cam-field", rule="request")
            assert {d["label"] for s in requested for d in s["detections"]} >= {"cat", "dog"}
        env = env_with_repo(EDGEINFER_FLEET_URL=url, EDGEINFER_FLEET_TOKEN=operator)
        # the unsure scenes as COCO, opened by pycocotools, not by our own parser
        exported = tmp_path / "export"
        run = _cli("fleet", "dataset", "export", "--format", "coco", "-o", str(exported), "--rule", RULE, env=env)
        assert run.returncode == 0, run.stderr
        coco = pycocotools.COCO(str(exported / "annotations.json"))
        assert len(coco.getImgIds()) == len(UNSURE)
        boxes = sum(len(s["detections"]) for s in samples)
        assert len(coco.getAnnIds()) == boxes and {"person", "kite"} <= {c["name"] for c in coco.loadCats(
            coco.getCatIds())}
        # nothing is labelled yet: no evaluation on the fleet's data, said plainly
        run = _cli("evaluate", str(ssd), "--fleet", "--pipeline", "door", "--baseline", str(ssd), "-q", env=env)
        assert run.returncode == 1 and "labelled" in run.stderr, run.stderr
        # the labeller accepts the model's boxes as they are (imported back unchanged): the fleet's first labels
        accepted = json.loads((exported / "annotations.json").read_text())
        for annotation in accepted["annotations"]:
            annotation.pop("score", None)
        assert _import(tmp_path / "accepted.json", accepted, env) == len(UNSURE)
        before = _fleet_map50(ssd, env)
        # a candidate that finds fewer of the fleet's persons is refused before anything is uploaded
        run = _cli("deploy", str(POSE), "--device", "cam-field", "--pipeline", "door", "--version", "8",
                   "--require-eval", "--baseline", str(ssd), "--ignore-unknown-classes", "--json", env=env)
        assert run.returncode == 1 and "scores worse than" in run.stderr, (run.stdout, run.stderr)
        assert admin.deployments() == [] and _status(url, operator, f"/artifacts/{sha256_file(POSE)}") == 404
        # corrected labels (every box shrunk to its top-left quarter: none matches the model's at IoU 0.5) change
        # what the fleet's data says of the model
        corrected = json.loads(json.dumps(accepted))
        for annotation in corrected["annotations"]:
            annotation["bbox"][2:] = [annotation["bbox"][2] / 2, annotation["bbox"][3] / 2]
        assert _import(tmp_path / "corrected.json", corrected, env) == len(UNSURE)
        after = _fleet_map50(ssd, env)
    # the model agrees with its own boxes (but for the unsure ones a JPEG of the frame may tip below its threshold:
    # the bench scored 0.5 is one, so its class's AP can be 0); with the corrected ones it scores far lower
    assert before >= 0.7 and after < 0.1, (before, after)


def _import(path, document: dict, env: dict[str, str]) -> int:
    path.write_text(json.dumps(document))
    run = _cli("fleet", "dataset", "import", "--format", "coco", str(path), "--json", env=env)
    assert run.returncode == 0, run.stderr
    return json.loads(run.stdout)["samples"]


def _fleet_map50(model, env: dict[str, str]) -> float:
    """The model's mAP50 on the fleet's labelled samples of the pipeline (``evaluate --fleet``, fetched from the
    manager's API), compared with itself: no deployment names a current model here."""
    run = _cli("evaluate", str(model), "--fleet", "--pipeline", "door", "--baseline", str(model), "--json", "-q",
               env=env)
    assert run.returncode == 0, run.stderr
    return json.loads(run.stdout)["candidate"]["map50"]


def _get(url: str, token: str, path: str):
    request = urllib.request.Request(url + path, headers={"Authorization": f"Bearer {token}"})
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.loads(response.read())


def _status(url: str, token: str, path: str) -> int:
    try:
        _get(url, token, path)
    except urllib.error.HTTPError as error:
        return error.code
    return 200


def _events(url: str, token: str, kind: str) -> list[dict]:
    return _get(url, token, f"/api/events?device=cam-full&event={kind}")


def _window_frames(url: str, token: str) -> int:
    """The frames the device's newest telemetry window counted (0 before any)."""
    messages = _get(url, token, "/api/devices/cam-full/telemetry?limit=1")
    return sum(int(p.get("frames") or 0) for m in messages for p in m.get("pipelines", []))


def test_a_full_capture_disk_is_reported_once_and_neither_the_pipeline_nor_the_stored_samples_suffer(tmp_path):
    photo = ASSETS / "images" / "kite_and_cold.jpg"
    sample_kib = len(cv2.imencode(".jpg", cv2.imread(str(photo)), [cv2.IMWRITE_JPEG_QUALITY, 90])[1]) // 1024
    settings = FleetSettings(broker=None, broker_port=free_port(), http="127.0.0.1:0", data_dir=tmp_path / "fleet")
    with FleetManager(settings) as manager, small_disk(tmp_path / "card", sample_kib * 3 // 2 + 16) as card:
        assert manager.wait_connected(10)
        url, token = manager.http.url, manager.admin_token
        [device] = FleetClient(url, token=token).enroll_many(["cam-full"], "f")
        config = write_config(
            tmp_path / "agent.yaml", device_id="cam-full", fleet="f", broker=manager.broker_url,
            username=device["username"], password=device["password"], data_dir=str(tmp_path / "data"),
            telemetry_interval_s=0.5, manager_url=url, update_public_key=manager.key.public_key_b64(),
            pipelines=[{"name": "door", "model": str(ssd_with_coco_names(tmp_path / "models")),
                        "source": str(photo), "loop": True, "max_fps": 10,
                        "sample": ["random:1"], "samples_per_minute": 600, "samples_dir": str(card)}])
        with AgentProcess(config, tmp_path / "agent.log") as agent:
            assert wait_until(lambda: _events(url, token, "sample_failed"), 60, 0.5), agent.output()
            stored = [meta.parent for meta in card.glob(f"*/{SAMPLE_META_NAME}")]
            assert stored and all(json.loads((f / SAMPLE_META_NAME).read_text())["rule"] == "random:1"
                                  for f in stored)
            # what fitted is whole and reaches the manager (the same scene each time: stored once)
            assert wait_until(lambda: _uploaded(card) == len(stored), 60, 0.5), agent.output()
            assert len(FleetClient(url, token=token).samples(device="cam-full")) == 1
            assert wait_until(lambda: _window_frames(url, token) > 0, 30, 0.5), agent.output()  # it runs on
        [failed] = _events(url, token, "sample_failed")  # once, though every kept frame failed since
        assert failed["level"] == "warning" and "No space left on device" in failed["data"]["error"]
        assert failed["data"]["rule"] == "random:1"


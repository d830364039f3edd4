"""``edgeinfer evaluate`` and ``deploy --require-eval``: real models on labelled datasets built from the shared
photos, the labels from the reference implementations' own results (../shared/assets/references)."""

from __future__ import annotations

import contextlib
import io
import json
import math
import re
from pathlib import Path

import pytest
from support.assets import IMAGENET_LABELS, IMAGES, LABELS, MOBILENET_TINY, MOBILENET_V2, MODELS, REFERENCES
from support.metadata import ssd_with_coco_names
from support.optimize import YOLO_FALL, YOLO_POSE, error_line, json_out, run_cli

from edgeinfer.errors import DatasetError
from edgeinfer.forms.samples import COCO_KEYPOINT_NAMES, COCO_SKELETON
from edgeinfer.tools.evaluate import EvaluateOptions, compare_models, evaluate_model

pytest.importorskip("pycocotools")

SSD = MODELS / "mobilenet_ssd_v2_coco_quant_postprocess.tflite"
COCO_LABELS = LABELS / "coco_labels.txt"
#: MobileNet v2's reference top-1 on the shared photos (../shared/assets/README.md): the class folders
CLASSES = {"parrot.jpg": "macaw", "cat.bmp": "Egyptian cat", "grace_hopper.bmp": "military uniform",
           "cat_720p.jpg": "Egyptian cat", "dog_segmentation.bmp": "Samoyed", "squat.bmp": "dumbbell"}


def _reference(name: str) -> dict[str, list[dict]]:
    return json.loads((REFERENCES / name).read_text())["detections"]


def _size(image: str) -> tuple[int, int]:
    import cv2

    height, width = cv2.imread(str(IMAGES / image)).shape[:2]
    return width, height


def yolo_dataset(root: Path, shift: float = 0.0) -> Path:
    """An Ultralytics YOLO dataset of the fall detector's reference boxes; ``shift`` moves each box right by
    that fraction of its width (a deliberately wrong label set)."""
    (root / "images").mkdir(parents=True)
    (root / "labels").mkdir()
    for image, found in _reference("yolo_fall_detection_ultralytics.json").items():
        (root / "images" / image).symlink_to(IMAGES / image)
        width, height = _size(image)
        lines = []
        for d in found:
            x1, y1, x2, y2 = d["box_xyxy_px"]
            cx = (x1 + x2) / 2 + shift * (x2 - x1)
            lines.append(f"{d['class_id']} {cx / width} {(y1 + y2) / 2 / height} {(x2 - x1) / width} "
                         f"{(y2 - y1) / height}")
        (root / "labels" / Path(image).with_suffix(".txt")).write_text("\n".join(lines) + "\n")
    (root / "data.yaml").write_text("names:\n  0: Normal\n  1: Fall\n")
    return root


def coco_ids() -> dict[str, int]:
    """COCO's own category ids: 1..90 with holes (12, 26, 29, ...), as instances_val2017.json numbers its 80
    classes; coco_labels.txt lists them as line N = id N, with `n/a` in the holes."""
    lines = COCO_LABELS.read_text().splitlines()
    return {name: number for number, name in enumerate(lines, 1) if name != "n/a"}


def coco_dataset(root: Path, ids: dict[str, int] | None = None) -> Path:
    """A COCO JSON of the Coral SSD's LiteRT reference boxes, its own category ids (not the model's): 100, 101 …
    in the order of the names, or ``ids`` (every one of them a category)."""
    (root / "images").mkdir(parents=True)
    found = _reference("mobilenet_ssd_v2_coco_quant_postprocess_litert.json")
    names = sorted({d["label"] for ds in found.values() for d in ds})
    ids = ids or {name: 100 + i for i, name in enumerate(names)}
    categories = [{"id": number, "name": name} for name, number in ids.items()]
    images, annotations = [], []
    for image_id, (image, boxes) in enumerate(sorted(found.items()), 1):
        (root / "images" / image).symlink_to(IMAGES / image)
        width, height = _size(image)
        images.append({"id": image_id, "file_name": image, "width": width, "height": height})
        for d in boxes:
            x1, y1, x2, y2 = d["box_xyxy_px"]
            annotations.append({"id": len(annotations) + 1, "image_id": image_id, "iscrowd": 0,
                                "category_id": ids[d["label"]], "bbox": [x1, y1, x2 - x1, y2 - y1],
                                "area": (x2 - x1) * (y2 - y1)})
    (root / "annotations.json").write_text(json.dumps({"images": images, "annotations": annotations,
                                                       "categories": categories}))
    return root


def class_folders(root: Path, classes: dict[str, str] = CLASSES) -> Path:
    for image, label in classes.items():
        (root / label).mkdir(parents=True, exist_ok=True)
        (root / label / image).symlink_to(IMAGES / image)
    return root


def test_yolo_dataset_of_the_references_scores_high_and_shifted_labels_lower(tmp_path: Path) -> None:
    right = evaluate_model(YOLO_FALL, yolo_dataset(tmp_path / "right"))
    wrong = evaluate_model(YOLO_FALL, yolo_dataset(tmp_path / "wrong", shift=0.4))
    assert (right["format"], right["kind"], right["images"], right["boxes"]) == ("yolo", "detect", 4, 9)
    assert right["map50"] > 0.75 and right["map50_95"] > 0.7
    assert right["per_class"]["Normal"]["recall"] > 0.8
    assert right["per_class"]["Fall"]["boxes"] == 0  # no labelled box: no recall to state
    assert wrong["map50_95"] < right["map50_95"] - 0.3


def test_coco_json_opens_in_pycocotools_and_the_ssd_scores_high_on_its_references(tmp_path: Path) -> None:
    from pycocotools.coco import COCO

    root = coco_dataset(tmp_path / "coco")
    with contextlib.redirect_stdout(io.StringIO()):
        assert len(COCO(str(root / "annotations.json")).getAnnIds()) > 10  # the format's own reader takes it
    scores = evaluate_model(SSD, root, EvaluateOptions(labels=COCO_LABELS))
    assert scores["format"] == "coco"
    assert scores["map50"] > 0.8, scores
    assert scores["per_class"]["person"]["recall"] > 0.8


def test_coco_category_ids_with_holes_are_matched_to_the_model_by_name(tmp_path: Path) -> None:
    from edgeinfer.tools.evaluate import read_dataset
    from edgeinfer.tools.evaluate.names import match_names

    ids = coco_ids()
    assert len(ids) == 80 and (ids["person"], ids["dog"], ids["kite"]) == (1, 18, 38) and 12 not in ids.values()
    root = coco_dataset(tmp_path / "coco", ids)
    model = dict(enumerate(COCO_LABELS.read_text().splitlines()))  # the SSD's class id: the line's index
    mapping = match_names(read_dataset(root).names, model)
    # by name, never by id: COCO's person (1) is the model's 0 (1 is its bicycle), kite (38) its 37
    assert (mapping["person"], mapping["dog"], mapping["kite"]) == (0, 17, 37)
    scores = evaluate_model(SSD, root, EvaluateOptions(labels=COCO_LABELS))
    assert scores["map50"] > 0.8, scores
    assert {name for name, c in scores["per_class"].items() if c["boxes"]} == {"person", "kite", "dog", "cat", "tie",
                                                                                "bird"}
    assert scores["per_class"]["person"]["recall"] > 0.8 and scores["per_class"]["kite"]["recall"] > 0.7
    assert scores["per_class"]["bicycle"]["boxes"] == 0  # a category of the file with no box: no recall stated


def test_classifier_on_class_folders_gives_accuracy_and_top5(tmp_path: Path) -> None:
    root = class_folders(tmp_path / "classes")
    v2 = evaluate_model(MOBILENET_V2, root, EvaluateOptions(labels=IMAGENET_LABELS))
    tiny = evaluate_model(MOBILENET_TINY, root, EvaluateOptions(labels=IMAGENET_LABELS))
    assert (v2["kind"], v2["images"], v2["accuracy"], v2["top5"]) == ("classify", 6, 1.0, 1.0)
    assert tiny["accuracy"] < v2["accuracy"] and tiny["top5"] >= tiny["accuracy"]
    assert v2["per_class"]["Egyptian cat"] == {"accuracy": 1.0, "images": 2}


def test_a_dataset_class_the_model_does_not_know_is_named_with_both_lists_or_ignored(tmp_path: Path) -> None:
    root = class_folders(tmp_path / "classes", {**CLASSES, "face.jpg": "spaceship captain"})
    options = EvaluateOptions(labels=IMAGENET_LABELS)
    with pytest.raises(DatasetError, match=r"'spaceship captain' are not among .*tench"):
        evaluate_model(MOBILENET_V2, root, options)
    scores = evaluate_model(MOBILENET_V2, root, EvaluateOptions(labels=IMAGENET_LABELS, ignore_unknown=True))
    assert scores["ignored_classes"] == ["spaceship captain"] and scores["images"] == 6


def test_a_classifier_on_a_detection_dataset_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(DatasetError, match=r"classify model .* labelled for detect"):
        evaluate_model(MOBILENET_V2, yolo_dataset(tmp_path / "yolo"), EvaluateOptions(labels=IMAGENET_LABELS))


@pytest.mark.parametrize("damage, message", [
    (lambda root: (root / "labels" / "squat.txt").write_text("0 0.5 zero 0.2 0.2\n"), r"squat.txt:1: expected"),
    (lambda root: (root / "labels" / "squat.txt").write_text("7 0.5 0.5 0.2 0.2\n"), r"class 7 is not among"),
    (lambda root: (root / "data.yaml").write_text("names: 3\n"), r"'names' must be"),
    (lambda root: (root / "data.yaml").write_text("names: [a\n"), r"cannot read .*data.yaml"),
])
def test_a_malformed_yolo_dataset_is_one_clear_error(tmp_path: Path, damage, message: str) -> None:
    root = yolo_dataset(tmp_path / "yolo")
    damage(root)
    with pytest.raises(DatasetError, match=message):
        evaluate_model(YOLO_FALL, root)


@pytest.mark.parametrize("text, message", [
    ("{not json", "not a COCO annotation file"),
    ('{"images": [{"id": 1, "file_name": "gone.jpg"}], "annotations": [], "categories": []}', "names image gone.jpg"),
    ('{"images": [{"id": 1, "file_name": "x.jpg"}], "annotations": [{"id": 1, "image_id": 1, "category_id": 9, '
     '"bbox": [0, 0, 1, 1]}], "categories": []}', "category 9"),
])
def test_a_malformed_coco_file_is_one_clear_error(tmp_path: Path, text: str, message: str) -> None:
    root = tmp_path / "coco"
    root.mkdir()
    (root / "x.jpg").symlink_to(IMAGES / "cat.bmp")
    (root / "annotations.json").write_text(text)
    with pytest.raises(DatasetError, match=message):
        evaluate_model(SSD, root, EvaluateOptions(labels=COCO_LABELS))


def test_compare_runs_both_models_on_the_same_frames(tmp_path: Path) -> None:
    result = compare_models(MOBILENET_TINY, MOBILENET_V2, class_folders(tmp_path / "classes"),
                            EvaluateOptions(labels=IMAGENET_LABELS))
    assert result["worse"] and result["headline"] == "accuracy"
    assert result["deltas"]["accuracy"] == pytest.approx(result["candidate"]["accuracy"] - 1.0)
    assert result["candidate"]["images"] == result["baseline"]["images"] == 6


def test_a_model_that_knows_fewer_classes_is_compared_on_the_classes_both_know(tmp_path: Path) -> None:
    # the person-only pose model against the 80-class SSD on the SSD's own boxes (persons, kites, ...)
    root = coco_dataset(tmp_path / "coco")
    pose = MODELS / "yolo11n-pose.onnx"
    result = compare_models(pose, ssd_with_coco_names(tmp_path / "ssd"), root, EvaluateOptions(ignore_unknown=True))
    ours, theirs = result["candidate"], result["baseline"]
    assert ours["ignored_classes"] == theirs["ignored_classes"] and "kite" in theirs["ignored_classes"]
    assert list(ours["per_class"]) == list(theirs["per_class"]) == ["person"]
    alone = evaluate_model(ssd_with_coco_names(tmp_path / "again"), root, EvaluateOptions(ignore_unknown=True))
    assert "kite" in alone["per_class"] and alone["ignored_classes"] != theirs["ignored_classes"]


def test_cli_evaluate_prints_a_table_json_and_exits_1_for_a_worse_model(tmp_path: Path) -> None:
    root = class_folders(tmp_path / "classes")
    table = run_cli("evaluate", MOBILENET_V2, "--dataset", root, "--labels", IMAGENET_LABELS)
    assert table.returncode == 0, table.stderr
    assert "accuracy 100.0%   top-5 100.0%" in table.stdout and "image 6/6" in table.stderr
    scores = json_out(run_cli("evaluate", MOBILENET_V2, "--dataset", root, "--labels", IMAGENET_LABELS,
                              "--json", "-q"))
    assert scores["accuracy"] == 1.0
    compared = run_cli("evaluate", MOBILENET_TINY, "--dataset", root, "--labels", IMAGENET_LABELS,
                       "--baseline", MOBILENET_V2, "-q")
    assert compared.returncode == 1 and "→ worse" in compared.stdout


def test_cli_evaluate_of_a_bad_dataset_is_one_line_and_exit_1(tmp_path: Path) -> None:
    root = class_folders(tmp_path / "classes", {"cat.bmp": "not a class"})
    result = run_cli("evaluate", MOBILENET_V2, "--dataset", root, "--labels", IMAGENET_LABELS, "-q")
    assert result.returncode == 1
    assert "'not a class' are not among" in error_line(result)


def test_deploy_require_eval_refuses_a_worse_candidate_before_uploading(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EDGEINFER_FLEET_TOKEN", "unused")  # nothing may be sent: no manager listens there
    root = class_folders(tmp_path / "classes")
    common = ("--version", "2", "--all", "--require-eval", "--eval-dataset", root, "--labels", IMAGENET_LABELS,
              "--fleet-url", "http://127.0.0.1:9")
    refused = run_cli("deploy", MOBILENET_TINY, *common, "--baseline", MOBILENET_V2, "--json")
    assert refused.returncode == 1
    line = error_line(refused)
    assert "scores worse than mobilenet_v2_1.0_224_quant.tflite" in line and "accuracy 0.333 vs 1.000" in line
    passed = run_cli("deploy", MOBILENET_V2, *common, "--baseline", MOBILENET_TINY)
    assert "evaluation passed: accuracy 1.000 vs 0.333" in passed.stderr  # then the (absent) manager is asked
    # no --baseline: the fleet is asked for the model it runs now (none listens here: one clear line)
    missing = run_cli("deploy", MOBILENET_V2, *common)
    assert missing.returncode == 1 and "cannot reach the fleet manager" in error_line(missing)


def pose_coco_dataset(root: Path, jitter: float = 0.0) -> Path:
    """A COCO keypoints JSON of YOLO11n-pose's Ultralytics reference people: each box and its keypoints, those the
    reference is sure of (>= 0.5) flagged visible (2), the others not labelled (0); ``jitter`` moves each labelled
    keypoint by that fraction of its box's size, each in its own direction (a deliberately wrong label set)."""
    (root / "images").mkdir(parents=True)
    images, annotations = [], []
    for image_id, (image, people) in enumerate(sorted(_reference("yolo11n-pose_ultralytics.json").items()), 1):
        (root / "images" / image).symlink_to(IMAGES / image)
        width, height = _size(image)
        images.append({"id": image_id, "file_name": image, "width": width, "height": height})
        for person in people:
            x1, y1, x2, y2 = person["box_xyxy_px"]
            flat = []
            for index, (x, y, confidence) in enumerate(person["keypoints_xy_conf"]):
                turn = 2.4 * index  # radians: directions spread round the circle
                seen = confidence >= 0.5
                flat += [x + jitter * (x2 - x1) * math.cos(turn), y + jitter * (y2 - y1) * math.sin(turn), 2] \
                    if seen else [0, 0, 0]
            annotations.append({"id": len(annotations) + 1, "image_id": image_id, "category_id": 1, "iscrowd": 0,
                                "bbox": [x1, y1, x2 - x1, y2 - y1], "area": (x2 - x1) * (y2 - y1),
                                "keypoints": flat, "num_keypoints": sum(1 for v in flat[2::3] if v)})
    (root / "annotations.json").write_text(json.dumps({"images": images, "annotations": annotations, "categories": [
        {"id": 1, "name": "person", "keypoints": list(COCO_KEYPOINT_NAMES),
         "skeleton": [[a + 1, b + 1] for a, b in COCO_SKELETON]}]}))
    return root


def test_a_pose_model_is_scored_on_keypoints_as_well_as_boxes(tmp_path: Path) -> None:
    """YOLO11n-pose against its own reference keypoints scores a high OKS mAP; against keypoints moved by 5 % of
    their person's size, a far lower one, with the same boxes (and so the same box mAP)."""
    right = evaluate_model(YOLO_POSE, pose_coco_dataset(tmp_path / "right"))
    moved = evaluate_model(YOLO_POSE, pose_coco_dataset(tmp_path / "moved", jitter=0.05))
    assert right["map50_95"] > 0.9 and moved["map50_95"] == right["map50_95"]
    assert right["keypoints_map50_95"] > 0.9 and right["keypoints_map50"] > 0.9, right["keypoints"]
    assert moved["keypoints_map50_95"] < right["keypoints_map50_95"] - 0.3, moved["keypoints"]
    assert right["keypoints"] == {"count": 17, "sigmas": "coco", "instances": 8, "detections": right["keypoints"][
        "detections"], "map50_95": right["keypoints_map50_95"], "map50": right["keypoints_map50"], "scored": True}


def test_keypoints_from_a_yolo_pose_dataset_and_the_cli_table_and_json(tmp_path: Path) -> None:
    """The same labels as an Ultralytics pose dataset (kpt_shape, x y v after each box) score the same; the CLI
    prints the keypoint figures under the boxes' and in --json; a detector on keypoint labels says it was not
    scored on them; a dataset of another keypoint count than the model's is one clear error."""
    root = tmp_path / "yolo"
    (root / "images").mkdir(parents=True)
    (root / "labels").mkdir()
    for image, people in _reference("yolo11n-pose_ultralytics.json").items():
        (root / "images" / image).symlink_to(IMAGES / image)
        width, height = _size(image)
        lines = []
        for person in people:
            x1, y1, x2, y2 = person["box_xyxy_px"]
            values = [(x1 + x2) / 2 / width, (y1 + y2) / 2 / height, (x2 - x1) / width, (y2 - y1) / height]
            for x, y, confidence in person["keypoints_xy_conf"]:
                values += [x / width, y / height, 2] if confidence >= 0.5 else [0, 0, 0]
            lines.append("0 " + " ".join(f"{v:.6f}" for v in values))
        (root / "labels" / Path(image).with_suffix(".txt")).write_text("\n".join(lines) + "\n")
    (root / "data.yaml").write_text("kpt_shape: [17, 3]\nnames:\n  0: person\n")
    scores = json_out(run_cli("evaluate", YOLO_POSE, "--dataset", root, "--json", "-q"))
    assert (scores["format"], scores["keypoints"]["instances"]) == ("yolo", 8)
    assert scores["keypoints_map50_95"] > 0.9 and scores["map50_95"] > 0.9
    table = run_cli("evaluate", YOLO_POSE, "--dataset", root, "-q")
    assert table.returncode == 0, table.stderr
    assert re.search(r"keypoints \(OKS\) mAP50-95 \d+\.\d%   mAP50 \d+\.\d%   \(8 labelled instances, 17 keypoints, "
                     r"COCO's sigmas\)", table.stdout), table.stdout
    detector = evaluate_model(SSD, root, EvaluateOptions(labels=COCO_LABELS, ignore_unknown=True))
    assert detector["keypoints_map50_95"] is None and detector["map50"] > 0.5
    why = f"{SSD.name} gives no keypoints (task detect)"
    assert detector["keypoints"] == {"count": 17, "scored": False, "why": why}
    # five keypoints a person: not the model's 17
    for label in (root / "labels").iterdir():
        label.write_text("".join(" ".join(line.split()[:5 + 15]) + "\n" for line in label.read_text().splitlines()))
    (root / "data.yaml").write_text("kpt_shape: [5, 3]\nnames:\n  0: person\n")
    with pytest.raises(DatasetError, match=r"yolo11n-pose\.onnx gives 17 keypoints a detection; the dataset's "
                                           r"labels have 5"):
        evaluate_model(YOLO_POSE, root)
    (root / "data.yaml").write_text("kpt_shape: [17, 3]\nnames:\n  0: person\n")
    with pytest.raises(DatasetError, match=r"\.txt:1: expected 'class cx cy w h and 17 keypoints of x y v'"):
        evaluate_model(YOLO_POSE, root)


def test_two_pose_models_are_judged_on_keypoints_too(tmp_path: Path) -> None:
    result = compare_models(YOLO_POSE, YOLO_POSE, pose_coco_dataset(tmp_path / "coco"))
    assert result["judged"] == ["map50_95", "keypoints_map50_95"] and not result["worse"]
    assert result["deltas"] == {"map50_95": 0.0, "map50": 0.0, "keypoints_map50_95": 0.0, "keypoints_map50": 0.0}

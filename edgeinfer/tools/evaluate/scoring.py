"""Scores: pycocotools' COCOeval for boxes (mAP50, mAP50-95, per-class AP50 and recall) and for a pose model's
keypoints (OKS mAP50, mAP50-95), top-1 / top-5 accuracy for classes. Pure: results and labels in, figures out."""

from __future__ import annotations

import contextlib
import io
from collections.abc import Sequence
from typing import Any

from ...forms.samples import COCO_KEYPOINT_NAMES
from .datasets import Sample

COCO_KEYPOINTS = len(COCO_KEYPOINT_NAMES)


def classification_scores(samples: Sequence[Sample], results: Sequence[Any], mapping: dict[str, int]) -> dict:
    """Top-1 and top-5 accuracy over the samples whose class the model knows (``mapping``)."""
    top1 = top5 = counted = 0
    per_class: dict[str, list[int]] = {}
    for sample, found in zip(samples, results):
        if sample.label not in mapping:
            continue
        ids = [c.index for c in found]
        hit = bool(ids) and ids[0] == mapping[sample.label]
        top1 += hit
        top5 += mapping[sample.label] in ids[:5]
        counted += 1
        per_class.setdefault(sample.label, [0, 0])[0] += hit
        per_class[sample.label][1] += 1
    return {"images": counted, "accuracy": top1 / counted if counted else 0.0,
            "top5": top5 / counted if counted else 0.0,
            "per_class": {name: {"accuracy": hits / total, "images": total}
                          for name, (hits, total) in sorted(per_class.items())}}


def detection_scores(samples: Sequence[Sample], outputs: Sequence[Any], mapping: dict[str, int]) -> dict:
    """COCO mAP50-95, mAP50 and per-class AP50 / recall (IoU 0.5, 100 detections) of ``outputs`` against the
    samples' boxes, on the classes in ``mapping`` (the dataset's, as the model's ids)."""
    from ...util.optional import import_optional

    coco_module = import_optional("pycocotools.coco", "evaluate", "scoring detections")
    cocoeval = import_optional("pycocotools.cocoeval", "evaluate", "scoring detections")
    truth, detections = _coco_dicts(samples, outputs, mapping)
    with contextlib.redirect_stdout(io.StringIO()):  # pycocotools prints its progress and summary
        gt = coco_module.COCO()
        gt.dataset = truth
        gt.createIndex()
        dt = gt.loadRes(detections) if detections else None
        if dt is None:
            return _empty(mapping, truth)
        evaluation = cocoeval.COCOeval(gt, dt, "bbox")
        evaluation.params.catIds = sorted(set(mapping.values()))
        evaluation.evaluate()
        evaluation.accumulate()
        evaluation.summarize()
    return {"images": len(truth["images"]), "boxes": len(truth["annotations"]), "detections": len(detections),
            "map50_95": _clip(evaluation.stats[0]), "map50": _clip(evaluation.stats[1]),
            "per_class": _per_class(evaluation, mapping, truth)}


#: a person's segment area as a share of its box's: OKS scales by the object's area, which a box label does not
#: give; COCO's people cover about this much of their boxes (Ultralytics' pose validation takes the same share)
SEGMENT_SHARE = 0.53


def keypoint_scores(samples: Sequence[Sample], outputs: Sequence[Any], mapping: dict[str, int],
                    count: int) -> dict:
    """COCO's keypoint mAP50-95 and mAP50 (OKS, 20 detections an image) of the ``outputs``' keypoints against the
    samples' labelled ones (``count`` a box), on the classes in ``mapping`` that have keypoint labels. OKS's
    per-keypoint sigmas: COCO's own for its 17 keypoints (pycocotools' defaults), 1/count each for other counts
    (as Ultralytics does: no standard exists). ``sigmas`` in the answer says which."""
    from ...util.optional import import_optional

    coco_module = import_optional("pycocotools.coco", "evaluate", "scoring keypoints")
    cocoeval = import_optional("pycocotools.cocoeval", "evaluate", "scoring keypoints")
    truth, detections = _keypoint_dicts(samples, outputs, mapping, count)
    instances = sum(1 for ann in truth["annotations"] if ann["num_keypoints"])
    scores = {"count": count, "sigmas": "coco" if count == COCO_KEYPOINTS else "uniform", "instances": instances,
              "detections": len(detections), "map50_95": 0.0, "map50": 0.0}
    if not detections or not instances:
        return scores
    with contextlib.redirect_stdout(io.StringIO()):  # pycocotools prints its progress and summary
        gt = coco_module.COCO()
        gt.dataset = truth
        gt.createIndex()
        evaluation = cocoeval.COCOeval(gt, gt.loadRes(detections), "keypoints")
        if count != COCO_KEYPOINTS:
            import numpy as np

            evaluation.params.kpt_oks_sigmas = np.full(count, 1.0 / count)
        evaluation.params.catIds = sorted({ann["category_id"] for ann in truth["annotations"] if ann["num_keypoints"]})
        evaluation.evaluate()
        evaluation.accumulate()
        evaluation.summarize()
    return {**scores, "map50_95": _clip(evaluation.stats[0]), "map50": _clip(evaluation.stats[1])}


def _keypoint_dicts(samples: Sequence[Sample], outputs: Sequence[Any], mapping: dict[str, int],
                    count: int) -> tuple[dict, list]:
    images, annotations, detections = [], [], []
    wanted = set(mapping.values())
    for image_id, (sample, output) in enumerate(zip(samples, outputs), 1):
        width, height = output.size
        images.append({"id": image_id, "width": width, "height": height, "file_name": sample.path.name})
        for box in sample.boxes:
            if box.name not in mapping:
                continue
            sx, sy = (width, height) if box.normalised else (1, 1)
            x1, y1, x2, y2 = box.xyxy[0] * sx, box.xyxy[1] * sy, box.xyxy[2] * sx, box.xyxy[3] * sy
            points = list(box.keypoints) or [(0.0, 0.0, 0)] * count  # a box without keypoints: OKS ignores it
            flat = [value for x, y, v in points for value in (x * sx, y * sy, v)]
            annotations.append({"id": len(annotations) + 1, "image_id": image_id, "category_id": mapping[box.name],
                                "bbox": [x1, y1, x2 - x1, y2 - y1], "iscrowd": 0, "keypoints": flat,
                                "num_keypoints": sum(1 for _, _, v in points if v > 0),
                                "area": SEGMENT_SHARE * (x2 - x1) * (y2 - y1)})
        for d in output.found:
            if d.class_id in wanted and len(d.keypoints) == count:
                detections.append({"image_id": image_id, "category_id": int(d.class_id), "score": float(d.score),
                                   "keypoints": [v for k in d.keypoints for v in (float(k.x), float(k.y), 1.0)]})
    categories = [{"id": cid, "name": name} for name, cid in sorted(mapping.items(), key=lambda kv: kv[1])]
    return {"images": images, "annotations": annotations, "categories": categories}, detections


def _coco_dicts(samples: Sequence[Sample], outputs: Sequence[Any], mapping: dict[str, int]) -> tuple[dict, list]:
    images, annotations, detections = [], [], []
    wanted = set(mapping.values())
    for image_id, (sample, output) in enumerate(zip(samples, outputs), 1):
        width, height = output.size
        images.append({"id": image_id, "width": width, "height": height, "file_name": sample.path.name})
        for box in sample.boxes:
            if box.name not in mapping:
                continue
            x1, y1, x2, y2 = box.xyxy
            if box.normalised:
                x1, x2, y1, y2 = x1 * width, x2 * width, y1 * height, y2 * height
            annotations.append({"id": len(annotations) + 1, "image_id": image_id, "category_id": mapping[box.name],
                                "bbox": [x1, y1, x2 - x1, y2 - y1], "area": (x2 - x1) * (y2 - y1), "iscrowd": 0})
        for d in output.found:
            if d.class_id in wanted:
                x1, y1, x2, y2 = (float(v) for v in d.box)
                detections.append({"image_id": image_id, "category_id": int(d.class_id),
                                   "bbox": [x1, y1, x2 - x1, y2 - y1], "score": float(d.score)})
    categories = [{"id": cid, "name": name} for name, cid in sorted(mapping.items(), key=lambda kv: kv[1])]
    return {"images": images, "annotations": annotations, "categories": categories}, detections


def _per_class(evaluation: Any, mapping: dict[str, int], truth: dict) -> dict:
    """AP50 and recall at IoU 0.5 (all areas, 100 detections) per class; None for a class with no box."""
    cat_ids = list(evaluation.params.catIds)
    counts: dict[int, int] = {}
    for ann in truth["annotations"]:
        counts[ann["category_id"]] = counts.get(ann["category_id"], 0) + 1
    result = {}
    for name, cid in mapping.items():
        k = cat_ids.index(cid)
        recall = float(evaluation.eval["recall"][0, k, 0, -1])
        precision = evaluation.eval["precision"][0, :, k, 0, -1]
        valid = precision[precision > -1]
        result[name] = {"boxes": counts.get(cid, 0), "recall": recall if recall > -1 else None,
                        "ap50": float(valid.mean()) if valid.size and counts.get(cid) else None}
    return result


def _empty(mapping: dict[str, int], truth: dict) -> dict:
    return {"images": len(truth["images"]), "boxes": len(truth["annotations"]), "detections": 0,
            "map50_95": 0.0, "map50": 0.0,
            "per_class": {name: {"boxes": None, "recall": 0.0, "ap50": 0.0} for name in mapping}}


def _clip(value: float) -> float:
    return max(0.0, float(value))  # COCOeval's -1 means "no ground truth": nothing to find scores 0

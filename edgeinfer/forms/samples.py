"""The form of a sample, defined once for the device that keeps and uploads it (``pipeline/sampling.py``,
``agent/sample_upload.py``) and the fleet manager that stores and exports it (``fleet/samples.py``,
``fleet/datasets.py``; docs/datasets.md), and the output drift measure the sampling rule and the canary analysis
share.

On the device a sample is a folder named like an event id (``forms.evidence.new_event_id``: sorts by time, never
collides) holding the frame as the camera gave it (``frame.jpg``, full size) and ``sample.json``, written last (a
folder without it is partial)::

    {"version": 1, "sample_id": "...", "phash": "<16 hex>", "width": 640, "height": 480,
     "captured_at": 1795652031.9, "pipeline": "door", "stream": "", "rule": "uncertain:0.3-0.6",
     "model": {"name": "yolov8n.onnx", "sha256": "<64 hex>", "version": "3"},
     "detections": [{"label": "person", "score": 0.41, "box": [x1, y1, x2, y2],
                     "keypoints": [[x, y, v], ...], "polygons": [[[x, y], ...], ...],
                     "rotated_box": [cx, cy, w, h, angle]}],
     "frame_id": 812, "source_time": 27.07, "output": <the result's to_dict(): keypoints, masks...>,
     "command_id": "9f1c..."}

``command_id`` (a frame a ``sample`` command asked for — rule ``request`` — only) names that command: the fleet
manager counts, per command, the frames it stored and those it dropped as near-duplicates (``fleet/verdicts.py``).

It is uploaded as one JSON document to ``PUT /api/devices/<device>/samples/<sample id>``: the
``UPLOAD_FIELDS`` of ``sample.json`` and ``"jpeg"``, the frame in base64 (:func:`upload_document`). ``box`` is in
the JPEG's pixels; a classifier's top-1 is a box of the whole frame. A pose model's detection carries its
``keypoints``, each ``[x, y, v]`` in the JPEG's pixels: in the model's ``detections`` ``v`` is the keypoint's
confidence (0..1; a keypoint off the frame is cut to it with 0), in a person's ``labels`` COCO's visibility flag
(0 not labelled, 1 labelled but hidden, 2 labelled and visible); :func:`visibility` reads either as the flag. An
instance-segmentation model's detection carries its mask's outline, ``polygons`` (each ``[[x, y], ...]`` in the
JPEG's pixels, the largest first, at most ``MAX_POLYGONS`` and ``MAX_POLYGON_POINTS`` points in all), an oriented-box
model's its ``rotated_box`` (centre x, centre y, width, height in pixels, the angle in radians).
COCO's 17 keypoints have COCO's names and limbs (``COCO_KEYPOINT_NAMES``, ``COCO_SKELETON``): the device's
drawing, the dashboard's (through the OpenAPI document) and the exports take them from here.

``phash`` is a 64-bit perceptual hash the DEVICE computes (it has the decoded pixels; the fleet manager decodes no
images): two frames whose hashes differ in at most ``DUPLICATE_BITS`` bits are the same static scene, and the
second is not stored again.
Plain constants and small functions: nothing the fleet manager would not load anyway.
"""

from __future__ import annotations

import base64
import re
from collections import Counter
from typing import Any

#: a sample's files: the frame (full size) and what is known about it (written last)
SAMPLE_FRAME_NAME = "frame.jpg"
SAMPLE_META_NAME = "sample.json"
#: the version of ``sample.json``'s fields
SAMPLE_VERSION = 1
#: the rule a request from the dashboard keeps frames under ("sample the next N frames")
REQUEST_RULE = "request"
#: the fields of ``sample.json`` an upload carries (with ``jpeg``); the rest stays on the device
UPLOAD_FIELDS = ("phash", "width", "height", "captured_at", "pipeline", "stream", "rule", "model", "detections",
                 "command_id")

#: a sample id: the device names it (a retry sends the same id again)
SAMPLE_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"
SAMPLE_ID = re.compile(SAMPLE_ID_PATTERN.replace("$", r"\Z"))
#: a perceptual hash: 64 bits as 16 lower-case hex digits
PHASH_PATTERN = r"^[0-9a-f]{16}$"
PHASH = re.compile(PHASH_PATTERN.replace("$", r"\Z"))
#: at most this many differing bits of the hash: the same scene (the usual threshold for a 64-bit pHash)
DUPLICATE_BITS = 5
#: the most detections one sample carries
MAX_DETECTIONS = 1000
#: the longest label (a class name)
MAX_LABEL = 128
#: the most keypoints one detection carries (a model's metadata states at most as many, runtime/metadata.py)
MAX_KEYPOINTS = 1000
#: an instance mask's outline: at most this many polygons (the largest) and this many points in all, simplified to fit
#: (a sample's ``polygons``, an event's, a run's JSON: ``pipeline/postprocess.py`` draws them all the same way)
MAX_POLYGONS = 16
MAX_POLYGON_POINTS = 256
#: a model's keypoint at or above this confidence is seen: drawn (the live view, evidence, the dashboard) and
#: exported as visible; below it, neither (Ultralytics draws from the same confidence)
KEYPOINT_VISIBLE = 0.5
#: COCO's person keypoints, in COCO's (and every COCO-trained pose model's) order
COCO_KEYPOINT_NAMES = (
    "nose", "left_eye", "right_eye", "left_ear", "right_ear", "left_shoulder", "right_shoulder",
    "left_elbow", "right_elbow", "left_wrist", "right_wrist", "left_hip", "right_hip", "left_knee",
    "right_knee", "left_ankle", "right_ankle",
)
#: COCO's 19 limbs: pairs of indices into ``COCO_KEYPOINT_NAMES`` (COCO's own ``skeleton``, which counts from 1)
COCO_SKELETON = ((15, 13), (13, 11), (16, 14), (14, 12), (11, 12), (5, 11), (6, 12), (5, 6), (5, 7), (6, 8),
                 (7, 9), (8, 10), (1, 2), (0, 1), (0, 2), (1, 3), (2, 4), (3, 5), (4, 6))
#: each COCO keypoint's mirror image (left <-> right): Ultralytics' ``flip_idx``, for flipped training images
COCO_FLIP = (0, 2, 1, 4, 3, 6, 5, 8, 7, 10, 9, 12, 11, 14, 13, 16, 15)


def hamming(a: str, b: str) -> int:
    """How many bits two hex hashes of the same length differ in."""
    return (int(a, 16) ^ int(b, 16)).bit_count()


def upload_document(meta: dict[str, Any], jpeg: bytes) -> dict[str, Any]:
    """The JSON an upload sends: ``sample.json``'s ``UPLOAD_FIELDS`` and the frame."""
    document = {name: meta[name] for name in UPLOAD_FIELDS if name in meta}
    document["detections"] = document.get("detections", [])[:MAX_DETECTIONS]
    return {"jpeg": base64.b64encode(jpeg).decode("ascii"), **document}


def keypoint_names(count: int) -> tuple[str, ...]:
    """The names of ``count`` keypoints: COCO's for 17, else ``kp0``, ``kp1`` ... (as the decoders name them)."""
    return COCO_KEYPOINT_NAMES if count == len(COCO_KEYPOINT_NAMES) else tuple(f"kp{i}" for i in range(count))


def skeleton_for(count: int) -> tuple[tuple[int, int], ...]:
    """The limbs joining ``count`` keypoints: COCO's 19 for COCO's 17, none (points alone) for other counts."""
    return COCO_SKELETON if count == len(COCO_KEYPOINT_NAMES) else ()


def keypoint_drawing() -> dict[str, Any]:
    """How keypoints are drawn, for the dashboard (the API's ``Detection`` schema states it): the limbs by keypoint
    count (``x-skeletons``) and the confidence from which a model's keypoint is seen (``x-keypoint-visible``)."""
    return {"x-skeletons": {str(len(COCO_KEYPOINT_NAMES)): [list(pair) for pair in COCO_SKELETON]},
            "x-keypoint-visible": KEYPOINT_VISIBLE}


def visibility(v: float, *, labelled: bool) -> int:
    """A sample's keypoint ``v`` as COCO's flag: a person's label keeps its flag (0, 1, 2); a model's confidence
    is 2 (visible) from ``KEYPOINT_VISIBLE`` on, else 0 (not labelled)."""
    if labelled:
        return min(2, max(0, round(v)))
    return 2 if v >= KEYPOINT_VISIBLE else 0


def total_variation(first: Counter, second: Counter) -> float | None:
    """Output drift: half the L1 distance between two label histograms, each normalised (0 = the same,
    1 = nothing in common; None when either is empty). The canary analysis and the sampling rule both use it."""
    a, b = sum(first.values()), sum(second.values())
    if not a or not b:
        return None
    return 0.5 * sum(abs(first[k] / a - second[k] / b) for k in set(first) | set(second))

"""The form of a captured sample, defined once for the device that keeps and uploads it (``pipeline/sampling.py``,
``agent/sample_upload.py``) and the fleet manager that stores and exports it (``fleet/samples.py``,
``fleet/datasets.py``; docs/datasets.md), and the output drift measure the capture rule and the canary analysis
share.

On the device a sample is a folder named like an event id (``_evidence.new_event_id``: sorts by time, never
collides) holding the frame as the camera gave it (``frame.jpg``, full size) and ``sample.json``, written last (a
folder without it is partial)::

    {"version": 1, "sample_id": "...", "phash": "<16 hex>", "width": 640, "height": 480,
     "captured_at": 1795652031.9, "pipeline": "door", "stream": "", "rule": "uncertain:0.3-0.6",
     "model": {"name": "yolov8n.onnx", "sha256": "<64 hex>", "version": "3"},
     "detections": [{"label": "person", "score": 0.41, "box": [x1, y1, x2, y2]}],
     "frame_id": 812, "source_time": 27.07, "output": <the result's to_dict(): keypoints, masks...>,
     "command_id": "9f1c..."}

``command_id`` (a frame a ``capture`` command asked for — rule ``request`` — only) names that command: the fleet
manager counts, per command, the frames it stored and those it dropped as near-duplicates (``fleet/verdicts.py``).

It is uploaded as one JSON document to ``PUT /api/devices/<device>/samples/<sample id>``: the
``UPLOAD_FIELDS`` of ``sample.json`` and ``"jpeg"``, the frame in base64 (:func:`upload_document`). ``box`` is in
the JPEG's pixels; a classifier's top-1 is a box of the whole frame. ``phash`` is a 64-bit perceptual hash the
DEVICE computes (it has the decoded pixels; the fleet manager decodes no images): two frames whose hashes differ
in at most ``DUPLICATE_BITS`` bits are the same static scene, and the second is not stored again.
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
#: the rule a request from the dashboard keeps frames under ("capture the next N frames")
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


def hamming(a: str, b: str) -> int:
    """How many bits two hex hashes of the same length differ in."""
    return (int(a, 16) ^ int(b, 16)).bit_count()


def upload_document(meta: dict[str, Any], jpeg: bytes) -> dict[str, Any]:
    """The JSON an upload sends: ``sample.json``'s ``UPLOAD_FIELDS`` and the frame."""
    document = {name: meta[name] for name in UPLOAD_FIELDS if name in meta}
    document["detections"] = document.get("detections", [])[:MAX_DETECTIONS]
    return {"jpeg": base64.b64encode(jpeg).decode("ascii"), **document}


def total_variation(first: Counter, second: Counter) -> float | None:
    """Output drift: half the L1 distance between two label histograms, each normalised (0 = the same,
    1 = nothing in common; None when either is empty). The canary analysis and the capture rule both use it."""
    a, b = sum(first.values()), sum(second.values())
    if not a or not b:
        return None
    return 0.5 * sum(abs(first[k] / a - second[k] / b) for k in set(first) | set(second))

"""The form of a captured sample, defined once for the device that captures and uploads it and the fleet
manager that stores and exports it (``fleet/samples.py``, ``fleet/datasets.py``; docs/datasets.md).

A sample is one frame as the camera gave it (a JPEG) and what the model said about it, uploaded as one JSON
document to ``PUT /api/devices/<device>/samples/<sample id>``::

    {"jpeg": "<base64>", "phash": "<16 hex>", "width": 640, "height": 480, "captured_at": 1795652031.9,
     "pipeline": "door", "stream": "", "rule": "detection:0.5/person",
     "model": {"name": "yolov8n", "sha256": "<64 hex>", "version": "3"},
     "detections": [{"label": "person", "score": 0.91, "box": [x1, y1, x2, y2]}]}

``box`` is in the JPEG's pixels. ``phash`` is a 64-bit perceptual hash of the frame the DEVICE computes (it
has the decoded pixels; the fleet manager decodes no images): two frames whose hashes differ in at most
``DUPLICATE_BITS`` bits are the same static scene, and the second is not stored again.
Plain constants and small functions: nothing the fleet manager would not load anyway.
"""

from __future__ import annotations

import re

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

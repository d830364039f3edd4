"""Samples, the fleet's side: devices upload a frame and what the model said about it
(``forms/samples.py``), the manager keeps it in the fleet database once — by id (a retry is answered as stored)
and by scene (a frame whose device-computed perceptual hash is within ``DUPLICATE_BITS`` of one of the
scene's recent samples is not stored again) — within a byte quota and an age (docs/datasets.md).

The manager decodes no image: the hash is the device's (it has the pixels; a pure-Python decode here would
be slow and numpy is not the manager's). It is checked for shape only (16 hex digits).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import logging
import time
from dataclasses import dataclass
from typing import Any

from ..forms.samples import DUPLICATE_BITS, hamming
from .api.sample_schemas import SampleUpload
from .artifacts import UploadTooLarge
from .db import FleetDB
from .db.commands import DUPLICATE, STORED
from .db.samples import Filters

log = logging.getLogger(__name__)

MIB = 1 << 20
DAY_S = 86_400.0


@dataclass(frozen=True)
class SampleLimits:
    """One sample's JPEG, all samples together (the oldest unreviewed go first), and their age."""

    jpeg_bytes: int = 4 * MIB
    total_bytes: int = 4096 * MIB
    max_age_s: float = 90 * DAY_S
    #: how many of a scene's newest samples a new frame is compared with
    dedup_window: int = 50


@dataclass(frozen=True)
class Received:
    """What an upload did: 201 stored, 200 stored already or a duplicate, 409 another sample has the id."""

    status: int
    answer: dict[str, Any]


def decode_jpeg(text: str, limit: int) -> bytes:
    """The upload's JPEG; ValueError when it is not base64 of one whole JPEG, UploadTooLarge past ``limit``."""
    if len(text) * 3 // 4 > limit + 3:
        raise UploadTooLarge(f"the sample's JPEG may be {limit} bytes at most")
    try:
        data = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise ValueError("jpeg must be base64 (RFC 4648, with padding)") from None
    if len(data) > limit:
        raise UploadTooLarge(f"the sample's JPEG may be {limit} bytes at most, not {len(data)}")
    if data[:2] != b"\xff\xd8" or data[-2:] != b"\xff\xd9":
        raise ValueError("jpeg is not a whole JPEG: it must start with FF D8 and end with FF D9")
    return data


def clamped(detections: list[dict], width: int, height: int) -> list[dict]:
    """``detections`` with their boxes cut to the frame: a detector's box may reach past the frame's edge (its
    anchor does), a dataset's may not. So are keypoints, each ``[x, y, v]``: one past the edge is cut to it with
    ``v`` 0 (not seen, not labelled). A detection without keypoints (a mask outline, an oriented box) keeps no key
    for them."""
    out = []
    for detection in detections:
        x1, y1, x2, y2 = detection["box"]
        entry = {**detection, "box": [min(x1, width), min(y1, height), min(x2, width), min(y2, height)]}
        for shape in ("polygons", "rotated_box"):
            if entry.get(shape) is None:
                entry.pop(shape, None)
            elif shape == "polygons":
                entry[shape] = [[[min(x, width), min(y, height)] for x, y in polygon] for polygon in entry[shape]]
        keypoints = entry.pop("keypoints", None)
        if keypoints:
            entry["keypoints"] = [[x, y, v] if x <= width and y <= height else [min(x, width), min(y, height), 0.0]
                                  for x, y, v in keypoints]
        out.append(entry)
    return out


class SampleStore:
    """Samples in the fleet database ``db``."""

    def __init__(self, db: FleetDB, limits: SampleLimits = SampleLimits()) -> None:
        self.rows = db.samples
        self.commands = db.commands
        self.limits = limits

    def receive(self, device_id: str, sample_id: str, upload: SampleUpload) -> Received:
        """Store an upload. ValueError (400) for a JPEG that is not one, UploadTooLarge (413). A sample a command
        asked for (``command_id``) is counted for that command, stored or a near-duplicate, once."""
        received = self._receive(device_id, sample_id, upload)
        if upload.command_id and received.status in (200, 201):
            outcome = DUPLICATE if received.answer.get("duplicate_of") else STORED
            self.commands.count_sample(device_id, sample_id, upload.command_id, outcome)
        return received

    def _receive(self, device_id: str, sample_id: str, upload: SampleUpload) -> Received:
        data = decode_jpeg(upload.jpeg, self.limits.jpeg_bytes)
        sha256 = hashlib.sha256(data).hexdigest()
        answer = {"device_id": device_id, "sample_id": sample_id, "size": len(data), "sha256": sha256}
        stored = self.rows.get(device_id, sample_id)
        if stored is None:
            duplicate = self._duplicate_of(device_id, upload)
            if duplicate is not None:
                return Received(200, {**answer, "duplicate_of": duplicate})
            if self.rows.insert(self._row(device_id, sample_id, upload, data, sha256)) is not None:
                self.prune(keep=(device_id, sample_id))
                return Received(201, answer)
            stored = self.rows.get(device_id, sample_id)  # another upload of it committed first
            assert stored is not None
        status = 200 if stored["sha256"] == sha256 else 409
        return Received(status, {**answer, "size": stored["size"], "sha256": stored["sha256"]})

    def _duplicate_of(self, device_id: str, upload: SampleUpload) -> str | None:
        recent = self.rows.recent_hashes(device_id, upload.pipeline, upload.stream, self.limits.dedup_window)
        return next((sample_id for sample_id, phash in recent if hamming(phash, upload.phash) <= DUPLICATE_BITS),
                    None)

    @staticmethod
    def _row(device_id: str, sample_id: str, upload: SampleUpload, data: bytes, sha256: str) -> dict:
        return {"device_id": device_id, "sample_id": sample_id, "pipeline": upload.pipeline, "stream": upload.stream,
                "rule": upload.rule, "model_name": upload.model.name, "model_sha256": upload.model.sha256,
                "model_version": upload.model.version, "width": upload.width, "height": upload.height,
                "captured_at": upload.captured_at, "size": len(data), "sha256": sha256, "phash": upload.phash,
                "jpeg": data, "labels": None,
                "detections": clamped([d.model_dump() for d in upload.detections], upload.width, upload.height)}

    def prune(self, *, keep: tuple[str, str] | None = None, now: float | None = None) -> int:
        """Apply the age and the quota; how many samples went."""
        now = time.time() if now is None else now
        deleted = self.rows.prune(self.limits.total_bytes, older_than=now - self.limits.max_age_s, keep=keep)
        if deleted:
            log.info("sample retention: deleted %d sample(s) (quota %d bytes, %g days)", deleted,
                     self.limits.total_bytes, self.limits.max_age_s / DAY_S)
        return deleted

    def list(self, filters: Filters, *, limit: int = 100, offset: int = 0) -> list[dict]:
        return self.rows.select(filters, limit=limit, offset=offset)

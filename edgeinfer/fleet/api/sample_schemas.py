"""The models of the samples routes (``samples.py``; docs/datasets.md): a sample's upload and answers, a
person's change, and ``Detection``, a sample's box with its keypoints — the one judge of a box wherever it comes
from (an upload, a PATCH, an import). Requests are strict, every bound a constraint, as in ``fleet/api/schemas.py``."""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, StringConstraints, field_validator

from ...forms.samples import (
    MAX_DETECTIONS,
    MAX_KEYPOINTS,
    MAX_LABEL,
    MAX_POLYGON_POINTS,
    MAX_POLYGONS,
    PHASH_PATTERN,
    keypoint_drawing,
)
from ...link.protocol import COMMAND_ID_PATTERN
from .schemas import PRINTABLE_PATTERN, SHA256_PATTERN, JsonObject, Row, Strict, _integral, or_empty

#: a JPEG of a sample, base64: 4 MiB of JPEG at most (the manager may take less: fleet serve --sample-max-mb)
MAX_SAMPLE_B64 = (4 << 20) * 4 // 3 + 4
#: its format in the document: base64 (RFC 4648, padded) of a whole JPEG, FF D8 ... FF D9 (``samples.decode_jpeg``),
#: what JSON Schema cannot say and the contract test tells its fuzzer about
JPEG_BASE64 = "jpeg-base64"
Coordinate = Annotated[float, Field(ge=0, le=1e6, allow_inf_nan=False, strict=True)]
Label = Annotated[str, StringConstraints(min_length=1, max_length=MAX_LABEL, pattern=PRINTABLE_PATTERN)]
ShortText = Annotated[str, StringConstraints(max_length=128, pattern=PRINTABLE_PATTERN)]
#: x, y in the frame's pixels, v 0..2 (strict numbers in an array: JSON has no tuple, so only the tuple is lax)
Keypoint = Annotated[tuple[Coordinate, Coordinate, Annotated[float, Field(ge=0, le=2, allow_inf_nan=False,
                                                                      strict=True)]], Field(strict=False)]
#: x, y of a mask outline's point in the frame's pixels
Point = Annotated[tuple[Coordinate, Coordinate], Field(strict=False)]
#: a number of an oriented box: its centre, size (pixels) or angle (radians)
Measure = Annotated[float, Field(ge=-1e6, le=1e6, allow_inf_nan=False, strict=True)]


class Detection(Strict):
    """One box: its class, its score (none for a person's label), x1, y1, x2, y2 and a pose model's keypoints, a
    segmentation model's mask outline or an oriented box in the frame's pixels; the document states how the
    dashboard draws keypoints (``forms.samples.keypoint_drawing``)."""

    model_config = ConfigDict(json_schema_extra=keypoint_drawing())

    label: Label
    score: Annotated[float, Field(ge=0, le=1, allow_inf_nan=False)] | None = None
    box: Annotated[list[Coordinate], Field(min_length=4, max_length=4)]
    keypoints: Annotated[list[Keypoint], Field(max_length=MAX_KEYPOINTS, description=(
        "[x, y, v] each in the frame's pixels: v is the model's confidence in detections, COCO's visibility flag "
        "(0 not labelled, 1 hidden, 2 visible) in labels"))] | None = None
    polygons: Annotated[list[Annotated[list[Point], Field(min_length=3, max_length=MAX_POLYGON_POINTS)]],
                        Field(max_length=MAX_POLYGONS, description=(
                            "an instance-segmentation model's mask as its outlines, each [[x, y], ...] in the frame's "
                            "pixels, the largest first"))] | None = None
    rotated_box: Annotated[list[Measure], Field(min_length=5, max_length=5, description=(
        "an oriented-box model's box: centre x, centre y, width, height in the frame's pixels, the angle in "
        "radians"))] | None = None

    @field_validator("box")
    @classmethod
    def _ordered(cls, box: list[float]) -> list[float]:
        """Two corners, whichever first: kept as the top-left and the bottom-right."""
        return [min(box[0], box[2]), min(box[1], box[3]), max(box[0], box[2]), max(box[1], box[3])]


class ModelInfo(Strict):
    name: ShortText = ""
    sha256: Annotated[str, StringConstraints(pattern=or_empty(SHA256_PATTERN))] = ""
    version: ShortText = ""


class SampleUpload(Strict):
    """A sample (``forms/samples.py``): the frame as the camera gave it and what the model said."""

    jpeg: Annotated[str, StringConstraints(min_length=4, max_length=MAX_SAMPLE_B64), Field(json_schema_extra={
        "format": JPEG_BASE64}, description="the frame: a whole JPEG (FF D8 ... FF D9), base64")]
    phash: Annotated[str, StringConstraints(pattern=PHASH_PATTERN)]
    width: Annotated[int, Field(ge=1, le=65535), BeforeValidator(_integral)]
    height: Annotated[int, Field(ge=1, le=65535), BeforeValidator(_integral)]
    captured_at: Annotated[float, Field(ge=0, le=1e11, allow_inf_nan=False)]
    pipeline: Annotated[str, StringConstraints(max_length=64, pattern=PRINTABLE_PATTERN)] = ""
    stream: Annotated[str, StringConstraints(max_length=64, pattern=PRINTABLE_PATTERN)] = ""
    rule: ShortText = ""
    model: ModelInfo = ModelInfo()
    detections: Annotated[list[Detection], Field(max_length=MAX_DETECTIONS)] = []  # noqa: RUF012 - pydantic copies it
    #: the sample command that asked for this frame (rule "request"): the manager counts its frames per command
    command_id: Annotated[str, StringConstraints(pattern=or_empty(COMMAND_ID_PATTERN))] = ""


class SampleStored(BaseModel):
    """What an upload did: stored, stored already (a retry), or not stored as a duplicate of ``duplicate_of``."""

    device_id: str
    sample_id: str
    size: int
    sha256: str
    duplicate_of: str | None = None


class Sample(Row):
    """A stored sample, without its JPEG (``GET .../frame.jpg``)."""

    device_id: str
    sample_id: str
    pipeline: str
    stream: str
    rule: str
    model_name: str
    model_version: str
    width: int
    height: int
    captured_at: float
    detections: list[JsonObject]
    labels: list[JsonObject] | None
    reviewed: bool


class SampleChange(Strict):
    """Mark a sample reviewed (or not), and/or set its corrected labels (null: keep them)."""

    reviewed: bool | None = None
    labels: Annotated[list[Detection], Field(max_length=MAX_DETECTIONS)] | None = None

"""Captured samples and the datasets made of them (``samples.py``, ``datasets.py``; docs/datasets.md).

``PUT /api/devices/{device}/samples/{sample id}``: a device uploads a sample with its own MQTT credential
(HTTP Basic, its own device id only) or an operator's token. Listing, reading and exporting need a viewer
token; marking reviewed, correcting labels, deleting and importing labels an operator's.
"""

from __future__ import annotations

import tempfile
from typing import Annotated, Any

from fastapi import APIRouter, Depends, HTTPException, Path, Query, Request, Response
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel, BeforeValidator, Field, StringConstraints, ValidationError
from starlette.requests import ClientDisconnect

from ..._samples import MAX_KEYPOINTS, SAMPLE_ID_PATTERN
from ...errors import DatasetError
from ...link.protocol import ID_PATTERN
from ..artifacts import UploadTooLarge
from ..datasets import (
    FORMATS,
    IMPORT_FORMATS,
    MAX_IMPORT_BYTES,
    export_zip,
    parse_coco,
    parse_yolo,
    sample_file_pattern,
)
from ..db.samples import Filters
from ..samples import clamped
from ..schemas import PRINTABLE_PATTERN, Strict, _integral, describe_error, or_empty
from .deps import EvidenceUploader, Operator, Services, Viewer
from .responses import binary, errors
from .sample_schemas import Detection, Label, Sample, SampleChange, SampleStored, SampleUpload, ShortText

router = APIRouter(tags=["samples"])
DeviceId = Annotated[str, Path(pattern=ID_PATTERN, description="a device id")]
SampleId = Annotated[str, Path(pattern=SAMPLE_ID_PATTERN, description="a sample id (the device names it)")]
MAX_LIST = 1000
MAX_EXPORT = 20_000
#: the values a filter offers, at most
MAX_FACET = 500
#: a JSON body read whole: its JPEG's limit in base64, and room for the detections
BODY_SLACK = 1 << 20
SAMPLE = "/api/devices/{device_id}/samples/{sample_id}"
ZIP = "application/zip"


async def _body(request: Request, limit: int) -> bytes:
    """The request's body, at most ``limit`` bytes as its Content-Length says (411 / 413 before reading)."""
    length = request.headers.get("content-length")
    if length is None or not length.isdigit():
        raise HTTPException(411, "send the body with a Content-Length")
    if len(length) > 18 or int(length) > limit:
        raise HTTPException(413, f"the body may be {limit} bytes at most")
    try:
        body = await request.body()
    except ClientDisconnect:
        raise HTTPException(400, "the client went away during the upload") from None
    if len(body) > limit:
        raise HTTPException(413, f"the body may be {limit} bytes at most")
    return body


@router.put(SAMPLE, status_code=201, response_model=SampleStored, summary="Upload a captured sample (the device "
            "itself, or operator)", responses={200: {"model": SampleStored, "description": "Stored already (a "
            "retry), or a near-identical frame of the scene is (duplicate_of): not stored again"},
            **errors(400, 401, 403, 409, 411, 413)},
            openapi_extra={"requestBody": {"required": True, "content": {"application/json": {
                "schema": {"$ref": "#/components/schemas/SampleUpload"}}}}},
            description="HTTP Basic with the device's own MQTT credential (its own device id only), or an operator "
                        "token. The body is a SampleUpload (JSON, with a Content-Length). 201 stored; 200 the same "
                        "sample again, or a duplicate of the scene by its perceptual hash; 409 another sample has "
                        "this id.")
async def put_sample(device_id: DeviceId, sample_id: SampleId, request: Request, who: EvidenceUploader,
                     fleet: Services) -> Any:
    body = await _body(request, fleet.samples.limits.jpeg_bytes * 4 // 3 + BODY_SLACK)
    try:
        upload = SampleUpload.model_validate_json(body)
    except ValidationError as exc:
        raise HTTPException(400, describe_error(exc)) from None
    try:
        received = await run_in_threadpool(fleet.samples.receive, device_id, sample_id, upload)
    except UploadTooLarge as exc:
        raise HTTPException(413, str(exc)) from None
    except ValueError as exc:
        raise HTTPException(400, str(exc)) from None
    if received.status == 409:
        return JSONResponse({"error": f"sample {sample_id} of {device_id} is stored already with another frame",
                             **received.answer}, status_code=409)
    if who is not None and received.status == 201:
        await run_in_threadpool(who.audit, "sample.upload", f"{device_id}/{sample_id}", size=received.answer["size"])
    return JSONResponse(received.answer, status_code=received.status)


Text = Annotated[str | None, Query(max_length=128, pattern=or_empty(PRINTABLE_PATTERN))]


def filters(device: Annotated[str | None, Query(pattern=or_empty(ID_PATTERN), description="a device id")] = None,
            pipeline: Text = None, stream: Text = None, model_version: Text = None, rule: Text = None,
            label: Annotated[str | None, Query(max_length=128, pattern=or_empty(PRINTABLE_PATTERN),
                                               description="a class in its labels (or detections)")] = None,
            reviewed: bool | None = None, labelled: bool | None = None) -> Filters:
    """The query's filters; an empty one is no filter."""
    return Filters(device_id=device or None, pipeline=pipeline or None, stream=stream or None,
                   model_version=model_version or None, rule=rule or None, label=label or None, reviewed=reviewed,
                   labelled=labelled)


Labelled = Annotated[bool | None, Query(description="true: only samples with a ground truth — corrected labels, or "
                                                    "reviewed (the model's detections accepted); false: the others")]


@router.get("/api/samples", response_model=list[Sample], responses=errors(400, 401),
            summary="Samples, newest first, filtered (an empty filter is no filter)")
def list_samples(_who: Viewer, fleet: Services, device: Annotated[str | None, Query(pattern=or_empty(ID_PATTERN))]
                 = None, pipeline: Text = None, stream: Text = None, model_version: Text = None, rule: Text = None,
                 label: Text = None, reviewed: bool | None = None, labelled: Labelled = None,
                 limit: Annotated[int, Query(ge=1, le=MAX_LIST)] = 100,
                 offset: Annotated[int, Query(ge=0, le=10_000_000)] = 0) -> Any:
    chosen = filters(device, pipeline, stream, model_version, rule, label, reviewed, labelled)
    return fleet.samples.list(chosen, limit=limit, offset=offset)


class SampleFacets(BaseModel):
    """How many samples the filters select, and the values each filter may take over all samples (what the
    dashboard's filter form offers; a label's spaces are ``_`` as the label filter matches them)."""

    total: int
    devices: list[str]
    pipelines: list[str]
    model_versions: list[str]
    rules: list[str]
    labels: list[str]


@router.get("/api/samples/facets", response_model=SampleFacets, responses=errors(400, 401),
            summary="How many samples the filters select, and each filter's values")
def sample_facets(_who: Viewer, fleet: Services, chosen: Annotated[Filters, Depends(filters)]) -> Any:
    return {"total": fleet.samples.rows.count(chosen), **fleet.samples.rows.facets(MAX_FACET)}


def _sample(fleet: Any, device_id: str, sample_id: str) -> dict:
    row = fleet.samples.rows.get(device_id, sample_id)
    if row is None:
        raise HTTPException(404, f"no sample {sample_id} of device {device_id}")
    return row


@router.get(SAMPLE, response_model=Sample, responses=errors(400, 401, 404), summary="One sample")
def get_sample(device_id: DeviceId, sample_id: SampleId, _who: Viewer, fleet: Services) -> Any:
    return _sample(fleet, device_id, sample_id)


@router.get(SAMPLE + "/frame.jpg", response_class=Response, summary="A sample's frame (JPEG)",
            responses={200: binary("image/jpeg", description="The JPEG as the device sent it"),
                       **errors(400, 401, 404)})
def get_sample_frame(device_id: DeviceId, sample_id: SampleId, _who: Viewer, fleet: Services) -> Response:
    data = fleet.samples.rows.jpeg(device_id, sample_id)
    if data is None:
        raise HTTPException(404, f"no sample {sample_id} of device {device_id}")
    return Response(data, media_type="image/jpeg", headers={"Cache-Control": "private, max-age=86400"})


@router.patch(SAMPLE, response_model=Sample, responses=errors(400, 401, 403, 404),
              summary="Mark a sample reviewed, or set its corrected labels (operator)")
def change_sample(device_id: DeviceId, sample_id: SampleId, change: SampleChange, who: Operator,
                  fleet: Services) -> Any:
    row = _sample(fleet, device_id, sample_id)
    labels = None
    if change.labels is not None:
        labels = clamped([d.model_dump() for d in change.labels], row["width"], row["height"])
    fleet.samples.rows.update(device_id, sample_id, reviewed=change.reviewed, labels=labels)
    who.audit("sample.change", f"{device_id}/{sample_id}", reviewed=change.reviewed, labels=labels is not None)
    return _sample(fleet, device_id, sample_id)


@router.delete(SAMPLE, status_code=204, response_class=Response, responses=errors(400, 401, 403, 404),
               summary="Delete a sample (operator)")
def delete_sample(device_id: DeviceId, sample_id: SampleId, who: Operator, fleet: Services) -> Response:
    if not fleet.samples.rows.delete(device_id, sample_id):
        raise HTTPException(404, f"no sample {sample_id} of device {device_id}")
    who.audit("sample.delete", f"{device_id}/{sample_id}")
    return Response(status_code=204)


@router.get("/api/samples/export", response_class=StreamingResponse, summary="The samples as a dataset (zip)",
            responses={200: binary(ZIP, description="images/ and the format's labels: coco annotations.json, "
                                   "yolo labels/ + data.yaml, label-studio tasks.json"), **errors(400, 401)})
def export_samples(_who: Viewer, fleet: Services,
                   format: Annotated[str, Query(pattern="^(coco|yolo|label-studio)$", description=" | ".join(FORMATS))],
                   device: Annotated[str | None, Query(pattern=or_empty(ID_PATTERN))] = None, pipeline: Text = None,
                   stream: Text = None, model_version: Text = None, rule: Text = None, label: Text = None,
                   reviewed: bool | None = None, labelled: Labelled = None,
                   limit: Annotated[int, Query(ge=1, le=MAX_EXPORT)] = 1000) -> Any:
    chosen = filters(device, pipeline, stream, model_version, rule, label, reviewed, labelled)
    rows = fleet.samples.list(chosen, limit=limit)
    spool = tempfile.SpooledTemporaryFile(max_size=32 << 20)  # noqa: SIM115 - handed to the response, closed there
    try:
        export_zip(rows, format, spool, lambda row: fleet.samples.rows.jpeg(row["device_id"], row["sample_id"]) or b"")
    except DatasetError as exc:  # keypoints the format cannot hold together (two pose models' samples)
        spool.close()
        raise HTTPException(400, str(exc)) from None
    spool.seek(0)

    def chunks() -> Any:
        with spool:
            while data := spool.read(1 << 20):
                yield data

    return StreamingResponse(chunks(), media_type=ZIP, headers={
        "Content-Disposition": f'attachment; filename="samples-{format}.zip"'})


# ------------------------------------------------------------------------------------------------ import
CocoId = Annotated[int, BeforeValidator(_integral)]


class CocoImage(Strict):
    """An image of a COCO document: the sample it is, by its file name as exported."""

    id: CocoId
    file_name: Annotated[str, StringConstraints(pattern=sample_file_pattern(".jpg"))] = Field(
        description="[images/]<device>/<sample>.jpg")


class CocoCategory(Strict):
    id: CocoId
    name: Label
    keypoints: Annotated[list[ShortText], Field(max_length=MAX_KEYPOINTS)] | None = Field(
        None, description="the names of its keypoints: how many an annotation of it has")


#: a number of a COCO box or keypoint: in the frame's pixels (or a keypoint's flag)
CocoNumber = Annotated[float, Field(ge=0, allow_inf_nan=False)]


class CocoAnnotation(Strict):
    """A box of an image: ``bbox`` is x, y, width, height in the frame's pixels."""

    image_id: CocoId = Field(description="the id of an image of this document")
    category_id: CocoId = Field(description="the id of a category of this document")
    bbox: Annotated[list[CocoNumber], Field(min_length=4, max_length=4)]
    keypoints: Annotated[list[CocoNumber], Field(max_length=3 * MAX_KEYPOINTS)] | None = Field(None, description=(
        "x, y, v flat: three numbers a keypoint, v its flag (0 not labelled, 1 hidden, 2 visible), as many keypoints "
        "as its category names"))


class CocoLabels(Strict):
    """Corrected labels as COCO detection (keypoints too): an ``annotations.json`` as exported, edited. Each annotation
    names an image and a category of the document itself, and has as many keypoints as its category names (a
    document where that does not hold is a 400, as JSON Schema cannot say)."""

    images: list[CocoImage]
    categories: list[CocoCategory]
    annotations: list[CocoAnnotation]


ImportFormat = Annotated[str | None, Query(pattern=f"^({'|'.join(IMPORT_FORMATS)})$", deprecated=True, description=(
    " | ".join(IMPORT_FORMATS) + ": what the body is when its Content-Type says neither"))]
#: the bodies this module's routes read themselves (bounded before they are parsed): their models are the document's
READ_BODIES = (SampleUpload, CocoLabels)


@router.post("/api/samples/import", responses=errors(400, 401, 403, 404, 409, 411, 413), openapi_extra={
             "requestBody": {"required": True, "content": {
                 "application/json": {"schema": {"$ref": f"#/components/schemas/{CocoLabels.__name__}"}},
                 ZIP: {"schema": {"type": "string", "format": "binary", "description": "a zip of data.yaml (names) "
                                  "and labels/<device>/<sample>.txt (class cx cy w h, 0..1)"}}}}},
             summary="Import corrected labels: a COCO annotations.json, or a zip of YOLO labels/ and data.yaml "
                     "(operator)", description="The body's Content-Type says which: application/json is COCO, "
                     "application/zip YOLO (format= only for a client that cannot set it). Files are matched to "
                     "samples by name (images/<device>/<sample>.jpg, labels/<device>/<sample>.txt, as exported). "
                     "Everything is checked first, and nothing changes unless all is well: a malformed document is "
                     "a 400, one naming a sample that is not stored a 404, a box outside its sample's frame a 409. "
                     "Each sample named gets the file's boxes as its labels and is marked reviewed.")
async def import_labels(request: Request, who: Operator, fleet: Services,
                        format: ImportFormat = None) -> dict[str, int]:
    body = await _body(request, MAX_IMPORT_BYTES)
    kind = (request.headers.get("content-type") or "").partition(";")[0].strip().lower()
    fmt = {"application/json": "coco", ZIP: "yolo"}.get(kind, format or "coco")
    try:
        changed = await run_in_threadpool(_import, fleet, fmt, body)
    except ValidationError as exc:
        raise HTTPException(400, f"not a COCO detection document: {describe_error(exc)}") from None
    except DatasetError as exc:
        raise HTTPException(400, str(exc)) from None
    except LookupError as exc:
        raise HTTPException(404, str(exc.args[0])) from None
    await run_in_threadpool(who.audit, "sample.import", None, format=fmt, samples=changed)
    return {"samples": changed}


def _import(fleet: Any, fmt: str, body: bytes) -> int:
    """Check every file, then store: ValidationError or DatasetError (400), LookupError (404), HTTPException 409."""
    rows = fleet.samples.rows
    if fmt == "coco":
        CocoLabels.model_validate_json(body)  # what the document says a COCO document is; then what it says
    found = parse_coco(body) if fmt == "coco" else parse_yolo(body, lambda key: _size(rows, key))
    changes = []
    for (device_id, sample_id), labels in sorted(found.items()):
        row = rows.get(device_id, sample_id)
        if row is None:
            raise LookupError(f"{device_id}/{sample_id}: no such sample is stored")
        for label in labels:
            _check_label(label, f"{device_id}/{sample_id}", row["width"], row["height"])
        changes.append((device_id, sample_id, labels))
    return rows.set_labels(changes)


def _check_label(label: dict, where: str, width: int, height: int) -> None:
    """An imported label within its sample's frame (409: the document is well-formed, the sample is smaller) and
    within the bounds an upload's or a PATCH's is (the one model; 400)."""
    if label["box"][2] > width + 0.5 or label["box"][3] > height + 0.5:
        raise HTTPException(409, f"{where}: box {label['box']} is outside the {width}x{height} frame")
    for x, y, _ in label.get("keypoints") or ():
        if x > width + 0.5 or y > height + 0.5:
            raise HTTPException(409, f"{where}: keypoint ({x}, {y}) is outside the {width}x{height} frame")
    try:
        Detection.model_validate(label)
    except ValidationError as exc:
        raise DatasetError(f"{where}: {describe_error(exc)}") from None


def _size(rows: Any, key: tuple[str, str]) -> tuple[int, int] | None:
    row = rows.get(*key)
    return (row["width"], row["height"]) if row else None

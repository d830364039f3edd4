"""The live view (``fleet/liveview.py``): devices post frames while someone watches, viewers read them as MJPEG,
the editor reads the last one, and an operator sends a pipeline its counting lines and zones.

``POST /api/devices/{device}/live/{pipeline}/frames?stream=`` — one JPEG, HTTP Basic with the device's own
credential (its own id only), or an operator's token; 204 while someone watches, 410 when nobody does.
``GET /api/devices/{device}/live/{pipeline}?stream=`` (viewer) — ``multipart/x-mixed-replace``, a JPEG a part,
until the client goes. ``GET .../live/{pipeline}/last.jpg`` (viewer). ``GET | PUT
/api/devices/{device}/pipelines/{pipeline}/analytics`` (viewer | operator).
"""

from __future__ import annotations

import uuid
from typing import Annotated, Any

from fastapi import APIRouter, Header, HTTPException, Path, Query, Request, Response
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import StreamingResponse
from starlette.requests import ClientDisconnect

from ..._regions import task_problem
from ...link.protocol import ID_PATTERN
from ...link.vocabulary import Command
from ..liveview import MAX_FPS, MAX_FRAME_BYTES, MEDIA_TYPE, ViewRequest
from ..schemas import PRINTABLE_PATTERN, AnalyticsSent, AnalyticsSpec, or_empty
from ..verdicts import CommandState
from .command_schemas import Analytics
from .deps import EvidenceUploader, Operator, Services, Viewer
from .responses import Snapshot, binary, binary_body, errors

router = APIRouter(prefix="/api/devices/{device_id}", tags=["live"])
DeviceId = Annotated[str, Path(pattern=ID_PATTERN, description="a device id")]
PipelineName = Annotated[str, Path(min_length=1, max_length=64, pattern=PRINTABLE_PATTERN,
                                   description="a pipeline's name")]
StreamName = Annotated[str, Query(max_length=64, pattern=PRINTABLE_PATTERN,
                                  description="the stream of a multi-stream pipeline (empty: its single source)")]
MEDIA = MEDIA_TYPE.partition(";")[0]
#: X-Frame-Time: seconds, as the agent writes them (f"{t:.6f}"); nothing at all is no time
FRAME_TIME_PATTERN = r"^(-?[0-9]{1,12}(\.[0-9]{1,9})?)?$"


@router.post("/live/{pipeline}/frames", status_code=204, response_class=Response,
             responses={204: {"description": "Stored for the viewers"},
                        410: {"description": "Nobody watches: stop sending (the frame was valid: no refusal, no body)",
                              "content": {}},
                        **errors(400, 401, 403, 413)},
             openapi_extra=binary_body("image/jpeg"), summary="A live frame (the device itself, or operator)",
             description="One JPEG of the pipeline's annotated frames, at most 1 MiB, with X-Frame-Time (its "
                         "capture time, unix seconds) and X-Frame-Id. Nothing is recorded: the newest frame is "
                         "kept for the viewers and the editor.")
async def post_frame(device_id: DeviceId, pipeline: PipelineName, request: Request, _who: EvidenceUploader,
                     fleet: Services, stream: StreamName = "",
                     x_frame_time: Annotated[str, Header(pattern=FRAME_TIME_PATTERN, description=(
                         "capture time, unix seconds, in decimal as the device writes it (0 or less: none)"))]
                     = "",
                     x_frame_id: Annotated[str, Header(max_length=64, pattern=PRINTABLE_PATTERN)] = "",
                     x_source_size: Annotated[str, Header(
                         pattern=or_empty(r"^[1-9][0-9]{0,4}x[1-9][0-9]{0,4}$"),
                         description="the source's WIDTHxHEIGHT: the pixels its boxes, lines and zones are in (the "
                                     "JPEG may be smaller); default: the JPEG's own size")] = "") -> Response:
    body = await _read_frame(request)
    frame_time = float(x_frame_time) if x_frame_time and float(x_frame_time) > 0 else None
    source = tuple(int(v) for v in x_source_size.split("x")) if x_source_size else None
    try:
        watched = await run_in_threadpool(fleet.liveview.receive, (device_id, pipeline, stream), body, frame_time,
                                          x_frame_id or None, source)
    except ValueError as exc:
        raise HTTPException(400, str(exc)) from None
    return Response(status_code=204 if watched else 410)


async def _read_frame(request: Request) -> bytes:
    """The body, at most :data:`MAX_FRAME_BYTES` (413 past it, as announced or as sent)."""
    length = request.headers.get("content-length")
    if length is not None and (not length.isdigit() or len(length) > 12 or int(length) > MAX_FRAME_BYTES):
        raise HTTPException(413, f"a live frame is at most {MAX_FRAME_BYTES} bytes")
    body = bytearray()
    try:
        async for chunk in request.stream():
            body += chunk
            if len(body) > MAX_FRAME_BYTES:
                raise HTTPException(413, f"a live frame is at most {MAX_FRAME_BYTES} bytes")
    except ClientDisconnect:
        raise HTTPException(400, "the client went away during the upload") from None
    if not body:
        raise HTTPException(400, "the body is empty: send one JPEG")
    return bytes(body)


@router.get("/live/{pipeline}", response_class=StreamingResponse,
            responses={200: binary(MEDIA, description=f"{MEDIA_TYPE}: one JPEG a part, with X-Frame-Time and "
                                   "X-Frame-Id part headers, until the client goes"), **errors(400, 401, 404)},
            summary="Watch a pipeline live (MJPEG)",
            description="The first viewer makes the manager send the device a signed live_view command, renewed "
                        "while anyone watches; the device stops by itself about 30 s after the last viewer leaves.")
async def watch(device_id: DeviceId, pipeline: PipelineName, _who: Viewer, fleet: Services, stream: StreamName = "",
                fps: Annotated[float, Query(gt=0, le=MAX_FPS)] = 5.0,
                width: Annotated[int, Query(ge=64, le=4096)] = 640,
                max_kbps: Annotated[int, Query(ge=50, le=100_000)] = 2000) -> StreamingResponse:
    if await run_in_threadpool(fleet.devices.get, device_id) is None:
        raise HTTPException(404, f"no device {device_id}")
    parts = fleet.liveview.watch((device_id, pipeline, stream), ViewRequest(fps, width, max_kbps))
    return StreamingResponse(parts, media_type=MEDIA_TYPE, headers={"Cache-Control": "no-store",
                                                                    "X-Accel-Buffering": "no"})


@router.get("/live/{pipeline}/last.jpg", response_class=Snapshot,
            responses={200: binary("image/jpeg", description="The newest live frame"), **errors(400, 401, 404)},
            summary="The newest live frame of a pipeline (for the editor while live is off)")
def last_frame(device_id: DeviceId, pipeline: PipelineName, _who: Viewer, fleet: Services,
               stream: StreamName = "") -> Response:
    row = fleet.liveview.db.live_frame((device_id, pipeline, stream))
    if row is None:
        raise HTTPException(404, f"no live frame of {device_id}/{pipeline}" + (f" stream {stream}" if stream else ""))
    return Response(bytes(row["jpeg"]), media_type="image/jpeg",
                    headers={"Cache-Control": "no-store", "X-Frame-Time": f"{row['frame_time'] or 0:.6f}",
                             "X-Frame-Size": f"{row['width']}x{row['height']}"})


def _shapes(revision: int | None, lines: dict | None, zones: dict | None, **rest: Any) -> dict:
    """A revision's lines and zones as the PUT takes them (a line as its two points)."""
    return {"revision": revision or 0, "lines": {name: [line[:2], line[2:]] for name, line in (lines or {}).items()},
            "zones": zones or {}, **rest}


@router.get("/pipelines/{pipeline}/analytics", response_model=Analytics, responses=errors(400, 401),
            summary="A pipeline's lines and zones: as last sent, as the device applied them, its last refusal",
            description="sent: the last revision sent (revision 0: none) and state, where its command stands (sent, "
                        "applied, refused, expired); applied: what the device last said it applied (its "
                        "analytics_changed event; revision 0: nothing sent from here yet); refused: the device's "
                        "last refusal of a revision, its reason code and words (null: none).")
def get_analytics(device_id: DeviceId, pipeline: PipelineName, _who: Viewer, fleet: Services,
                  stream: StreamName = "") -> Any:
    row = fleet.liveview.db.analytics((device_id, pipeline, stream)) or {}
    command = fleet.commands.get(row["command_id"]) if row.get("command_id") else None
    return {"sent": _shapes(row.get("revision"), row.get("lines"), row.get("zones"), command_id=row.get("command_id"),
                            at=row.get("updated_at")),
            "state": command["state"] if command is not None else None,
            "applied": _shapes(row.get("applied_revision"), row.get("applied_lines"), row.get("applied_zones"),
                               at=row.get("applied_at")),
            "refused": _last_refusal(fleet, device_id, pipeline, stream)}


def _last_refusal(fleet: Services, device_id: str, pipeline: str, stream: str) -> dict | None:
    """The device's newest refusal of the pipeline's (stream's) lines and zones."""
    for command in fleet.commands.of_device(device_id, cmd=Command.SET_ANALYTICS.value, pipeline=pipeline, limit=50):
        summary = command["summary"]
        if command["state"] == CommandState.REFUSED and (summary.get("stream") or "") == stream:
            return {"revision": summary.get("revision"), "command_id": command["command_id"],
                    "reason": command["reason"], "message": command["message"], "at": command["answered_at"]}
    return None


@router.put("/pipelines/{pipeline}/analytics", status_code=202, response_model=AnalyticsSent,
            responses=errors(400, 401, 403, 404, 409), summary="Send a pipeline its counting lines and zones "
            "(operator)", description="Body: {lines: {name: [[x1, y1], [x2, y2]]}, zones: {name: [[x, y], ...]}, "
            "stream}. Sends a signed set_analytics command with the next revision (lines as [x1, y1, x2, y2]); "
            "the device applies it without a restart and reports analytics_changed, or refuses it. Where it stands: "
            "GET /api/commands/{command_id}, and this pipeline's GET analytics (sent, applied, refused). 409, in the "
            "words the device would refuse them with: a line shorter than a pixel, a zone without area, a line and a "
            "zone of one name, a pipeline whose task (as the device last reported it) gives no boxes, or a point "
            "outside the frame (its size from the last live frame, when there is one).")
def put_analytics(device_id: DeviceId, pipeline: PipelineName, spec: AnalyticsSpec, who: Operator,
                  fleet: Services) -> Any:
    db = fleet.liveview.db
    device = db.get_device(device_id)
    if device is None:
        raise HTTPException(404, f"no device {device_id}")
    refusal = spec.problem() or task_problem(_reported_task(device, pipeline))
    if refusal:
        raise HTTPException(409, refusal)
    size = db.live_frame_size(device_id, pipeline, spec.stream)
    points = [p for line in spec.lines.values() for p in line] + [p for zone in spec.zones.values() for p in zone]
    if size is not None and any(x > size[0] or y > size[1] for x, y in points):
        raise HTTPException(409, f"a point lies outside the {size[0]}x{size[1]} frame")
    lines = spec.device_lines()
    command_id = uuid.uuid4().hex  # the revision names its command: what the device answers is found by it
    revision = db.save_analytics((device_id, pipeline, spec.stream or ""), lines, spec.zones, command_id)
    args = {"pipeline": pipeline, **({"stream": spec.stream} if spec.stream else {}), "lines": lines,
            "zones": spec.zones, "revision": revision}
    try:
        fleet.commands.send(device_id, Command.SET_ANALYTICS, args, command_id=command_id,
                            sent_by=who.principal.name)
    except LookupError as exc:
        raise HTTPException(404, str(exc.args[0])) from None
    who.audit(f"device.{Command.SET_ANALYTICS.value}", f"{device_id}/{pipeline}", **args)
    return AnalyticsSent(command_id=command_id, device_id=device_id, revision=revision, args=args)


def _reported_task(device: dict, pipeline: str) -> str | None:
    """The task the device last said ``pipeline`` runs (its ``state`` message), None when it said none ("auto":
    the model's, before the model is read)."""
    state = device.get("state") if isinstance(device.get("state"), dict) else {}
    entries = state.get("pipelines") if isinstance(state.get("pipelines"), list) else []
    task = next((p.get("task") for p in entries if isinstance(p, dict) and p.get("name") == pipeline), None)
    return task if isinstance(task, str) and task != "auto" else None

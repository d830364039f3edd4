"""Events and their evidence: devices upload an event's snapshot and clip, the dashboard and tools read them
back, play a clip, and list events with their evidence (``evidence.py`` keeps the files; docs/fleet.md,
*Events with evidence*).

``PUT /api/devices/{device}/events/{event id}/snapshot.jpg | clip.mjpeg`` — HTTP Basic with the device's
own MQTT credential (the one its agent connects with), for its own device id only; or a bearer token
with the operator role. ``GET`` of the same paths, ``?play=1`` on a clip and ``GET /api/events`` need a
viewer token.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, HTTPException, Path, Query, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse, StreamingResponse
from starlette.requests import ClientDisconnect

from ...forms.evidence import (
    CLIP_NAME,
    CONTENT_TYPES,
    EVENT_ID_PATTERN,
    MP4_CLIP_NAME,
    PLAIN_SNAPSHOT_NAME,
    SNAPSHOT_NAME,
)
from ...link.protocol import COMMAND_NAME_PATTERN, ID_PATTERN
from ..artifacts import UploadTooLarge
from ..evidence import BOUNDARY
from .deps import EvidenceUploader, Services, Viewer
from .responses import Clip, Mp4Clip, Snapshot, binary, binary_body, errors
from .schemas import Event, EvidenceConflict, EvidenceStored, or_empty

MAX_EVENTS_LIMIT = 1000
#: the longest a Content-Length may be written (past any limit: int() of it would be work for nothing)
MAX_LENGTH_DIGITS = 18
#: a clip played: one JPEG a part (a browser shows it in an <img>)
MULTIPART = "multipart/x-mixed-replace"
PLAYBACK = f"{MULTIPART}; boundary={BOUNDARY}"

router = APIRouter(tags=["events"])
DeviceId = Annotated[str, Path(pattern=ID_PATTERN, description="a device id")]
EventId = Annotated[str, Path(pattern=EVENT_ID_PATTERN, description="an event id (data.event_id of its event)")]
UPLOAD = ("HTTP Basic with the device's own MQTT user name and password (its own device id only), or a bearer "
          "token with the operator role. The body is the file, with a Content-Length (411 without; 413 past the "
          "manager's limit: 4 MiB for a snapshot, 64 MiB for a clip by default). 201 when stored; 200 with the "
          "same answer for the same bytes again (a retry); 409 for other bytes: evidence is immutable.")


def _path(name: str) -> str:
    return f"/api/devices/{{device_id}}/events/{{event_id}}/{name}"


def _upload_route(name: str, what: str) -> None:
    @router.put(_path(name), status_code=201, response_model=EvidenceStored,
                responses={200: {"model": EvidenceStored, "description": "The same bytes were stored already"},
                           409: {"model": EvidenceConflict, "description": "Other bytes are stored under this name"},
                           **errors(400, 401, 403, 411, 413)},
                openapi_extra=binary_body(CONTENT_TYPES[name]), summary=f"Upload an event's {name}: {what} (the "
                f"device itself, or operator)", description=UPLOAD, name=f"put_{name.partition('.')[0]}")
    async def put_evidence(device_id: DeviceId, event_id: EventId, request: Request, who: EvidenceUploader,
                           fleet: Services) -> Any:
        length = request.headers.get("content-length")
        if length is None or not length.isdigit():
            raise HTTPException(411, "send the file with a Content-Length")
        if len(length) > MAX_LENGTH_DIGITS:
            raise HTTPException(413, f"{name} is larger than this manager takes")
        if int(length) == 0:
            raise HTTPException(400, f"the body is empty: send {name}")
        try:
            stored = await fleet.evidence.receive(device_id, event_id, name, request.stream(), expected=int(length))
        except UploadTooLarge as exc:
            raise HTTPException(413, str(exc)) from None
        except (ValueError, ClientDisconnect) as exc:  # not a JPEG, cut short, longer than announced: nothing kept
            raise HTTPException(400, str(exc) or "the client went away during the upload") from None
        if stored.status == 409:
            return JSONResponse({"error": f"{name} of event {event_id} is stored already with other bytes "
                                          f"(sha256 {stored.sha256}): evidence is immutable", **stored.answer()},
                                status_code=409)
        if who is not None and stored.status == 201:
            await run_in_threadpool(who.audit, "evidence.upload", f"{device_id}/{event_id}/{name}", size=stored.size,
                                    sha256=stored.sha256)
        return JSONResponse(stored.answer(), status_code=stored.status)


_upload_route(SNAPSHOT_NAME, "one JPEG (FF D8 … FF D9), the event's frame with what the model saw drawn")
_upload_route(PLAIN_SNAPSHOT_NAME, "one JPEG (FF D8 … FF D9), the event's frame as the camera gave it")
_upload_route(MP4_CLIP_NAME, "H.264 in MP4")
_upload_route(CLIP_NAME, "JPEG frames back to back (MJPEG)")


def _stored(fleet: Services, device_id: str, event_id: str, name: str) -> dict:
    info = fleet.evidence.info(device_id, event_id, name)
    if info is None:
        raise HTTPException(404, f"no {name} for event {event_id} of device {device_id}")
    return info


def _file_headers(info: dict, event_id: str, name: str) -> dict[str, str]:
    return {"Content-Length": str(info["size"]), "ETag": f'"{info["sha256"]}"', "Cache-Control": "private, "
            "max-age=86400", "Content-Disposition": f'inline; filename="{event_id}-{name}"'}


@router.get(_path(SNAPSHOT_NAME), response_class=Snapshot, summary="An event's snapshot.jpg (drawn)",
            responses={200: binary(CONTENT_TYPES[SNAPSHOT_NAME], description="The JPEG"), **errors(400, 401, 404)})
def get_snapshot(device_id: DeviceId, event_id: EventId, _who: Viewer, fleet: Services) -> Snapshot:
    info = _stored(fleet, device_id, event_id, SNAPSHOT_NAME)
    return Snapshot(fleet.evidence.chunks(info), headers=_file_headers(info, event_id, SNAPSHOT_NAME))


@router.get(_path(PLAIN_SNAPSHOT_NAME), response_class=Snapshot, summary=f"An event's {PLAIN_SNAPSHOT_NAME}",
            responses={200: binary(CONTENT_TYPES[PLAIN_SNAPSHOT_NAME], description="The JPEG, nothing drawn"),
                       **errors(400, 401, 404)})
def get_plain_snapshot(device_id: DeviceId, event_id: EventId, _who: Viewer, fleet: Services) -> Snapshot:
    info = _stored(fleet, device_id, event_id, PLAIN_SNAPSHOT_NAME)
    return Snapshot(fleet.evidence.chunks(info), headers=_file_headers(info, event_id, PLAIN_SNAPSHOT_NAME))


@router.get(_path(MP4_CLIP_NAME), response_class=Mp4Clip, summary=f"An event's {MP4_CLIP_NAME}",
            responses={200: binary(CONTENT_TYPES[MP4_CLIP_NAME], description="The clip: H.264 in MP4, what a "
                                   "<video> element plays"), **errors(400, 401, 404)})
def get_mp4_clip(device_id: DeviceId, event_id: EventId, _who: Viewer, fleet: Services) -> Mp4Clip:
    info = _stored(fleet, device_id, event_id, MP4_CLIP_NAME)
    return Mp4Clip(fleet.evidence.chunks(info), headers=_file_headers(info, event_id, MP4_CLIP_NAME))


@router.get(_path(CLIP_NAME), response_class=Clip, summary="An event's clip.mjpeg, or played (?play=1)",
            responses={200: binary(CONTENT_TYPES[CLIP_NAME], MULTIPART, description="The clip; played: "
                                   f"{MULTIPART}, one JPEG a part"), **errors(400, 401, 404)},
            description="?play=1: multipart/x-mixed-replace, one JPEG a part at the clip's own rate (its event's "
                        "frames / duration_s; 5 fps when the event has not arrived), which a browser shows in an "
                        "<img>.")
def get_clip(device_id: DeviceId, event_id: EventId, _who: Viewer, fleet: Services,
             play: Annotated[bool, Query(description="play the clip at its own rate")] = False) -> StreamingResponse:
    info = _stored(fleet, device_id, event_id, CLIP_NAME)
    if play:
        fps = fleet.evidence.fps(info)
        return StreamingResponse(fleet.evidence.play(info, fps), media_type=PLAYBACK,
                                 headers={"Cache-Control": "no-store", "X-Frame-Rate": f"{fps:g}"})
    return Clip(fleet.evidence.chunks(info), headers=_file_headers(info, event_id, CLIP_NAME))


@router.get("/api/events", response_model=list[Event], responses=errors(400, 401),
            summary="Events, newest first, each with its evidence (snapshot, clip, sizes)",
            description="Each event is the device's message with id (its row), device_id and evidence: {event_id, "
                        "snapshot, clip, snapshot_bytes, clip_bytes, frames}. An empty filter is no filter.")
def list_events(_who: Viewer, fleet: Services,
                device: Annotated[str | None, Query(pattern=or_empty(ID_PATTERN), description="a device id")] = None,
                event: Annotated[str | None, Query(pattern=or_empty(COMMAND_NAME_PATTERN),
                                                   description="an event name, e.g. rule_triggered")] = None,
                event_id: Annotated[str | None, Query(pattern=or_empty(EVENT_ID_PATTERN),
                                                      description="an evidence event id")] = None,
                limit: Annotated[int, Query(ge=1, le=MAX_EVENTS_LIMIT)] = 100) -> Any:
    return fleet.evidence.list_events(device_id=device or None, kind=event or None, event_id=event_id or None,
                                      limit=limit)

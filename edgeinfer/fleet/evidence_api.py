"""The evidence routes of the fleet API (``api.py`` adds them): devices upload an event's snapshot and clip,
the dashboard and tools read them back, play a clip, and list events with their evidence.

``PUT /api/devices/{device}/events/{event id}/snapshot.jpg | clip.mjpeg`` — HTTP Basic with the
device's own MQTT credential (the one its agent connects with), for its own device id only; or a
bearer token with the operator role. ``GET`` of the same paths, ``?play=1`` and ``GET /api/events``
need a viewer token. ``evidence.py`` keeps the files; docs/fleet.md, *Events with evidence*.
"""

# no `from __future__ import annotations`: FastAPI reads the routes' annotations at run time (see api.py)
import json
import re
from collections.abc import Callable
from typing import Any

from ..link.protocol import COMMAND_NAME_PATTERN, ID_PATTERN
from .artifacts import UploadTooLarge
from .evidence import BOUNDARY, CLIP_NAME, CONTENT_TYPES, EVENT_ID, FILES, check_path

MAX_EVENTS_LIMIT = 1000
EVIDENCE_PATH = "/api/devices/{device_id}/events/{event_id}/{name}"


def add_evidence_routes(app: Any, api: Any, *, auth: Any, caller: Callable, viewer: Any, error: Callable,
                        audit: Callable, basic_credentials: Callable) -> None:
    """The routes on ``app``. ``api``: the manager (its ``evidence`` store and ``list_events``); ``caller``,
    ``viewer``, ``error``, ``audit`` and ``basic_credentials``: api.py's helpers of the same names."""
    from fastapi import Request
    from fastapi.concurrency import run_in_threadpool
    from fastapi.responses import JSONResponse, StreamingResponse
    from starlette.exceptions import HTTPException
    from starlette.requests import ClientDisconnect

    def store() -> Any:
        evidence = getattr(api, "evidence", None)
        if evidence is None:
            raise HTTPException(404, "not found")
        return evidence

    def uploader(request: Request, device_id: str) -> Any:
        """None for a device uploading under its own id (Basic), the principal of an operator's token;
        HTTPException 401 / 403 otherwise."""
        header = request.headers.get("authorization") or ""
        if header[:6].lower() != "basic ":
            return caller(request, "operator")
        username, password = basic_credentials(header[6:])
        identity = auth.device_identity(username, password) if username is not None else None
        if identity is None:
            raise HTTPException(401, "the device credential is not valid (revoked, or never enrolled)",
                                headers={"WWW-Authenticate": 'Basic realm="edgeinfer evidence"'})
        if identity != device_id:
            raise HTTPException(403, f"this is the credential of device {identity!r}: it uploads evidence under "
                                     f"/api/devices/{identity}/ only")
        return None

    @app.put(EVIDENCE_PATH, status_code=201, summary="Upload an event's snapshot.jpg or clip.mjpeg (the device "
             "itself, or operator)",
             description="HTTP Basic with the device's own MQTT user name and password (its own device id only), "
                         "or a bearer token with the operator role. The body is the file, with a Content-Length "
                         "(411 without; 413 past the manager's limit: 4 MiB for a snapshot, 64 MiB for a clip by "
                         "default). A snapshot is one JPEG (FF D8 … FF D9), a clip JPEG frames back to back "
                         "(MJPEG). 201 {device_id, event_id, file, size, sha256} when stored; 200 with the same "
                         "for the same bytes again (a retry); 409 for other bytes: evidence is immutable.")
    async def put_evidence(device_id: str, event_id: str, name: str, request: Request) -> Any:
        evidence = store()
        who = await run_in_threadpool(uploader, request, device_id)
        refused = check_path(device_id, event_id, name)
        if refused:
            return error(*refused)
        length = request.headers.get("content-length")
        if length is None or not length.isdigit():
            return error(411, "send the file with a Content-Length")
        if len(length) > 18:  # past any limit; int() of it would be work for nothing
            return error(413, f"{name} is larger than this manager takes")
        if int(length) == 0:
            return error(400, f"the body is empty: send {name}")
        try:
            stored = await evidence.receive(device_id, event_id, name, request.stream(), expected=int(length))
        except UploadTooLarge as exc:
            return error(413, str(exc))
        except (ValueError, ClientDisconnect) as exc:  # not a JPEG, cut short, longer than announced: nothing kept
            return error(400, str(exc) or "the client went away during the upload")
        if stored.status == 409:
            return JSONResponse({"error": f"{name} of event {event_id} is stored already with other bytes "
                                          f"(sha256 {stored.sha256}): evidence is immutable", **stored.answer()},
                                status_code=409)
        if who is not None and stored.status == 201:
            await run_in_threadpool(audit, who, request, "evidence.upload", f"{device_id}/{event_id}/{name}",
                                    size=stored.size, sha256=stored.sha256)
        return JSONResponse(stored.answer(), status_code=stored.status)

    @app.get(EVIDENCE_PATH, summary="An event's snapshot.jpg (image/jpeg) or clip.mjpeg (video/x-motion-jpeg)",
             description="?play=1 on clip.mjpeg: multipart/x-mixed-replace, one JPEG a part at the clip's own rate "
                         "(its event's frames / duration_s; 5 fps when the event has not arrived), which a browser "
                         "shows in an <img>.")
    def get_evidence(device_id: str, event_id: str, name: str, play: bool = False, _who: Any = viewer) -> Any:
        evidence = store()
        refused = check_path(device_id, event_id, name)
        if refused:
            return error(*refused)
        info = evidence.info(device_id, event_id, name)
        if info is None:
            return error(404, f"no {name} for event {event_id} of device {device_id}")
        if play:
            if name != CLIP_NAME:
                return error(400, f"play= is for {CLIP_NAME}")
            fps = evidence.fps(info)
            return StreamingResponse(evidence.play(info, fps),
                                     media_type=f"multipart/x-mixed-replace; boundary={BOUNDARY}",
                                     headers={"Cache-Control": "no-store", "X-Frame-Rate": f"{fps:g}"})
        return StreamingResponse(evidence.chunks(info), media_type=CONTENT_TYPES[name], headers={
            "Content-Length": str(info["size"]), "ETag": f'"{info["sha256"]}"',
            "Cache-Control": "private, max-age=86400", "Content-Disposition": f'inline; filename="{event_id}-{name}"'})

    @app.get("/api/events", summary="Events, newest first, each with its evidence (snapshot, clip, sizes)",
             description="Filters: device (a device id), event (an event name, e.g. rule_triggered), event_id (an "
                         f"evidence event id); limit 1..{MAX_EVENTS_LIMIT} (100). Each event is the device's "
                         "message with id (its row), device_id and evidence: {event_id, snapshot, clip, "
                         "snapshot_bytes, clip_bytes, frames}.")
    def events(device: str | None = None, event: str | None = None, event_id: str | None = None, limit: int = 100,
               _who: Any = viewer) -> Any:
        if not 1 <= limit <= MAX_EVENTS_LIMIT:
            return error(400, f"limit must be within 1..{MAX_EVENTS_LIMIT}")
        device, event, event_id = device or None, event or None, event_id or None  # ?device= is no filter
        for what, value, pattern in (("device", device, ID_PATTERN), ("event", event, COMMAND_NAME_PATTERN),
                                     ("event_id", event_id, EVENT_ID.pattern)):
            if value is not None and not re.fullmatch(pattern, value):
                return error(400, f"{what} is not a valid {what.replace('_', ' ')}")
        list_events = getattr(api, "list_events", None)
        if list_events is None:
            return error(404, "not found")
        found = list_events(device_id=device, kind=event, event_id=event_id, limit=limit)
        return JSONResponse(json.loads(json.dumps(found, default=str)))


__all__ = ["EVIDENCE_PATH", "FILES", "add_evidence_routes"]

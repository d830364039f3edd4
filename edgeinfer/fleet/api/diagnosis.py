"""Logs and diagnosis from afar (``fleet/diagnosis.py``): an operator asks a device for its recent log lines or its
doctor's report, the device POSTs them with its own credential, any manager serves them.

Operators only, for reading too: a device's log says where its cameras are, which hosts it talks to and what
failed — more than the dashboard shows a viewer — and asking costs the device work. Secrets are redacted on the
device and again here. ``POST .../logs/request`` and ``POST .../doctor`` (operator; audited when a command goes
out): the signed command, unless one went out very lately or the device is offline (``sent: false``).
``GET .../logs?since=&after=&level=&limit=&follow=`` and ``GET .../doctor`` (operator): what is stored and where the
request stands; ``follow=true`` keeps the device sending new lines while someone reads. ``POST .../logs`` and
``POST .../doctor/report``: the device's answers (HTTP Basic with its own credential, its own id only).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter, Body, HTTPException, Path, Query, Request, Response
from fastapi.concurrency import run_in_threadpool
from pydantic import BaseModel, BeforeValidator, Field, StringConstraints, ValidationError

from ...link.logs import LEVELS, MAX_LOGGER, MAX_MESSAGE, MAX_REPORT_BYTES, MAX_UPLOAD_BYTES, MAX_UPLOAD_LINES
from ...link.protocol import COMMAND_ID_PATTERN, ID_PATTERN, MAX_COUNT, MAX_TS
from ..schemas import PRINTABLE_PATTERN, JsonObject, Strict, _integral, describe_error
from .deps import EvidenceUploader, Operator, Services
from .responses import errors
from .samples import _body

router = APIRouter(prefix="/api/devices/{device_id}", tags=["diagnosis"])
DeviceId = Annotated[str, Path(pattern=ID_PATTERN, description="a device id")]
Level = Literal[tuple(LEVELS)]  # type: ignore[valid-type]
Count = Annotated[int, Field(ge=0, le=MAX_COUNT), BeforeValidator(_integral)]
Time = Annotated[float, Field(ge=0, le=MAX_TS, allow_inf_nan=False)]
CommandId = Annotated[str, StringConstraints(pattern=COMMAND_ID_PATTERN)]
MAX_LIST = 5000


# --------------------------------------------------------------------------------------------- models
class LogLine(Strict):
    """One line as the device's ring keeps it."""

    seq: Annotated[int, Field(ge=1, le=MAX_COUNT), BeforeValidator(_integral)]
    ts: Time
    level: Level
    logger: Annotated[str, StringConstraints(max_length=MAX_LOGGER, pattern=PRINTABLE_PATTERN)]
    message: Annotated[str, StringConstraints(max_length=MAX_MESSAGE)]


class LogUpload(Strict):
    """A batch of a device's lines, of one agent start (``boot_id``), oldest first."""

    boot_id: Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{32}$")]
    command_id: CommandId | None = None
    lines: Annotated[list[LogLine], Field(max_length=MAX_UPLOAD_LINES)]
    dropped: Count = Field(0, description="lines the device's ring let go before they were sent, since it started")
    complete: bool = Field(True, description="false: more lines follow this batch")


class DoctorUpload(Strict):
    """What ``edgeinfer doctor --json`` said on the device, or why it said nothing."""

    command_id: CommandId | None = None
    exit_code: Annotated[int, Field(ge=-1024, le=1024), BeforeValidator(_integral)] | None = None
    duration_s: Annotated[float, Field(ge=0, le=86_400, allow_inf_nan=False)] = 0.0
    ran_at: Time | None = None
    report: JsonObject | None = None
    error: Annotated[str, StringConstraints(max_length=4000)] | None = None


class LogsRequest(Strict):
    follow: bool = Field(False, description="keep sending new lines while someone reads with follow=true")


class Presence(BaseModel):
    device_id: str
    online: bool
    last_seen: float | None = None
    requested_at: float | None = None
    command_id: str | None = None
    received_at: float | None = None
    refused: str | None = Field(None, description="the device's refusal of the last command, if it refused it")


class LogsState(Presence):
    """Where a device's logs stand: asked when, by which command, answered when (complete: the device's newest
    line is here), followed until when."""

    complete: bool | None = None
    dropped: int = 0
    follow_until: float | None = None
    sent: bool = Field(False, description="a command went out for this request (false: offline, or one just did)")


class StoredLine(BaseModel):
    id: int
    boot_id: str
    seq: int
    ts: float
    level: str
    logger: str
    message: str
    received_at: float


class DeviceLogs(LogsState):
    lines: list[StoredLine]
    next: int = Field(description="the after= that asks for the lines stored after these")


class DoctorState(Presence):
    """A device's last doctor request and its result (``report`` is ``edgeinfer doctor --json``'s)."""

    exit_code: int | None = None
    duration_s: float | None = None
    ran_at: float | None = None
    report: JsonObject | None = None
    error: str | None = None
    answered_command_id: str | None = None
    sent: bool = False


class LogsStored(BaseModel):
    device_id: str
    stored: int


#: the bodies these routes read themselves (bounded first): their models are the document's (app.document)
UPLOADS = (LogUpload, DoctorUpload)


def _upload_body(model: type[BaseModel]) -> dict[str, Any]:
    return {"requestBody": {"required": True, "content": {"application/json": {
        "schema": {"$ref": f"#/components/schemas/{model.__name__}"}}}}}


async def _parse(request: Request, model: type[Strict], limit: int) -> Any:
    try:
        return model.model_validate_json(await _body(request, limit))
    except ValidationError as exc:
        raise HTTPException(400, describe_error(exc)) from None


def _found(call: Any, *args: Any, **kwargs: Any) -> Any:
    try:
        return call(*args, **kwargs)
    except LookupError as exc:
        raise HTTPException(404, str(exc.args[0])) from None


# --------------------------------------------------------------------------------------------- logs
@router.post("/logs/request", status_code=202, response_model=LogsState, responses=errors(400, 401, 403, 404),
             summary="Ask a device for its recent log lines (operator)",
             description="Sends the signed logs command (the lines after the newest one stored), unless one went out "
                         "in the last 2 s or the device is offline: sent false, with since when (last_seen). Then "
                         "read GET .../logs until received_at is at or after requested_at.")
def request_logs(device_id: DeviceId, who: Operator, fleet: Services,
                 body: Annotated[LogsRequest | None, Body()] = None) -> Any:
    follow = bool(body and body.follow)
    state = _found(fleet.diagnosis.request_logs, device_id, follow=follow)
    if state["sent"]:
        who.audit("device.logs", device_id, follow=follow, command_id=state["command_id"])
    return state


@router.get("/logs", response_model=DeviceLogs, responses=errors(400, 401, 403, 404),
            summary="A device's log lines as it sent them (operator)",
            description="Oldest first: the newest `limit` lines, or the first `limit` after id `after` (a follower "
                        "passes the answer's `next`). follow=true keeps the device sending new lines (the manager "
                        "renews its request every 10 s while someone reads; the device stops 30 s after the last).")
def get_logs(device_id: DeviceId, _who: Operator, fleet: Services,
             since: Annotated[float | None, Query(ge=0, le=MAX_TS, description="lines written at this unix time or "
                                                                                "later")] = None,
             after: Annotated[int | None, Query(ge=0, le=MAX_COUNT, description="lines stored after this id")] = None,
             level: Annotated[Level | None, Query(description="this level or above")] = None,
             limit: Annotated[int, Query(ge=1, le=MAX_LIST)] = 1000, follow: bool = False) -> Any:
    return _found(fleet.diagnosis.logs, device_id, since=since, after=after, level=level, limit=limit, follow=follow)


@router.post("/logs", response_model=LogsStored, responses=errors(400, 401, 403, 404, 411, 413),
             openapi_extra=_upload_body(LogUpload),
             summary="A device's log lines (the device itself, or operator)",
             description=f"HTTP Basic with the device's own credential (its own id only). A LogUpload: at most "
                         f"{MAX_UPLOAD_LINES} lines and {MAX_UPLOAD_BYTES} bytes; a line stored already (its boot "
                         "and seq) is not stored again. Lines are redacted before they are stored.")
async def post_logs(device_id: DeviceId, request: Request, _who: EvidenceUploader, fleet: Services) -> Any:
    upload = await _parse(request, LogUpload, MAX_UPLOAD_BYTES)
    stored = await run_in_threadpool(_found, fleet.diagnosis.receive_logs, device_id, upload.model_dump())
    return LogsStored(device_id=device_id, stored=stored)


# ------------------------------------------------------------------------------------------- doctor
@router.post("/doctor", status_code=202, response_model=DoctorState, responses=errors(400, 401, 403, 404),
             summary="Run the doctor on a device (operator)",
             description="Sends the signed doctor command, unless one went out in the last 5 s or the device is "
                         "offline (sent false). The device runs `edgeinfer doctor --json` in a subprocess (killed "
                         "after 60 s) and posts its report: read GET .../doctor until received_at is at or after "
                         "requested_at.")
def request_doctor(device_id: DeviceId, who: Operator, fleet: Services) -> Any:
    state = _found(fleet.diagnosis.request_doctor, device_id)
    if state["sent"]:
        who.audit("device.doctor", device_id, command_id=state["command_id"])
    return state


@router.get("/doctor", response_model=DoctorState, responses=errors(400, 401, 403, 404),
            summary="A device's last doctor report (operator)")
def get_doctor(device_id: DeviceId, _who: Operator, fleet: Services) -> Any:
    return _found(fleet.diagnosis.doctor, device_id)


@router.post("/doctor/report", status_code=204, response_class=Response,
             responses={204: {"description": "Stored"}, **errors(400, 401, 403, 404, 411, 413)},
             openapi_extra=_upload_body(DoctorUpload),
             summary="A device's doctor report (the device itself, or operator)",
             description=f"HTTP Basic with the device's own credential (its own id only). A DoctorUpload of at most "
                         f"{MAX_REPORT_BYTES} bytes, kept (redacted) as the device's last.")
async def post_doctor(device_id: DeviceId, request: Request, _who: EvidenceUploader, fleet: Services) -> Response:
    upload = await _parse(request, DoctorUpload, MAX_REPORT_BYTES)
    await run_in_threadpool(_found, fleet.diagnosis.receive_doctor, device_id, upload.model_dump())
    return Response(status_code=204)

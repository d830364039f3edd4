"""What devices did with the commands sent to them (``fleet/verdicts.py``): ``GET /api/commands/{command_id}`` and
``GET /api/devices/{device_id}/commands`` (viewer). Every command the manager sends has a record — sent, applied,
refused with the device's reason, expired — and its changes reach open dashboards on ``/api/stream``
(``commands``)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, HTTPException, Path, Query
from fastapi.concurrency import run_in_threadpool

from ...link.protocol import COMMAND_ID_PATTERN, COMMAND_NAME_PATTERN, ID_PATTERN
from ..db.commands import MAX_LIST
from ..schemas import PRINTABLE_PATTERN, or_empty
from .command_schemas import CommandRecord
from .deps import Services, Viewer
from .responses import errors

router = APIRouter(tags=["commands"])
CommandId = Annotated[str, Path(pattern=COMMAND_ID_PATTERN, description="a command id (what sending it answered)")]
DeviceId = Annotated[str, Path(pattern=ID_PATTERN, description="a device id")]


@router.get("/api/commands/{command_id}", response_model=CommandRecord, responses=errors(400, 401, 404),
            summary="A command and what the device did with it: sent, applied, refused (the device's reason and "
                    "words) or expired; a capture's frames stored and dropped as near-duplicates")
def get_command(command_id: CommandId, _who: Viewer, fleet: Services) -> Any:
    found = fleet.commands.get(command_id)
    if found is None:
        raise HTTPException(404, f"no command {command_id}")
    return found


@router.get("/api/devices/{device_id}/commands", response_model=list[CommandRecord], responses=errors(400, 401, 404),
            summary="A device's commands, newest first, and what it did with each")
async def device_commands(device_id: DeviceId, _who: Viewer, fleet: Services,
                          cmd: Annotated[str | None, Query(pattern=or_empty(COMMAND_NAME_PATTERN),
                                                           description="only this command (set_analytics, capture…)")]
                          = None,
                          pipeline: Annotated[str | None, Query(max_length=64, pattern=or_empty(PRINTABLE_PATTERN),
                                                                description="only the commands for this pipeline")]
                          = None,
                          limit: Annotated[int, Query(ge=1, le=MAX_LIST)] = 100) -> Any:
    if await run_in_threadpool(fleet.commands.db.get_device, device_id) is None:
        raise HTTPException(404, f"no device {device_id}")
    return await run_in_threadpool(fleet.commands.of_device, device_id, cmd=cmd or None, pipeline=pipeline or None,
                                   limit=limit)

"""``/api/devices``: every device, one device, its telemetry, and the commands an operator sends it."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Body, HTTPException, Path, Query

from ...link.protocol import ID_PATTERN
from ...link.vocabulary import Command
from ..schemas import CaptureArgs, CommandSent, Device, DeviceDetail, JsonObject, PipelineArgs, RestartArgs
from .deps import Operator, Services, Viewer
from .responses import errors

MAX_TELEMETRY_LIMIT = 10_000

router = APIRouter(prefix="/api/devices", tags=["devices"])
DeviceId = Annotated[str, Path(pattern=ID_PATTERN, description="a device id")]


@router.get("", response_model=list[Device], responses=errors(401),
            summary="Every device: online, model, delegate, last telemetry")
def list_devices(_who: Viewer, fleet: Services) -> Any:
    return fleet.devices.list()


@router.get("/{device_id}", response_model=DeviceDetail, responses=errors(400, 401, 404),
            summary="One device with its recent events and roll-ups")
def get_device(device_id: DeviceId, _who: Viewer, fleet: Services) -> Any:
    found = fleet.devices.get(device_id)
    if found is None:
        raise HTTPException(404, f"no device {device_id}")
    return found


@router.get("/{device_id}/telemetry", response_model=list[JsonObject], responses=errors(400, 401),
            summary="A device's newest telemetry messages, oldest first")
def device_telemetry(device_id: DeviceId, _who: Viewer, fleet: Services,
                     limit: Annotated[int, Query(ge=1, le=MAX_TELEMETRY_LIMIT)] = 100) -> Any:
    return fleet.devices.telemetry(device_id, limit)


def _send(fleet: Services, who: Operator, device_id: str, cmd: Command, args: dict[str, Any]) -> CommandSent:
    try:
        command_id = fleet.commands.send(device_id, cmd, args, sent_by=who.principal.name)
    except LookupError as exc:
        raise HTTPException(404, str(exc.args[0])) from None
    who.audit(f"device.{cmd.value}", device_id, **args)
    return CommandSent(command_id=command_id, cmd=cmd.value, device_id=device_id, args=args)


@router.post("/{device_id}/rollback", response_model=CommandSent, responses=errors(400, 401, 403, 404),
             summary="Roll a device back to its previous model (operator)",
             description="Body (optional): {\"pipeline\": NAME}. Sends a signed rollback command.")
def rollback(device_id: DeviceId, who: Operator, fleet: Services,
             body: Annotated[PipelineArgs | None, Body()] = None) -> Any:
    args = {"pipeline": body.pipeline} if body is not None and body.pipeline is not None else {}
    return _send(fleet, who, device_id, Command.ROLLBACK, args)


@router.post("/{device_id}/restart", response_model=CommandSent, responses=errors(400, 401, 403, 404),
             summary="Restart one of a device's pipelines (operator)",
             description="Body: {\"pipeline\": NAME}. Sends a signed restart_pipeline command.")
def restart(device_id: DeviceId, body: RestartArgs, who: Operator, fleet: Services) -> Any:
    return _send(fleet, who, device_id, Command.RESTART_PIPELINE, {"pipeline": body.pipeline})


@router.post("/{device_id}/capture", response_model=CommandSent, responses=errors(400, 401, 403, 404),
             summary="Capture the next frames of a pipeline as samples (operator)",
             description="Body: {\"pipeline\": NAME, \"frames\": N (1-1000), \"stream\": \"\" (every stream)}. "
                         "Sends a signed capture command: the device keeps the next N frames with the model's "
                         "output whatever its capture rules say, and uploads them as samples (docs/datasets.md).")
def capture(device_id: DeviceId, body: CaptureArgs, who: Operator, fleet: Services) -> Any:
    args = {"pipeline": body.pipeline, "frames": body.frames, **({"stream": body.stream} if body.stream else {})}
    return _send(fleet, who, device_id, Command.CAPTURE, args)

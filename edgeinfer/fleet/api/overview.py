"""The fleet at a glance and this manager itself: ``/api/overview``, the change feed (``/api/changes``;
``/api/stream`` is its old name, kept as a deprecated alias), ``/api/whoami``, ``/healthz`` and ``/metrics``."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter
from fastapi.responses import PlainTextResponse

from .command_schemas import CommandRecord
from .deps import Services, Viewer
from .responses import EventStream, errors
from .schemas import Deployment, DeploymentDetail, Device, Event, Health, Overview, WhoAmI

router = APIRouter(tags=["overview"])


def _ref(model: type) -> dict[str, Any]:
    return {"$ref": f"#/components/schemas/{model.__name__}"}


def _streamed_event() -> dict[str, Any]:
    """An event as the stream sends it: an :class:`Event` before its evidence is looked up (it has none)."""
    schema = Event.model_json_schema(ref_template="#/components/schemas/{model}")
    schema.pop("$defs", None)
    schema["properties"].pop("evidence")
    schema["required"] = [name for name in schema["required"] if name != "evidence"]
    return {**schema, "title": "StreamedEvent", "description": "A device's events message as it sent it, with its "
            "device_id; its evidence is GET /api/events's (it comes later)"}


def _event(name: str, data: dict[str, Any], what: str) -> dict[str, Any]:
    """One kind of Server-Sent Event: ``event: NAME``, ``data:`` JSON of ``data``'s schema."""
    return {"type": "object", "title": f"{name} event", "description": what, "required": ["event", "data"],
            "properties": {"event": {"const": name}, "data": {"type": "string", "contentMediaType": "application/json",
                                                               "contentSchema": data}}}


#: what GET /api/changes sends: each event as a Server-Sent Events parser gives it ({event, data}: the schema of an
#: event, as OpenAPI 3.1 reads the schema of text/event-stream), its data JSON; a comment (": keep-alive") is none
CHANGE_EVENTS = {"type": "object", "oneOf": [
    _event("overview", _ref(Overview), "The fleet at a glance, when it changed (GET /api/overview)"),
    _event("devices", {"type": "array", "items": _ref(Device)}, "The devices whose rows changed"),
    _event("deployments", {"type": "array", "items": _ref(Deployment)}, "The deployments that moved"),
    _event("deployment", _ref(DeploymentDetail), "A deployment that moved, with every target"),
    _event("events", {"type": "array", "items": _streamed_event()}, "New events, oldest first"),
    _event("commands", {"type": "array", "items": _ref(CommandRecord)}, "Commands whose record changed: sent, "
           "applied, refused, expired (GET /api/commands/{command_id})")]}


@router.get("/api/overview", response_model=Overview, responses=errors(401),
            summary="The fleet at a glance: online/offline/degraded, versions, delegates and fallbacks, "
                    "throttling/hot/backlogged/silent devices, the last events, devices out of step with their "
                    "configuration")
def fleet_overview(_who: Viewer, fleet: Services) -> Any:
    found = fleet.configs.devices()
    return {**fleet.devices.overview(), "config": {"counts": found["counts"], "out_of_step": found["out_of_step"]}}


#: how GET /api/changes (and its old name) answers: the document states the one for both
CHANGES_RESPONSES: dict[int | str, dict[str, Any]] = {
    200: {"description": "Server-Sent Events until the client goes: `event: NAME` and `data: JSON` (below), a comment "
                         "line to keep the connection open when nothing changes",
          "content": {"text/event-stream": {"schema": CHANGE_EVENTS}}}, **errors(401)}


@router.get("/api/changes", response_class=EventStream, responses=CHANGES_RESPONSES,
            summary="The change feed (Server-Sent Events): overview, devices, deployments, deployment, events, "
                    "commands — what changed, about once a second")
def changes(_who: Viewer, fleet: Services) -> EventStream:
    return EventStream(fleet.changes.stream(), headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})


@router.get("/api/stream", response_class=EventStream, responses=CHANGES_RESPONSES, deprecated=True,
            summary="The change feed under its old name (an alias of GET /api/changes, which dashboards and "
                    "clients should read)")
def stream(who: Viewer, fleet: Services) -> EventStream:
    return changes(who, fleet)


@router.get("/healthz", response_model=Health, summary="Liveness (no token needed; says nothing about the fleet)")
def healthz() -> Health:
    return Health(ok=True)


@router.get("/api/whoami", response_model=WhoAmI, responses=errors(401), summary="The calling token's name and role")
def whoami(who: Viewer) -> WhoAmI:
    principal = who.principal
    return WhoAmI(token_id=principal.token_id, name=principal.name, role=principal.role)


@router.get("/metrics", response_class=PlainTextResponse, responses=errors(401),
            summary="Prometheus metrics of this manager (ingest counters, queue, rollouts)")
def metrics(_who: Viewer, fleet: Services) -> PlainTextResponse:
    return PlainTextResponse(fleet.metrics.exposition(), media_type="text/plain; version=0.0.4; charset=utf-8")

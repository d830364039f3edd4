"""The fleet at a glance and this manager itself: ``/api/overview``, the live stream (``/api/stream``),
``/api/whoami``, ``/healthz`` and ``/metrics``."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter
from fastapi.responses import PlainTextResponse

from ..schemas import Health, Overview, WhoAmI
from .deps import Services, Viewer
from .responses import EventStream, errors

router = APIRouter(tags=["overview"])


@router.get("/api/overview", response_model=Overview, responses=errors(401),
            summary="The fleet at a glance: online/offline/degraded, versions, delegates and fallbacks, "
                    "throttling/hot/backlogged/silent devices, the last events, devices out of step with their "
                    "configuration")
def fleet_overview(_who: Viewer, fleet: Services) -> Any:
    found = fleet.configs.devices()
    return {**fleet.devices.overview(), "config": {"counts": found["counts"], "out_of_step": found["out_of_step"]}}


@router.get("/api/stream", response_class=EventStream, responses=errors(401),
            summary="Live updates (Server-Sent Events): overview, devices, deployments, deployment, events — what "
                    "changed, about once a second")
def stream(_who: Viewer, fleet: Services) -> EventStream:
    return EventStream(fleet.live.stream(), headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})


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

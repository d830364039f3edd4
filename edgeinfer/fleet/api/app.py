"""The fleet manager's HTTP API, assembled: one router per resource, the dashboard, the error answers and
the OpenAPI document (``/openapi.json``), which is the contract.

FastAPI because it derives the OpenAPI document from the routes and their pydantic models (nothing to keep
in step by hand) and runs plain ``def`` routes in a thread pool, so the blocking database calls never stall
the event loop. Every refusal is ``{"error": "..."}`` (the CLI reads that key): an invalid request is 400
(not FastAPI's 422) with one line saying which part is wrong; a method a path does not take is 405 with
the methods it does take in ``Allow``.

Every route but ``/healthz`` and the dashboard's files needs a credential (``deps.py``); every change is
written to the audit log with the token's name and the caller's address.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.utils import get_openapi
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException
from starlette.routing import Match

from ..._version import __version__
from . import (
    access,
    artifacts,
    claims,
    commands,
    config,
    deployments,
    devices,
    diagnosis,
    events,
    live_view,
    overview,
    renewal,
    samples,
)
from .deps import FleetServices, Viewer
from .rate_limit import Buckets, RateLimitMiddleware
from .responses import ERROR_CONTENT, REASONS
from .schemas import ErrorBody, describe
from .web import add_dashboard

TITLE = "edgeinfer fleet manager"
DESCRIPTION = ("Devices, telemetry, deployments, configuration, events with their evidence and model artifacts of an "
               "edgeinfer fleet. Every route but /healthz needs a credential: Authorization: Bearer <token> of the "
               "role the route names (viewer < operator < admin), or, for artifacts and evidence uploads, an enrolled "
               "device's MQTT credential. Every refusal is {\"error\": \"...\"}.")
#: in the order a request's path is matched against their routes (route by route, with no index): the routes every
#: device calls unattended come first — provisioning and renewal (claims.router: its other routes match no other
#: router's paths, nor renewal's any) — so that a fleet coming up is not matched against the routes of the
#: dashboard's resources first (71 tried before its own: a quarter of the app's CPU for that request)
ROUTERS = (claims.router, renewal.router, overview.router, devices.router, commands.router, live_view.router,
           deployments.router, artifacts.router, events.router, samples.router, diagnosis.router, config.router,
           access.router)


def error(status: int, message: str, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status, headers=headers)


METHODS = ("DELETE", "GET", "HEAD", "OPTIONS", "PATCH", "POST", "PUT")


def allowed_methods(request: Request) -> str:
    """The methods the request's path takes, over every route of it (a route knows only its own methods, and
    Starlette's 405 names the first route's)."""
    routes = request.app.router.routes
    return ", ".join(method for method in METHODS
                     if any(route.matches({**request.scope, "method": method})[0] == Match.FULL for route in routes))


async def http_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, HTTPException)
    headers = dict(exc.headers or {})
    if exc.status_code == 405:
        headers["Allow"] = allowed_methods(request)
    return error(exc.status_code, str(exc.detail), headers or None)


async def invalid_request(_request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    return error(400, describe(exc.errors()))


def build_app(services: FleetServices) -> FastAPI:
    """The ASGI app serving ``services``."""
    app = FastAPI(title=TITLE, version=__version__, description=DESCRIPTION, docs_url=None, redoc_url=None,
                  openapi_url=None)
    app.state.services = services
    app.add_exception_handler(HTTPException, http_error)
    app.add_exception_handler(RequestValidationError, invalid_request)
    for router in ROUTERS:
        app.include_router(router)

    @app.get("/openapi.json", include_in_schema=False)
    def openapi_document(_who: Viewer) -> JSONResponse:
        return JSONResponse(app.openapi())

    def contract() -> dict[str, Any]:
        if app.openapi_schema is None:
            app.openapi_schema = document(app)
        return app.openapi_schema

    app.openapi = contract  # type: ignore[method-assign]
    add_dashboard(app)
    if services.rate_limit is not None and services.rate_limit.enabled:
        app.add_middleware(RateLimitMiddleware, buckets=Buckets(services.rate_limit))
    return app


def document(app: FastAPI) -> dict[str, Any]:
    """The OpenAPI document: FastAPI's, less the 422 answer it adds to every route with parameters (an invalid
    request is a 400 here, which each route declares), with the refusals' body (``responses.errors``)."""
    schema = get_openapi(title=TITLE, version=__version__, description=DESCRIPTION, routes=app.routes)
    for path in schema["paths"].values():
        for operation in path.values():
            operation["responses"].pop("422", None)
            # the rate limit on what is not authenticated may answer any request (api/rate_limit.py)
            operation["responses"].setdefault("429", {"description": REASONS[429], "content": ERROR_CONTENT})
    components = schema.setdefault("components", {}).setdefault("schemas", {})
    for name in ("HTTPValidationError", "ValidationError"):
        components.pop(name, None)
    components[ErrorBody.__name__] = ErrorBody.model_json_schema()
    # a body a route reads itself (bounded before it is parsed): its model is the document's all the same
    for model in (*samples.READ_BODIES, *diagnosis.UPLOADS, *config.UPLOADS, *claims.UPLOADS):
        body = model.model_json_schema(ref_template="#/components/schemas/{model}")
        for name, definition in body.pop("$defs", {}).items():
            components.setdefault(name, definition)
        components[model.__name__] = body
    return schema

"""The fleet manager's HTTP API as a FastAPI app: JSON routes with an OpenAPI description, artifacts
with Range (Starlette's ``FileResponse``), streamed uploads, ``/metrics``.

FastAPI because it derives the OpenAPI schema from the routes themselves (nothing to keep in step
by hand) and runs plain ``def`` routes in a thread pool, so the blocking database calls of the
manager never stall the event loop. Every error is ``{"error": "..."}``: the CLI reads that key.
"""

# no `from __future__ import annotations`: FastAPI reads the routes' annotations at run time, and the
# types they name (Request) are imported inside build_app, where only real annotations can see them
import logging
from typing import Any, Protocol

from .._version import __version__
from .artifacts import ArtifactStore, UploadTooLarge

log = logging.getLogger(__name__)

MAX_UPLOAD_BYTES = 2 << 30
MAX_TELEMETRY_LIMIT = 10_000


class FleetAPI(Protocol):
    """What the routes ask of the manager (blocking calls; they run in FastAPI's thread pool)."""

    def list_devices(self) -> list[dict]: ...
    def get_device(self, device_id: str) -> dict | None: ...
    def list_deployments(self) -> list[dict]: ...
    def get_deployment(self, deployment_id: str) -> dict | None: ...
    def device_telemetry(self, device_id: str, limit: int) -> list[dict]: ...


def build_app(store: ArtifactStore, api: Any = None, *, max_upload_bytes: int = MAX_UPLOAD_BYTES) -> Any:
    """The ASGI app. ``api`` may be None (artifacts only) or lack the write routes' methods (404)."""
    from fastapi import FastAPI, Request
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import FileResponse, JSONResponse, Response
    from starlette.exceptions import HTTPException
    from starlette.requests import ClientDisconnect

    app = FastAPI(title="edgeinfer fleet manager", version=__version__, docs_url=None, redoc_url=None,
                  description="Devices, telemetry, deployments and model artifacts of an edgeinfer fleet.")

    def error(status: int, message: str) -> JSONResponse:
        return JSONResponse({"error": message}, status_code=status)

    @app.exception_handler(HTTPException)
    async def http_error(_request: Request, exc: HTTPException) -> JSONResponse:
        return error(exc.status_code, str(exc.detail))

    @app.exception_handler(RequestValidationError)
    async def invalid(_request: Request, exc: RequestValidationError) -> JSONResponse:
        first = exc.errors()[0] if exc.errors() else {}
        where = ".".join(str(p) for p in first.get("loc", ()))
        return error(400, f"{where}: {first.get('msg', 'invalid request')}")

    def needs(name: str) -> Any:
        method = getattr(api, name, None)
        if method is None:
            raise HTTPException(404, "not found")
        return method

    @app.get("/healthz", summary="Liveness")
    def healthz() -> dict:
        return {"ok": True}

    @app.head("/artifacts/{sha256}", include_in_schema=False)
    @app.get("/artifacts/{sha256}", summary="A model artifact by sha256",
             description="Honours Range, so agents resume interrupted downloads; HEAD gives its size.")
    def artifact(sha256: str) -> Any:
        path = store.get(sha256)
        if path is None:
            return error(404, f"no artifact {sha256}")
        return FileResponse(path, media_type="application/octet-stream")

    @app.put("/api/artifacts", status_code=201, summary="Upload a model file",
             description="The body is the file, with a Content-Length; answers its sha256 and size. Streamed to "
                         "disk while hashing: a model is never held in memory.")
    async def upload(request: Request) -> Any:
        length = request.headers.get("content-length")
        if length is None or not length.isdigit() or int(length) <= 0:
            return error(411, "send the file with a Content-Length")
        if int(length) > max_upload_bytes:
            return error(413, f"the file is larger than the {max_upload_bytes}-byte limit")
        try:
            sha256, size = await store.receive(request.stream(), expected=int(length), max_bytes=max_upload_bytes)
        except UploadTooLarge as exc:
            return error(413, str(exc))
        except (ValueError, ClientDisconnect) as exc:  # cut short, or longer than announced; nothing was kept
            return error(400, str(exc) or "the client went away during the upload")
        return JSONResponse({"sha256": sha256, "size": size}, status_code=201)

    @app.post("/api/deployments", status_code=201, summary="Start a rollout",
              description="Body: sha256 of an uploaded artifact, version, and devices / group / all, with "
                          "canary_pct, wave_size, abort_failure_rate, device_timeout_s, rollback, pipeline.")
    def create_deployment(spec: dict) -> Any:
        create = needs("create_deployment")
        try:
            return JSONResponse(_jsonable(create(spec)), status_code=201)
        except ValueError as exc:
            return error(400, str(exc))

    @app.get("/api/devices", summary="Every device: online, model, delegate, last telemetry")
    def devices() -> Any:
        return _json(needs("list_devices")())

    @app.get("/api/devices/{device_id}", summary="One device with its recent events and roll-ups")
    def device(device_id: str) -> Any:
        found = needs("get_device")(device_id)
        return _json(found) if found is not None else error(404, f"no device {device_id}")

    @app.get("/api/devices/{device_id}/telemetry", summary="A device's newest telemetry messages, oldest first")
    def telemetry(device_id: str, limit: int = 100) -> Any:
        if not 1 <= limit <= MAX_TELEMETRY_LIMIT:
            return error(400, f"limit must be within 1..{MAX_TELEMETRY_LIMIT}")
        return _json(needs("device_telemetry")(device_id, limit))

    @app.get("/api/deployments", summary="Every deployment with per-state device counts")
    def deployments() -> Any:
        return _json(needs("list_deployments")())

    @app.get("/api/deployments/{deployment_id}", summary="One deployment and every target's state")
    def deployment(deployment_id: str) -> Any:
        found = needs("get_deployment")(deployment_id)
        return _json(found) if found is not None else error(404, f"no deployment {deployment_id}")

    @app.get("/metrics", summary="Prometheus metrics of this manager (ingest counters, queue, rollouts)")
    def metrics() -> Any:
        return Response(needs("metrics")(), media_type="text/plain; version=0.0.4; charset=utf-8")

    return app


def _jsonable(value: Any) -> Any:
    import json

    return json.loads(json.dumps(value, default=str))


def _json(value: Any) -> Any:
    from fastapi.responses import JSONResponse

    return JSONResponse(_jsonable(value))

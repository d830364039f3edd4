"""The fleet manager's HTTP API as a FastAPI app: JSON routes with an OpenAPI description, artifacts
with Range (Starlette's ``FileResponse``), streamed uploads, ``/metrics``.

FastAPI because it derives the OpenAPI schema from the routes themselves (nothing to keep in step
by hand) and runs plain ``def`` routes in a thread pool, so the blocking database calls of the
manager never stall the event loop. Every error is ``{"error": "..."}``: the CLI reads that key.

Every route but ``/healthz`` needs a token (``Authorization: Bearer``, see ``auth.py``): 401
without a usable one, 403 when its role is too low. Artifacts also open to an enrolled device's
MQTT credential (HTTP Basic), so devices download without an API token; so do the uploads of an event's
evidence (``evidence_api.py``), each device under its own id only. Every change is written
to the audit log with the token's name and the caller's address.
"""

# no `from __future__ import annotations`: FastAPI reads the routes' annotations at run time, and the
# types they name (Request) are imported inside build_app, where only real annotations can see them
import logging
from pathlib import Path
from typing import Any, Protocol

from .._version import __version__
from .artifacts import ArtifactStore, UploadTooLarge
from .auth import AuthError, Principal

log = logging.getLogger(__name__)

MAX_UPLOAD_BYTES = 2 << 30
MAX_TELEMETRY_LIMIT = 10_000
MAX_AUDIT_LIMIT = 10_000
MAX_ENROLL_BATCH = 10_000


class FleetAPI(Protocol):
    """What the routes ask of the manager (blocking calls; they run in FastAPI's thread pool)."""

    def list_devices(self) -> list[dict]: ...
    def get_device(self, device_id: str) -> dict | None: ...
    def list_deployments(self) -> list[dict]: ...
    def get_deployment(self, deployment_id: str) -> dict | None: ...
    def device_telemetry(self, device_id: str, limit: int) -> list[dict]: ...
    def overview(self) -> dict: ...
    def list_events(self, *, device_id: str | None, kind: str | None, event_id: str | None,
                    limit: int) -> list[dict]: ...


class Authenticator(Protocol):
    """Who is calling: a token's principal (AuthError otherwise), or an enrolled device (artifacts, evidence)."""

    def authenticate(self, authorization: str | None) -> Principal: ...
    def device_login(self, username: str, password: str) -> bool: ...
    def device_identity(self, username: str, password: str) -> str | None: ...
    def grant_allows(self, grant: str, sha256: str) -> bool: ...


def build_app(store: ArtifactStore, api: Any = None, *, auth: Authenticator, access: Any = None,
              max_upload_bytes: int = MAX_UPLOAD_BYTES) -> Any:
    """The ASGI app. ``api`` (devices, deployments, commands) and ``access`` (tokens, enrolment, the audit
    log: ``FleetAccess``) may be None or lack some routes' methods: those routes answer 404."""
    from fastapi import Depends, FastAPI, Request
    from fastapi.concurrency import run_in_threadpool
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import FileResponse, JSONResponse, Response
    from starlette.exceptions import HTTPException
    from starlette.requests import ClientDisconnect

    app = FastAPI(title="edgeinfer fleet manager", version=__version__, docs_url=None, redoc_url=None,
                  openapi_url=None,
                  description="Devices, telemetry, deployments and model artifacts of an edgeinfer fleet. "
                              "Every route but /healthz needs Authorization: Bearer <token>.")

    def error(status: int, message: str, headers: dict | None = None) -> JSONResponse:
        return JSONResponse({"error": message}, status_code=status, headers=headers)

    @app.exception_handler(HTTPException)
    async def http_error(_request: Request, exc: HTTPException) -> JSONResponse:
        return error(exc.status_code, str(exc.detail), getattr(exc, "headers", None))

    @app.exception_handler(RequestValidationError)
    async def invalid(_request: Request, exc: RequestValidationError) -> JSONResponse:
        first = exc.errors()[0] if exc.errors() else {}
        where = ".".join(str(p) for p in first.get("loc", ()))
        return error(400, f"{where}: {first.get('msg', 'invalid request')}")

    def caller(request: Request, role: str) -> Principal:
        try:
            principal = auth.authenticate(request.headers.get("authorization"))
        except AuthError as exc:
            raise HTTPException(exc.status, str(exc),
                                headers={"WWW-Authenticate": 'Bearer realm="edgeinfer"'}) from None
        if not principal.may(role):
            raise HTTPException(403, f"the token {principal.name!r} is a {principal.role}; this needs {role}")
        return principal

    def needs_role(role: str) -> Any:
        def dependency(request: Request) -> Principal:  # a plain def: the database lookup runs in the thread pool
            return caller(request, role)
        return Depends(dependency)

    viewer, operator, admin = needs_role("viewer"), needs_role("operator"), needs_role("admin")

    def needs(name: str, of: Any = api) -> Any:
        method = getattr(of, name, None)
        if method is None:
            raise HTTPException(404, "not found")
        return method

    def admin_needs(name: str) -> Any:
        return needs(name, access)

    def entry(principal: Principal, request: Request, action: str, target: str | None, **detail: Any) -> dict:
        remote = request.client.host if request.client else None
        return {"actor": principal.name, "role": principal.role, "action": action, "target": target,
                "remote": remote, "detail": detail}

    def audit(principal: Principal, request: Request, action: str, target: str | None, **detail: Any) -> None:
        record = getattr(access, "record_audit", None)
        if record is not None:
            record(entry(principal, request, action, target, **detail))

    def changed(principal: Principal, request: Request, action: str, target: str | None, result: Any,
                status: int = 200, **detail: Any) -> JSONResponse:
        audit(principal, request, action, target, **detail)
        return JSONResponse(_jsonable(result), status_code=status)

    _dashboard(app, error)

    @app.get("/api/overview", summary="The fleet at a glance: online/offline/degraded, versions, delegates and "
             "fallbacks, throttling/hot/backlogged/silent devices, the last events")
    def fleet_overview(_who: Principal = viewer) -> Any:
        return _json(needs("overview")())

    @app.get("/api/stream", summary="Live updates (Server-Sent Events): overview, devices, deployments, "
             "deployment, events — what changed, about once a second")
    def stream(_who: Principal = viewer) -> Any:
        from fastapi.responses import StreamingResponse

        feed = getattr(api, "live", None)
        if feed is None:
            return error(404, "not found")
        return StreamingResponse(feed.stream(), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})

    @app.get("/healthz", summary="Liveness (no token needed; says nothing about the fleet)")
    def healthz() -> dict:
        return {"ok": True}

    @app.get("/openapi.json", include_in_schema=False)
    def openapi(_who: Principal = viewer) -> Any:
        return JSONResponse(app.openapi())

    @app.get("/api/whoami", summary="The calling token's name and role")
    def whoami(who: Principal = viewer) -> Any:
        return {"token_id": who.token_id, "name": who.name, "role": who.role}

    def artifact_reader(request: Request, sha256: str) -> None:
        """A download grant for this artifact, an enrolled device's MQTT credential (Basic), or a viewer token."""
        grant = request.query_params.get("grant")
        if grant is not None:
            if auth.grant_allows(grant, sha256):
                return
            raise HTTPException(401, "the download grant is not valid for this artifact (expired, or forged)")
        header = request.headers.get("authorization") or ""
        if header[:6].lower() == "basic ":
            username, password = _basic_credentials(header[6:])
            if username is not None and auth.device_login(username, password):
                return
            raise HTTPException(401, "the device credential is not valid (revoked, or never enrolled)",
                                headers={"WWW-Authenticate": 'Basic realm="edgeinfer artifacts"'})
        caller(request, "viewer")

    @app.head("/artifacts/{sha256}", include_in_schema=False)
    @app.get("/artifacts/{sha256}", summary="A model artifact by sha256",
             description="Honours Range, so agents resume interrupted downloads; HEAD gives its size. Open to a "
                         "viewer token, to an enrolled device with its MQTT user name and password (Basic), or "
                         "with ?grant= from a deploy command (a short-lived signed URL).")
    def artifact(sha256: str, _ok: None = Depends(artifact_reader)) -> Any:
        path = store.get(sha256)
        if path is None:
            return error(404, f"no artifact {sha256}")
        return FileResponse(path, media_type="application/octet-stream")

    @app.put("/api/artifacts", status_code=201, summary="Upload a model file (operator)",
             description="The body is the file, with a Content-Length; answers its sha256 and size. Streamed to "
                         "disk while hashing: a model is never held in memory.")
    async def upload(request: Request, who: Principal = operator) -> Any:
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
        await run_in_threadpool(audit, who, request, "artifact.upload", sha256, size=size)
        return JSONResponse({"sha256": sha256, "size": size}, status_code=201)

    @app.post("/api/deployments", status_code=201, summary="Start a rollout (operator)",
              description="Body: sha256 of an uploaded artifact, version, and devices / group / all, with "
                          "canary_pct, wave_size, abort_failure_pct (0-100; or abort_failure_rate, a fraction), "
                          "device_timeout_s, rollback, pipeline; the "
                          "canary analysis: canary_analysis (true), canary_window_s (300), canary_min_windows (5), "
                          "max_latency_regression (50 %), max_fps_drop (25 %), max_output_drift (0.2), "
                          "max_error_rate (10 points). docs/fleet.md, Canary analysis.")
    def create_deployment(spec: dict, request: Request, who: Principal = operator) -> Any:
        create = needs("create_deployment")
        try:
            created = create(spec)
        except ValueError as exc:
            return error(400, str(exc))
        return changed(who, request, "deployment.create", created["deployment_id"], created, 201,
                       model_name=created.get("model_name"), version=created.get("version"),
                       sha256=created.get("sha256"), devices=len(created.get("devices") or []))

    @app.post("/api/deployments/{deployment_id}/abort", summary="Stop a running rollout: no later wave (operator)")
    def abort(deployment_id: str, request: Request, who: Principal = operator) -> Any:
        try:
            result = needs("abort_deployment")(deployment_id, f"aborted by {who.name}")
        except LookupError as exc:
            return error(404, str(exc.args[0]))
        except ValueError as exc:
            return error(409, str(exc))
        return changed(who, request, "deployment.abort", deployment_id, result)

    @app.post("/api/devices/{device_id}/rollback", summary="Roll a device back to its previous model (operator)",
              description="Body (optional): {\"pipeline\": NAME}. Sends a signed rollback command.")
    def rollback(device_id: str, request: Request, body: dict | None = None, who: Principal = operator) -> Any:
        return _command(device_id, request, who, "rollback", _pipeline_args(body, required=False))

    @app.post("/api/devices/{device_id}/restart", summary="Restart one of a device's pipelines (operator)",
              description="Body: {\"pipeline\": NAME}. Sends a signed restart_pipeline command.")
    def restart(device_id: str, request: Request, body: dict | None = None, who: Principal = operator) -> Any:
        return _command(device_id, request, who, "restart_pipeline", _pipeline_args(body, required=True))

    def _command(device_id: str, request: Request, who: Principal, cmd: str, args: dict | str) -> Any:
        if isinstance(args, str):
            return error(400, args)
        try:
            command_id = needs("device_command")(device_id, cmd, args)
        except LookupError as exc:
            return error(404, str(exc.args[0]))
        return changed(who, request, f"device.{cmd}", device_id, {"command_id": command_id, "cmd": cmd,
                                                                  "device_id": device_id, "args": args}, **args)

    @app.get("/api/devices", summary="Every device: online, model, delegate, last telemetry")
    def devices(_who: Principal = viewer) -> Any:
        return _json(needs("list_devices")())

    @app.get("/api/devices/{device_id}", summary="One device with its recent events and roll-ups")
    def device(device_id: str, _who: Principal = viewer) -> Any:
        found = needs("get_device")(device_id)
        return _json(found) if found is not None else error(404, f"no device {device_id}")

    @app.get("/api/devices/{device_id}/telemetry", summary="A device's newest telemetry messages, oldest first")
    def telemetry(device_id: str, limit: int = 100, _who: Principal = viewer) -> Any:
        if not 1 <= limit <= MAX_TELEMETRY_LIMIT:
            return error(400, f"limit must be within 1..{MAX_TELEMETRY_LIMIT}")
        return _json(needs("device_telemetry")(device_id, limit))

    @app.get("/api/deployments", summary="Every deployment with per-state device counts")
    def deployments(_who: Principal = viewer) -> Any:
        return _json(needs("list_deployments")())

    @app.get("/api/deployments/{deployment_id}", summary="One deployment and every target's state")
    def deployment(deployment_id: str, _who: Principal = viewer) -> Any:
        found = needs("get_deployment")(deployment_id)
        return _json(found) if found is not None else error(404, f"no deployment {deployment_id}")

    @app.get("/api/tokens", summary="Every API token (never the token itself) (admin)")
    def tokens(_who: Principal = admin) -> Any:
        return _json(admin_needs("list_tokens")())

    @app.post("/api/tokens", status_code=201, summary="Create a token; the answer is the only time it is shown "
              "(admin)", description="Body: {\"name\": N, \"role\": viewer|operator|admin, \"expires_s\": seconds}.")
    def create_token(body: dict, request: Request, who: Principal = admin) -> Any:
        expires = body.get("expires_s")
        if expires is not None and (isinstance(expires, bool) or not isinstance(expires, (int, float))):
            return error(400, "expires_s must be a number of seconds")
        try:
            created = admin_needs("create_token")(name=body.get("name"), role=body.get("role"), expires_in_s=expires,
                                            created_by=who.name)
        except ValueError as exc:
            return error(400, str(exc))
        return changed(who, request, "token.create", created["token_id"], created, 201, name=created["name"],
                       role=created["role"], expires_at=created["expires_at"])

    @app.delete("/api/tokens/{token_id}", summary="Revoke a token (admin)")
    def revoke_token(token_id: str, request: Request, who: Principal = admin) -> Any:
        try:
            revoked = admin_needs("revoke_token")(token_id)
        except LookupError as exc:
            return error(404, str(exc.args[0]))
        return changed(who, request, "token.revoke", token_id, revoked, name=revoked["name"])

    @app.get("/api/enrollments", summary="Every enrolled device's MQTT account (no passwords) (admin)")
    def enrollments(_who: Principal = admin) -> Any:
        return _json(admin_needs("list_enrollments")())

    @app.post("/api/devices/{device_id}/enroll", summary="Issue a device's MQTT credential (admin)",
              description="Body (optional): {\"fleet\": F}. Answers what goes into the device's agent.yaml; the "
                          "password is shown only here. Enrolling again issues a new password.")
    def enroll(device_id: str, request: Request, body: dict | None = None, who: Principal = admin) -> Any:
        try:
            fleet = {"fleet": body["fleet"]} if body and "fleet" in body else {}
            issued = admin_needs("enroll_device")(device_id, **fleet)
        except ValueError as exc:
            return error(400, str(exc))
        return changed(who, request, "device.enroll", device_id, issued, 201, fleet=issued.get("fleet"))

    @app.post("/api/enrollments", status_code=201, summary="Enrol many devices with one broker reload (admin)",
              description="Body: {\"fleet\": F, \"devices\": [ids]} (at most 10,000). Answers a list, each entry "
                          "what /api/devices/{id}/enroll answers.")
    def enroll_many(body: dict, request: Request, who: Principal = admin) -> Any:
        devices = body.get("devices")
        if not isinstance(devices, list) or not 1 <= len(devices) <= MAX_ENROLL_BATCH:
            return error(400, f"devices must be a list of 1..{MAX_ENROLL_BATCH} device ids")
        try:
            issued = admin_needs("enroll_devices")(devices, **({"fleet": body["fleet"]} if "fleet" in body else {}))
        except ValueError as exc:
            return error(400, str(exc))
        admin_needs("record_audit")(*(entry(who, request, "device.enroll", e["device_id"], fleet=e["fleet"])
                                      for e in issued))
        return JSONResponse(_jsonable(issued), status_code=201)

    @app.post("/api/devices/{device_id}/revoke", summary="Revoke a device's MQTT credential: it can no longer "
              "connect or download (admin)")
    def revoke_device(device_id: str, request: Request, who: Principal = admin) -> Any:
        try:
            result = admin_needs("revoke_device")(device_id)
        except LookupError as exc:
            return error(404, str(exc.args[0]))
        return changed(who, request, "device.revoke", device_id, result)

    @app.get("/api/audit", summary="The audit log, newest last: who, what, when, from where (admin)")
    def audit_log(limit: int = 100, _who: Principal = admin) -> Any:
        if not 1 <= limit <= MAX_AUDIT_LIMIT:
            return error(400, f"limit must be within 1..{MAX_AUDIT_LIMIT}")
        return _json(admin_needs("list_audit")(limit))

    @app.get("/metrics", summary="Prometheus metrics of this manager (ingest counters, queue, rollouts)")
    def metrics(_who: Principal = viewer) -> Any:
        return Response(needs("metrics")(), media_type="text/plain; version=0.0.4; charset=utf-8")

    from .evidence_api import add_evidence_routes

    add_evidence_routes(app, api, auth=auth, caller=caller, viewer=viewer, error=error, audit=audit,
                        basic_credentials=_basic_credentials)
    return app


#: the dashboard's static files (``fleet/web``): public — every figure they show comes from the token-checked API
WEB = Path(__file__).parent / "web"
#: no script or style from anywhere but here, no framing, no referrer leaving the page; images may also be blob:
#: URLs (evidence the page fetched with its token: an <img src> cannot send the Authorization header)
SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; img-src 'self' data: blob:; style-src 'self'; "
                               "frame-ancestors 'none'; base-uri 'none'; form-action 'self'",
    "X-Content-Type-Options": "nosniff", "Referrer-Policy": "no-referrer", "X-Frame-Options": "DENY",
}


class SecurityHeaders:
    """Pure ASGI middleware adding SECURITY_HEADERS to every response (Starlette's BaseHTTPMiddleware would
    buffer the live stream's frames behind its own task)."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.headers = [(k.lower().encode(), v.encode()) for k, v in SECURITY_HEADERS.items()]

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_with_headers(message: dict) -> None:
            if message["type"] == "http.response.start":
                present = {name for name, _ in message.get("headers", [])}
                message["headers"] = [*message.get("headers", []), *(h for h in self.headers if h[0] not in present)]
            await send(message)

        await self.app(scope, receive, send_with_headers)


def _dashboard(app: Any, error: Any) -> None:
    """``/`` (the page) and ``/static/...`` (its scripts, styles, the vendored chart library)."""
    from fastapi.responses import FileResponse
    from fastapi.staticfiles import StaticFiles

    app.add_middleware(SecurityHeaders)

    @app.get("/", include_in_schema=False)
    def index() -> Any:
        page = WEB / "index.html"
        if not page.is_file():
            return error(404, "the dashboard is not installed (edgeinfer/fleet/web)")
        return FileResponse(page, media_type="text/html", headers={"Cache-Control": "no-cache"})

    if (WEB / "static").is_dir():
        app.mount("/static", StaticFiles(directory=WEB / "static"), name="static")


def _basic_credentials(encoded: str) -> tuple[str | None, str]:
    import base64
    import binascii

    try:
        username, sep, password = base64.b64decode(encoded.strip(), validate=True).decode("utf-8").partition(":")
    except (binascii.Error, UnicodeDecodeError, ValueError):
        return None, ""
    return (username, password) if sep and username else (None, "")


def _pipeline_args(body: dict | None, *, required: bool) -> dict | str:
    """The command's args from a request body, or what is wrong with it."""
    pipeline = (body or {}).get("pipeline")
    if pipeline is None:
        return "pipeline is required" if required else {}
    if not isinstance(pipeline, str) or not 1 <= len(pipeline) <= 64:
        return "pipeline must be a name of 1-64 characters"
    return {"pipeline": pipeline}


def _jsonable(value: Any) -> Any:
    import json

    return json.loads(json.dumps(value, default=str))


def _json(value: Any) -> Any:
    from fastapi.responses import JSONResponse

    return JSONResponse(_jsonable(value))

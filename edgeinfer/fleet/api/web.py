"""The dashboard: ``/`` (the page) and ``/static/...`` (its scripts, styles, the vendored chart library), and
the security headers every answer carries. Public — every figure the page shows comes from the token-checked
API; not part of the OpenAPI document."""

from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter, FastAPI, HTTPException
from fastapi.responses import FileResponse
from fastapi.staticfiles import StaticFiles
from starlette.types import ASGIApp, Message, Receive, Scope, Send

#: the dashboard's static files (``fleet/web``)
WEB = Path(__file__).resolve().parents[1] / "web"
#: no script or style from anywhere but here, no framing, no referrer leaving the page; images and media (an MP4
#: clip in a <video>) may also be blob: URLs (evidence the page fetched with its token: an <img src> or <video src>
#: cannot send the Authorization header)
SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; img-src 'self' data: blob:; media-src 'self' blob:; "
                               "style-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'self'",
    "X-Content-Type-Options": "nosniff", "Referrer-Policy": "no-referrer", "X-Frame-Options": "DENY",
}

router = APIRouter(include_in_schema=False)


@router.get("/")
def index() -> FileResponse:
    page = WEB / "index.html"
    if not page.is_file():
        raise HTTPException(404, "the dashboard is not installed (edgeinfer/fleet/web)")
    return FileResponse(page, media_type="text/html", headers={"Cache-Control": "no-cache"})


class SecurityHeaders:
    """Pure ASGI middleware adding SECURITY_HEADERS to every response (Starlette's BaseHTTPMiddleware would
    buffer the change feed's frames behind its own task)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self.headers = [(k.lower().encode(), v.encode()) for k, v in SECURITY_HEADERS.items()]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                present = {name for name, _ in message.get("headers", [])}
                message["headers"] = [*message.get("headers", []), *(h for h in self.headers if h[0] not in present)]
            await send(message)

        await self.app(scope, receive, send_with_headers)


def add_dashboard(app: FastAPI) -> None:
    """The page, its static files and the security headers."""
    app.add_middleware(SecurityHeaders)
    app.include_router(router)
    if (WEB / "static").is_dir():
        app.mount("/static", StaticFiles(directory=WEB / "static"), name="static")

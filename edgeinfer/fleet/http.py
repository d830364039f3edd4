"""The fleet manager's HTTP server: model artifacts (with Range) and a JSON API."""

from __future__ import annotations

import json
import logging
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Protocol
from urllib.parse import parse_qs, urlsplit

from .artifacts import ArtifactStore, send_file

log = logging.getLogger(__name__)


class FleetAPI(Protocol):
    """What the JSON API reads; the fleet database implements it."""

    def list_devices(self) -> list[dict]: ...
    def get_device(self, device_id: str) -> dict | None: ...
    def list_deployments(self) -> list[dict]: ...
    def get_deployment(self, deployment_id: str) -> dict | None: ...
    def device_telemetry(self, device_id: str, limit: int) -> list[dict]: ...


MAX_UPLOAD_BYTES = 2 << 30


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    protocol_version = "HTTP/1.1"

    def log_message(self, fmt: str, *args: Any) -> None:  # route to logging, not stderr
        log.debug("%s %s", self.address_string(), fmt % args)

    def _json(self, status: int, body: Any) -> None:
        data = json.dumps(body, default=str).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_HEAD(self) -> None:
        self._artifact(head=True)

    def do_GET(self) -> None:
        parts = urlsplit(self.path)
        path = parts.path.rstrip("/")
        if path.startswith("/artifacts/"):
            self._artifact(head=False)
        elif path == "/healthz":
            self._json(200, {"ok": True})
        elif path.startswith("/api/"):
            self._api(path[len("/api/"):].split("/"), parse_qs(parts.query))
        else:
            self._json(404, {"error": "not found"})

    def do_PUT(self) -> None:
        """PUT /api/artifacts: the request body is a model file; answers its sha256 and size."""
        if urlsplit(self.path).path.rstrip("/") != "/api/artifacts" or not hasattr(self.server.api, "put_artifact"):
            self._json(404, {"error": "not found"})
            return
        length = int(self.headers.get("Content-Length") or -1)
        if not 0 < length <= MAX_UPLOAD_BYTES:
            self._json(411 if length < 0 else 413, {"error": "send the file with a Content-Length"})
            return
        import tempfile

        with tempfile.NamedTemporaryFile(dir=self.server.store.root, prefix=".upload-") as tmp:
            remaining = length
            while remaining:
                chunk = self.rfile.read(min(1 << 16, remaining))
                if not chunk:
                    self._json(400, {"error": "the upload was cut short"})
                    return
                tmp.write(chunk)
                remaining -= len(chunk)
            tmp.flush()
            sha256, size = self.server.api.put_artifact(tmp.name)
        self._json(201, {"sha256": sha256, "size": size})

    def do_POST(self) -> None:
        """POST /api/deployments with a JSON deployment spec starts a rollout."""
        if urlsplit(self.path).path.rstrip("/") != "/api/deployments" or not hasattr(
                self.server.api, "create_deployment"):
            self._json(404, {"error": "not found"})
            return
        length = int(self.headers.get("Content-Length") or 0)
        try:
            spec = json.loads(self.rfile.read(length) or b"{}")
            if not isinstance(spec, dict):
                raise ValueError("the body must be a JSON object")
            self._json(201, self.server.api.create_deployment(spec))
        except ValueError as exc:  # JSONDecodeError included
            self._json(400, {"error": str(exc)})

    def _artifact(self, *, head: bool) -> None:
        sha = urlsplit(self.path).path.rstrip("/").rpartition("/")[2]
        path = self.server.store.get(sha)
        if path is None:
            self._json(404, {"error": f"no artifact {sha}"})
            return
        try:
            send_file(self, path, head=head)
        except (BrokenPipeError, ConnectionResetError):
            log.debug("client went away during %s", sha)

    def _api(self, segments: list[str], query: dict[str, list[str]]) -> None:
        api = self.server.api
        if api is None:
            self._json(404, {"error": "no API on this server"})
            return
        kind, ident = segments[0], (segments[1] if len(segments) > 1 else None)
        if kind == "devices" and ident is None:
            self._json(200, api.list_devices())
        elif kind == "devices" and len(segments) == 3 and segments[2] == "telemetry":
            limit = int(query.get("limit", ["100"])[0]) if query.get("limit", ["100"])[0].isdigit() else 100
            self._json(200, api.device_telemetry(ident, limit))
        elif kind == "devices":
            found = api.get_device(ident)
            self._json(200 if found else 404, found or {"error": f"no device {ident}"})
        elif kind == "deployments" and ident is None:
            self._json(200, api.list_deployments())
        elif kind == "deployments":
            found = api.get_deployment(ident)
            self._json(200 if found else 404, found or {"error": f"no deployment {ident}"})
        else:
            self._json(404, {"error": "not found"})


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    store: ArtifactStore
    api: FleetAPI | None


class FleetHTTPServer:
    """Serves ``/artifacts/<sha256>`` and ``/api/...`` on a named daemon thread."""

    def __init__(self, store: ArtifactStore, api: FleetAPI | None = None, host: str = "127.0.0.1",
                 port: int = 0) -> None:
        self._server = _Server((host, port), _Handler)
        self._server.store = store
        self._server.api = api
        self._thread: threading.Thread | None = None
        self._closed = False

    @property
    def port(self) -> int:
        return self._server.server_address[1]

    @property
    def url(self) -> str:
        host = self._server.server_address[0]
        return f"http://{host}:{self.port}"

    def artifact_url(self, sha256: str) -> str:
        return f"{self.url}/artifacts/{sha256}"

    def start(self) -> FleetHTTPServer:
        if self._thread is None:
            self._thread = threading.Thread(target=self._server.serve_forever, name="edgeinfer-fleet-http",
                                            daemon=True)
            self._thread.start()
        return self

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._thread is not None:
            self._server.shutdown()
            self._thread.join(timeout=5)
        self._server.server_close()

    def __enter__(self) -> FleetHTTPServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

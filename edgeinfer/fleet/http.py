"""The fleet manager's HTTP server: the FastAPI app (``api.py``) served by uvicorn on a thread.

uvicorn is the ASGI server Starlette and FastAPI are built and tested with. It runs on its own
event loop in a named daemon thread, on a socket bound before ``start()`` returns (so port 0
works and a taken port fails at once), without installing signal handlers (the CLI owns SIGTERM).
``close()`` is graceful: no new connections, in-flight requests get a few seconds to finish.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import threading
from typing import Any

from .._optional import import_optional
from .api import MAX_UPLOAD_BYTES, Authenticator, FleetAPI, build_app
from .artifacts import ArtifactStore

log = logging.getLogger(__name__)

__all__ = ["FleetAPI", "FleetHTTPServer"]

GRACEFUL_S = 5.0


class FleetHTTPServer:
    """Serves ``/artifacts/<sha256>``, ``/api/...``, ``/metrics`` and ``/openapi.json``."""

    def __init__(self, store: ArtifactStore, api: Any = None, host: str = "127.0.0.1", port: int = 0, *,
                 auth: Authenticator, access: Any = None, max_upload_bytes: int = MAX_UPLOAD_BYTES,
                 tls: tuple[str, str] | None = None) -> None:
        """``auth`` checks every request's token; ``access`` serves the admin routes (``FleetAccess``);
        ``tls``: (certificate, key) files to serve https."""
        self.store = store
        self.api = api
        self.tls = tls
        self.app = build_app(store, api, auth=auth, access=access, max_upload_bytes=max_upload_bytes)
        self._sock = socket.create_server((host, port), reuse_port=False)  # OSError when taken: the caller says so
        self._server: Any = None
        self._thread: threading.Thread | None = None
        self._started = threading.Event()
        self._closed = False

    @property
    def port(self) -> int:
        return self._sock.getsockname()[1]

    @property
    def url(self) -> str:
        host = self._sock.getsockname()[0]
        host = "127.0.0.1" if host in ("0.0.0.0", "::") else host
        return f"{'https' if self.tls else 'http'}://{host}:{self.port}"

    def artifact_url(self, sha256: str) -> str:
        return f"{self.url}/artifacts/{sha256}"

    def start(self) -> FleetHTTPServer:
        if self._thread is not None:
            return self
        uvicorn = import_optional("uvicorn", "fleet", "the fleet manager's HTTP server")

        class _Server(uvicorn.Server):
            def install_signal_handlers(self) -> None:  # the CLI owns the signals
                pass

        certfile, keyfile = self.tls or (None, None)
        config = uvicorn.Config(self.app, log_level="warning", access_log=False, lifespan="off",
                                timeout_graceful_shutdown=GRACEFUL_S, timeout_keep_alive=30,
                                ssl_certfile=certfile, ssl_keyfile=keyfile)
        self._server = _Server(config)

        def serve() -> None:
            asyncio.run(self._server.serve(sockets=[self._sock]))

        self._thread = threading.Thread(target=serve, name="edgeinfer-fleet-http", daemon=True)
        self._thread.start()
        for _ in range(500):
            if self._server.started or not self._thread.is_alive():
                break
            self._thread.join(0.01)
        if not self._server.started:
            raise OSError(f"the HTTP server did not start on {self.url}")
        return self

    def close(self) -> None:
        """Stop accepting; let in-flight requests finish (up to a few seconds). Idempotent."""
        if self._closed:
            return
        self._closed = True
        if self._server is not None and self._thread is not None:
            self._server.should_exit = True
            self._thread.join(GRACEFUL_S + 5)
        self._sock.close()

    def __enter__(self) -> FleetHTTPServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

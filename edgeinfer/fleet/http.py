"""The fleet manager's HTTP server: an ASGI app (``api/app.py``) served by uvicorn on a thread.

uvicorn is the ASGI server Starlette and FastAPI are built and tested with. It runs on its own
event loop in a named daemon thread, on a socket bound when the server is made (so port 0 works, a
taken port fails at once, and the URL is known before the app that needs it is built), without
installing signal handlers (the CLI owns SIGTERM). ``close()`` is graceful: no new connections,
in-flight requests get a few seconds to finish.

With ``client_ca`` (the fleet's CA) the TLS handshake asks for a client certificate and verifies one that is
presented (``CERT_OPTIONAL``: browsers and token clients present none; an expired or foreign certificate fails
the handshake). uvicorn (0.54) puts no peer certificate into the ASGI scope (the ASGI TLS extension is not
implemented there yet): :class:`_PeerCertificateProtocol` reads the verified certificate once per connection and
gives it to every request of that connection as ``scope["state"][PEER_CERTIFICATE]`` (DER bytes) — uvicorn
copies the protocol's ``app_state`` into each request's scope. Who it is, and whether it is revoked, the API
decides (``api/deps.py``, ``fleet/device_certs.py``).

No TLS 1.3 session tickets: OpenSSL sends two after every full handshake by default, each an encryption of the
session and a TLS record on the wire, and none of the manager's clients resumes a session — Python's ``ssl`` (the
agent, the CLI, the simulator) never does unless given the session object, which none keeps across connections — so
every ticket was server CPU spent for nothing (on provisioning, about a fifth of a handshake's). A browser on the
dashboard keeps its connection alive instead; a new connection is a full handshake, as the CLI's always was.

uvicorn's fast parts when they are installed (the ``fleet`` extra installs both): **httptools** (llhttp, Node.js's
HTTP/1.1 parser, in C) instead of h11 (pure Python), and **uvloop** (libuv's event loop, whose TLS transport is
Cython) instead of asyncio's loop (docs/fleet.md, *HTTP server*: what they save). Without them — a platform with
no wheel — the manager serves the same API on h11 and asyncio: nothing here or in the app depends on which runs.
"""

from __future__ import annotations

import importlib.util
import logging
import socket
import ssl
import threading
from collections.abc import Callable
from typing import Any

import uvicorn
from starlette.types import ASGIApp
from uvicorn.protocols.http.auto import AutoHTTPProtocol

log = logging.getLogger(__name__)

__all__ = ["PEER_CERTIFICATE", "FleetHTTPServer"]

GRACEFUL_S = 5.0


#: the HTTP parser uvicorn runs: uvicorn's own choice (``AutoHTTPProtocol``), httptools (C) when installed, else h11
HTTP_PARSER = "httptools" if AutoHTTPProtocol.__name__ == "HttpToolsProtocol" else "h11"
#: the event loop of the server's thread: uvloop when installed, else asyncio's
EVENT_LOOP = "uvloop" if importlib.util.find_spec("uvloop") else "asyncio"  # found, not imported: uvicorn imports it
#: the key of a request's ``scope["state"]`` that holds the client's verified certificate (DER), if it gave one
PEER_CERTIFICATE = "edgeinfer.peer_certificate"


class _PeerCertificateProtocol(AutoHTTPProtocol):  # type: ignore[misc, valid-type]
    """uvicorn's HTTP protocol, with the TLS peer's certificate in each request's ``scope["state"]``."""

    def connection_made(self, transport: Any) -> None:  # after the handshake: the certificate is verified
        super().connection_made(transport)
        ssl_object = transport.get_extra_info("ssl_object")
        der = ssl_object.getpeercert(binary_form=True) if ssl_object is not None else None
        if der:
            self.app_state = {**self.app_state, PEER_CERTIFICATE: der}


def _without_tickets(_config: uvicorn.Config, default: Callable[[], ssl.SSLContext]) -> ssl.SSLContext:
    """uvicorn's TLS context, without TLS 1.3 session tickets (none is ever used: see the module docstring)."""
    context = default()
    context.num_tickets = 0
    return context


class _Server(uvicorn.Server):
    def install_signal_handlers(self) -> None:  # the CLI owns the signals
        pass


class FleetHTTPServer:
    """Serves an app on ``host:port`` (``https`` with ``tls``: certificate and key files). ``start(app)``,
    then ``close()`` (or use it as a context manager once started)."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0, *, tls: tuple[str, str] | None = None,
                 client_ca: str | None = None) -> None:
        """``client_ca`` (with ``tls``): ask clients for a certificate of this CA (optional; verified if given)."""
        self.tls = tls
        self.client_ca = client_ca if tls else None
        self._sock = socket.create_server((host, port), reuse_port=False)  # OSError when taken: the caller says so
        #: the app served, once started
        self.app: ASGIApp | None = None
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None
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

    def start(self, app: ASGIApp) -> FleetHTTPServer:
        """Serve ``app`` (once); OSError when the server does not come up."""
        if self._thread is not None:
            return self
        self.app = app
        certfile, keyfile = self.tls or (None, None)
        config = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="off", loop=EVENT_LOOP,
                                http=_PeerCertificateProtocol if self.client_ca else AutoHTTPProtocol,
                                timeout_graceful_shutdown=GRACEFUL_S, timeout_keep_alive=30,
                                ssl_certfile=certfile, ssl_keyfile=keyfile,
                                ssl_context_factory=_without_tickets if self.tls else None,
                                **({"ssl_cert_reqs": ssl.CERT_OPTIONAL, "ssl_ca_certs": self.client_ca}
                                   if self.client_ca else {}))
        server = self._server = _Server(config)

        def serve() -> None:
            server.run(sockets=[self._sock])  # on a new loop of EVENT_LOOP (uvicorn's loop factory)

        self._thread = threading.Thread(target=serve, name="edgeinfer-fleet-http", daemon=True)
        self._thread.start()
        for _ in range(500):
            if server.started or not self._thread.is_alive():
                break
            self._thread.join(0.01)
        if not server.started:
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
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

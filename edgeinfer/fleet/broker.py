"""An embedded MQTT broker (amqtt) so one machine needs nothing else: ``fleet serve`` with no --broker."""

from __future__ import annotations

import asyncio
import logging
import socket
import threading

from .._optional import import_optional
from ..errors import ConfigError, MissingDependency

log = logging.getLogger(__name__)


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


class EmbeddedBroker:
    """amqtt running on its own event loop in a named daemon thread."""

    def __init__(self, host: str = "127.0.0.1", port: int = 1883) -> None:
        self.host = host
        self.port = port or free_port(host)
        self._loop = asyncio.new_event_loop()  # closed by close(), or by a start() that fails
        self._broker = None
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._closed = False

    @property
    def url(self) -> str:
        return f"mqtt://{self.host}:{self.port}"

    def start(self, timeout: float = 15.0) -> EmbeddedBroker:
        """Start listening; MissingDependency if amqtt is missing, ConfigError if the port is taken."""
        try:
            amqtt_broker = import_optional("amqtt.broker", "fleet", "the embedded broker (or pass --broker mqtt://host:port)")
        except MissingDependency:
            self.close()
            raise
        config = {
            "listeners": {"default": {"type": "tcp", "bind": f"{self.host}:{self.port}"}},
            "plugins": {"amqtt.plugins.authentication.AnonymousAuthPlugin": {"allow_anonymous": True}},
        }

        def serve() -> None:
            asyncio.set_event_loop(self._loop)

            async def boot() -> None:
                self._broker = amqtt_broker.Broker(config)
                await self._broker.start()

            try:
                self._loop.run_until_complete(boot())
            except BaseException as exc:  # report any start failure to the starting thread
                self._error = exc
                self._ready.set()
                return
            self._ready.set()
            self._loop.run_forever()

        self._thread = threading.Thread(target=serve, name="edgeinfer-embedded-broker", daemon=True)
        self._thread.start()
        if not self._ready.wait(timeout) or self._error is not None:
            self.close()
            raise ConfigError(f"the embedded MQTT broker could not listen on {self.host}:{self.port}: "
                              f"{self._error or 'timed out'}")
        log.info("embedded MQTT broker on %s", self.url)
        return self

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._broker is not None and self._loop.is_running():
            future = asyncio.run_coroutine_threadsafe(self._broker.shutdown(), self._loop)
            try:
                future.result(timeout=10)
            except Exception as exc:  # shutting down: log, never raise from close()
                log.debug("embedded broker shutdown: %s", exc)
            self._loop.call_soon_threadsafe(self._loop.stop)
        if self._thread is not None:
            self._thread.join(timeout=10)
        if not self._loop.is_running():
            self._loop.close()

    def __enter__(self) -> EmbeddedBroker:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

"""A rate limit on what is not authenticated: provisioning requests, sign-ins and requests with a bad credential, per
client address (docs/security.md, *Rate limit*).

Each address has a token bucket (``rate_per_s`` refilled, ``burst`` at most). A provisioning request takes one before
any work is done; any answer 401 (no credential, or one that is not valid: a sign-in with a wrong token, a guessed
device password) takes one after. While an address's bucket is empty, its requests are answered 429 with
``Retry-After`` before they reach the app — except those that carry a credential this manager accepted in the last
``vouched_s`` (``vouch``: the API's checks call it when a credential passes): authenticated traffic is never slowed,
even from an address that floods. A client whose credential the manager has not seen for ``vouched_s``, behind the
same address as a flood, waits with the flood until its bucket refills.

A few lines rather than a library: the well-kept ones (slowapi, limits) limit routes by a key, and this limit needs
the answer (401 or not) and the credential's standing, which live in the app; a token bucket is 20 lines.
"""

from __future__ import annotations

import hashlib
import math
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from starlette.requests import HTTPConnection
from starlette.types import ASGIApp, Message, Receive, Scope, Send

#: the provisioning route: each request takes one token before any work
PROVISION_PATH = "/api/v1/provision"
#: addresses (and vouched credentials) remembered at most: the least recently seen are forgotten first
MAX_TRACKED = 50_000
_VOUCHED = "edgeinfer.vouched"


@dataclass(frozen=True)
class RateLimit:
    """``fleet serve --unauthenticated-rate/--unauthenticated-burst``: per client address; rate 0 turns it off."""

    rate_per_s: float = 5.0
    burst: int = 50
    vouched_s: float = 600.0

    @property
    def enabled(self) -> bool:
        return self.rate_per_s > 0


class Buckets:
    """Token buckets per key, bounded (the least recently used key forgotten first); thread-safe."""

    def __init__(self, limit: RateLimit, *, clock: Any = time.monotonic) -> None:
        self.limit = limit
        self.clock = clock
        self._buckets: OrderedDict[str, tuple[float, float]] = OrderedDict()  # key -> (tokens, at)
        self._vouched: OrderedDict[str, float] = OrderedDict()  # credential digest -> until
        self._lock = threading.Lock()

    def _level(self, key: str, now: float) -> float:
        tokens, at = self._buckets.get(key, (float(self.limit.burst), now))
        return min(float(self.limit.burst), tokens + (now - at) * self.limit.rate_per_s)

    def take(self, key: str) -> float:
        """Take one token: 0 when there was one, else the seconds until there is."""
        with self._lock:
            now = self.clock()
            tokens = self._level(key, now)
            if tokens >= 1:
                self._put(self._buckets, key, (tokens - 1, now))
                return 0.0
            self._put(self._buckets, key, (tokens, now))
            return (1 - tokens) / self.limit.rate_per_s

    def wait_s(self, key: str) -> float:
        """0 when ``key`` has a token, else the seconds until it does (nothing taken)."""
        with self._lock:
            tokens = self._level(key, self.clock())
        return 0.0 if tokens >= 1 else (1 - tokens) / self.limit.rate_per_s

    def vouch(self, credential: str) -> None:
        with self._lock:
            self._put(self._vouched, _digest(credential), self.clock() + self.limit.vouched_s)

    def vouched(self, credential: str | None) -> bool:
        if not credential:
            return False
        with self._lock:
            until = self._vouched.get(_digest(credential))
        return until is not None and until > self.clock()

    def forget(self, credential: str) -> None:
        with self._lock:
            self._vouched.pop(_digest(credential), None)

    @staticmethod
    def _put(table: OrderedDict, key: str, value: Any) -> None:
        table[key] = value
        table.move_to_end(key)
        while len(table) > MAX_TRACKED:
            table.popitem(last=False)


def _digest(credential: str) -> str:
    return hashlib.sha256(credential.encode("utf-8", "replace")).hexdigest()


def credential_of(scope: Scope) -> str | None:
    """The credential a request carries: its Authorization header, else a download grant (``?grant=``)."""
    for name, value in scope.get("headers", ()):
        if name == b"authorization":
            return value.decode("latin-1")
    query = scope.get("query_string", b"").decode("latin-1")
    grant = next((part[6:] for part in query.split("&") if part.startswith("grant=") and len(part) > 6), None)
    return f"grant={grant}" if grant else None


def vouch(connection: HTTPConnection) -> None:
    """The request's credential passed: its later requests skip the limit (call it where a credential is accepted)."""
    connection.scope[_VOUCHED] = True


class RateLimitMiddleware:
    """The limit, as pure ASGI (nothing buffered: streamed answers stream on)."""

    def __init__(self, app: ASGIApp, buckets: Buckets) -> None:
        self.app = app
        self.buckets = buckets

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        address = scope["client"][0] if scope.get("client") else "-"
        credential = credential_of(scope)
        if self.buckets.vouched(credential):
            await self.app(scope, receive, send)
            return
        wait = self.buckets.take(address) if scope["path"] == PROVISION_PATH else self.buckets.wait_s(address)
        if wait > 0:
            await _too_many(send, wait)
            return
        status = 0

        async def watch(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        await self.app(scope, receive, watch)
        if scope.get(_VOUCHED) and credential:
            self.buckets.vouch(credential)
        elif status == 401:
            self.buckets.take(address)
            if credential:
                self.buckets.forget(credential)


async def _too_many(send: Send, wait_s: float) -> None:
    retry = max(1, math.ceil(wait_s))
    body = (b'{"error": "too many unauthenticated requests from this address: retry after %d s"}' % retry)
    await send({"type": "http.response.start", "status": 429, "headers": [
        (b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
        (b"retry-after", str(retry).encode())]})
    await send({"type": "http.response.body", "body": body})

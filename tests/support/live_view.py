"""The live view from outside, as a device and a viewer see it: POST a frame with the device's credential, read
a viewer's MJPEG stream part by part (``multipart/x-mixed-replace``)."""

from __future__ import annotations

import base64
import http.client
import threading
import time
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any


def basic(username: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{username}:{password}".encode()).decode()


def request(base: str, method: str, path: str, *, body: bytes | None = None, auth: str | None = None,
            headers: dict | None = None) -> tuple[int, Any, bytes]:
    """(status, headers, body) of one request on a fresh connection (Content-Length set for a body)."""

    host, port = base.removeprefix("http://").split(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=30)
    try:
        sent = dict(headers or {})
        if auth:
            sent["Authorization"] = auth
        connection.request(method, path, body=body, headers=sent)
        response = connection.getresponse()
        return response.status, response.headers, response.read()
    finally:
        connection.close()


def post_frame(url: str, device: str, pipeline: str, jpeg: bytes, auth: str, *, stream: str = "",
               frame_time: float | None = None, frame_id: str = "1") -> int:
    """POST one frame as the device does; the status."""
    parsed = urllib.parse.urlsplit(url)
    path = f"/api/devices/{device}/live/{pipeline}/frames" + (f"?stream={stream}" if stream else "")
    connection = http.client.HTTPConnection(parsed.hostname, parsed.port, timeout=10)
    try:
        connection.request("POST", path, body=jpeg, headers={
            "Authorization": auth, "Content-Type": "image/jpeg", "X-Frame-Id": frame_id,
            "X-Frame-Time": f"{time.time() if frame_time is None else frame_time:.6f}"})
        response = connection.getresponse()
        response.read()
        return response.status
    finally:
        connection.close()


@dataclass
class Part:
    headers: dict[str, str]
    jpeg: bytes
    received: float  # time.time() when its last byte arrived


@dataclass
class Watcher:
    """A viewer of ``GET /api/devices/D/live/P``: the parts it has read so far, on a thread of its own."""

    url: str
    path: str
    token: str
    parts: list[Part] = field(default_factory=list)
    status: int | None = None
    content_type: str = ""
    ended: threading.Event = field(default_factory=threading.Event)

    def __enter__(self) -> Watcher:
        parsed = urllib.parse.urlsplit(self.url)
        self._connection = http.client.HTTPConnection(parsed.hostname, parsed.port, timeout=30)
        self._connection.request("GET", self.path, headers={"Authorization": f"Bearer {self.token}"})
        response = self._connection.getresponse()
        self.status, self.content_type = response.status, response.headers.get("Content-Type", "")
        if self.status == 200:
            threading.Thread(target=self._read, args=(response,), daemon=True).start()
        else:
            response.read()
            self.ended.set()
        return self

    def _read(self, response: http.client.HTTPResponse) -> None:
        try:
            for part in read_parts(response):
                self.parts.append(part)
        except Exception:  # the client closed its socket under the reader: the stream is over
            pass
        finally:
            self.ended.set()

    def __exit__(self, *exc: object) -> None:
        self._connection.sock and self._connection.sock.shutdown(2)  # the client goes away
        self._connection.close()


def read_parts(response: http.client.HTTPResponse) -> Iterator[Part]:
    """The parts of a multipart/x-mixed-replace answer (each with a Content-Length)."""
    while True:
        line = response.readline()
        if not line:
            return
        if not line.startswith(b"--"):
            continue
        headers = {}
        while (line := response.readline().strip()):
            name, _, value = line.decode().partition(":")
            headers[name.strip().lower()] = value.strip()
        jpeg = response.read(int(headers["content-length"]))
        yield Part(headers, jpeg, time.time())

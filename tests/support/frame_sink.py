"""A small HTTP server standing where the fleet manager takes live-view frames: it records each POST (body,
headers, when) and answers 204, or what ``answer`` says (410 nobody watches, 401 refused)."""

from __future__ import annotations

import http.server
import threading
import time
from dataclasses import dataclass


@dataclass
class Posted:
    path: str
    body: bytes
    headers: dict[str, str]
    at: float


class FrameSink:
    def __init__(self) -> None:
        self.posts: list[Posted] = []
        self.answer = 204
        sink = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                sink.posts.append(Posted(self.path, body, dict(self.headers), time.monotonic()))
                self.send_response(sink.answer)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}/api/devices/cam-01/live"

    def wait_for(self, count: int, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while len(self.posts) < count and time.monotonic() < deadline:
            time.sleep(0.05)
        return len(self.posts) >= count

    def __enter__(self) -> FrameSink:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

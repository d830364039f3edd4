"""``edgeinfer run --preview [HOST:]PORT``: the run's annotated frames as MJPEG over HTTP (multipart/x-mixed-replace).

A bench view with no fleet: :class:`PreviewServer` (stdlib ``http.server`` on thread ``edgeinfer-preview``) serves
``/`` (a page with the image) and ``/stream.mjpeg``. A :class:`~edgeinfer.pipeline.live_view.LiveViewFeed` runs only
while a client watches, so a run nobody looks at copies no frame; it stops with the run.
"""

from __future__ import annotations

import contextlib
import http.server
import threading
from collections.abc import Iterator
from typing import Any

import click

BOUNDARY = "edgeinfer-frame"
PAGE = b"<!doctype html><title>edgeinfer preview</title><body style='margin:0;background:#111'>" \
       b"<img src='/stream.mjpeg' style='max-width:100%'></body>"


def parse_address(text: str) -> tuple[str, int]:
    """``PORT`` (on 127.0.0.1) or ``HOST:PORT``."""
    host, _, port = text.rpartition(":")
    try:
        number = int(port)
    except ValueError:
        raise click.BadParameter(f"{text!r} is not [HOST:]PORT", param_hint="--preview") from None
    if not 0 <= number <= 65535:
        raise click.BadParameter(f"port {number} is out of range", param_hint="--preview")
    return host or "127.0.0.1", number


class PreviewServer:
    """MJPEG of one stream of ``pipeline`` (a MultiPipeline) at ``fps`` and ``width`` at most, to every client."""

    def __init__(self, pipeline: Any, address: tuple[str, int], *, stream: str = "", fps: float = 10.0,
                 width: int = 960) -> None:
        from ..pipeline.live_view import LiveViewFeed

        self._latest: bytes | None = None
        self._fresh = threading.Condition()
        self._clients = 0
        self._closed = False
        self._feed_args = (lambda: pipeline, stream)
        self._make_feed = lambda: LiveViewFeed(*self._feed_args, self._publish, fps=fps, width=width)
        self._feed: LiveViewFeed | None = None
        self.httpd = http.server.ThreadingHTTPServer(address, _handler(self))
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(target=self.httpd.serve_forever, name="edgeinfer-preview", daemon=True)

    @property
    def url(self) -> str:
        host, port = self.httpd.server_address[:2]
        return f"http://{host}:{port}/"

    def start(self) -> PreviewServer:
        self.thread.start()
        return self

    def close(self) -> None:
        with self._fresh:
            self._closed = True
            self._fresh.notify_all()
        if self._feed is not None:
            self._feed.stop()
        self.httpd.shutdown()
        self.httpd.server_close()

    def _publish(self, jpeg: bytes, _result: Any) -> bool:
        with self._fresh:
            self._latest = jpeg
            self._fresh.notify_all()
            return self._clients > 0 and not self._closed  # nobody watches: the feed stops

    def frames(self) -> Any:
        """A client's frames: each new JPEG, until the run stops (a feed runs while anyone watches)."""
        with self._fresh:
            self._clients += 1
            if self._feed is None or not self._feed.running:
                self._feed = self._make_feed().start()
        try:
            last: bytes | None = None
            while True:
                frame = self._next_after(last)
                if self._closed:
                    return
                if frame is not None and frame is not last:
                    last = frame
                    yield frame
        finally:
            with self._fresh:
                self._clients -= 1


    def _next_after(self, last: bytes | None) -> bytes | None:
        """The newest frame once it is not ``last`` (or after a second without one, or once closed)."""
        with self._fresh:
            self._fresh.wait_for(lambda: self._closed or self._latest is not last, timeout=1.0)
            return self._latest


def _handler(server: PreviewServer) -> type[http.server.BaseHTTPRequestHandler]:
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path == "/":
                self._send(200, "text/html; charset=utf-8", PAGE)
            elif self.path == "/stream.mjpeg":
                self._stream()
            else:
                self._send(404, "text/plain", b"not found\n")

        def _send(self, status: int, content_type: str, body: bytes) -> None:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def _stream(self) -> None:
            self.send_response(200)
            self.send_header("Content-Type", f"multipart/x-mixed-replace; boundary={BOUNDARY}")
            self.send_header("Cache-Control", "no-store")
            self.end_headers()
            try:
                for jpeg in server.frames():
                    self.wfile.write(f"--{BOUNDARY}\r\nContent-Type: image/jpeg\r\nContent-Length: {len(jpeg)}"
                                     "\r\n\r\n".encode() + jpeg + b"\r\n")
                    self.wfile.flush()
            except OSError:  # the client left
                pass

        def log_message(self, *args: object) -> None:
            pass

    return Handler


@contextlib.contextmanager
def previewing(pipeline: Any, address: tuple[str, int] | None, stream: str) -> Iterator[PreviewServer | None]:
    """A preview of ``stream`` served at ``address`` for the block (nothing when ``address`` is None)."""
    if address is None:
        yield None
        return
    try:
        server = PreviewServer(pipeline, address, stream=stream).start()
    except OSError as exc:
        raise click.ClickException(f"--preview: cannot serve on {address[0]}:{address[1]}: {exc}") from None
    click.echo(f"preview: {server.url}", err=True)
    try:
        yield server
    finally:
        server.close()

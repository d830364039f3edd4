"""A real HTTP MJPEG server, what IP cameras and ESP32-CAMs speak: ``python mjpeg_server.py PORT IMAGE FPS``.

Serves ``multipart/x-mixed-replace`` JPEG frames of IMAGE on http://127.0.0.1:PORT/ and prints
``listening`` once the socket is bound. Started by ``support.pipeline.MjpegServer``.
"""

from __future__ import annotations

import sys
import time


def serve_mjpeg(port: int, image: str, fps: float) -> None:
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    import cv2

    ok, encoded = cv2.imencode(".jpg", cv2.imread(image))
    assert ok
    payload = encoded.tobytes()
    part = b"--frame\r\nContent-Type: image/jpeg\r\nContent-Length: %d\r\n\r\n" % len(payload) + payload + b"\r\n"

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.0"

        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "multipart/x-mixed-replace; boundary=frame")
            self.end_headers()
            try:
                while True:
                    self.wfile.write(part)
                    time.sleep(1.0 / fps)
            except (BrokenPipeError, ConnectionResetError):
                pass

        def log_message(self, *args: object) -> None:
            pass

    ThreadingHTTPServer.allow_reuse_address = True
    server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    sys.stdout.write("listening\n")
    sys.stdout.flush()
    server.serve_forever()


if __name__ == "__main__":
    if len(sys.argv) != 4:
        sys.exit("usage: mjpeg_server.py PORT IMAGE FPS")
    serve_mjpeg(int(sys.argv[1]), sys.argv[2], float(sys.argv[3]))

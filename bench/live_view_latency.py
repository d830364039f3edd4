"""Live view latency: from a frame's capture time (X-Frame-Time, set just before the POST, as the device sets it)
to the moment the viewer stream's client has the whole JPEG — through a real manager (SQLite, uvicorn) and its
MJPEG viewer route. Medians and p95 over N frames at FPS, for a 640x480 JPEG.

    PYTHONPATH=$PWD:$PWD/tests python bench/live_view_latency.py --frames 200 --fps 10
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

from support.fleet import api_server, state_message
from support.jpegs import noise_jpeg
from support.live_view import Watcher, post_frame

from edgeinfer.fleet.db import FleetDB


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--frames", type=int, default=200)
    parser.add_argument("--fps", type=float, default=10.0)
    args = parser.parse_args()
    frame = noise_jpeg(0, 640, 480)
    with tempfile.TemporaryDirectory() as folder:
        db = FleetDB(f"sqlite:///{Path(folder) / 'fleet.sqlite3'}")
        db.record_state("f", "cam", state_message("cam", "0" * 32))
        with api_server(db, Path(folder) / "api") as (server, services):
            viewer = services.access.tokens.create(name="bench", role="viewer")["token"]
            operator = services.access.tokens.create(name="bench-op", role="operator")["token"]
            with Watcher(server.url, "/api/devices/cam/live/main", viewer) as watcher:
                while services.live_view.viewers == 0:
                    time.sleep(0.01)
                for i in range(args.frames):
                    post_frame(server.url, "cam", "main", frame, f"Bearer {operator}", frame_id=str(i))
                    time.sleep(1 / args.fps)
                time.sleep(0.5)
            parts = watcher.parts
        db.close()
    latency = sorted((p.received - float(p.headers["x-frame-time"])) * 1000 for p in parts)
    print(json.dumps({"frames_sent": args.frames, "frames_received": len(parts), "jpeg_bytes": len(frame),
                      "median_ms": round(statistics.median(latency), 2),
                      "p95_ms": round(latency[int(0.95 * (len(latency) - 1))], 2)}))


if __name__ == "__main__":
    main()

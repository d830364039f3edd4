"""What a live MJPEG camera costs under the ``latest`` policy when the model is slower than the camera.

An HTTP MJPEG server (in this process's child) plays a 1080p photo at 30 fps; a pipeline holds
inference to 5 fps (``max_fps``), so five of every six frames are dropped. Two readers of the same
stream, interleaved over several repetitions, medians reported:

* ``opencv`` — OpenCV's FFmpeg backend (``StreamSource``): every frame is decoded, then most dropped;
* ``edgeinfer`` — ``MjpegStreamSource`` (PyAV + libjpeg-turbo): frames wait compressed, the dropped
  ones are never decoded, the kept ones decode at the model's size.

Reported: CPU seconds per wall second of the whole process (what the device pays), frames read,
frames decoded, results. Needs the ``mjpeg`` extra.

    PYTHONPATH=. python bench/live_decode.py [--reps 5] [--seconds 6]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from edgeinfer.capture import StreamSource  # noqa: E402
from edgeinfer.capture.mjpeg import MjpegStreamSource  # noqa: E402
from edgeinfer.pipeline.core import Pipeline  # noqa: E402

ASSETS = Path(os.environ.get("EDGEINFER_ASSETS", REPO.parent / "shared" / "assets")).resolve()
MODEL = ASSETS / "models" / "mobilenet_v2_1.0_224_quant.tflite"
PHOTO = ASSETS / "images" / "cat_720p.jpg"

SERVER = r"""
import socket, sys, threading, time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
import cv2
frame = cv2.resize(cv2.imread(sys.argv[2]), (1920, 1080), interpolation=cv2.INTER_CUBIC)
jpeg = cv2.imencode(".jpg", frame, [cv2.IMWRITE_JPEG_QUALITY, 85])[1].tobytes()
period = 1.0 / float(sys.argv[3])
class Handler(BaseHTTPRequestHandler):
    def log_message(self, *args): pass
    def do_GET(self):
        self.send_response(200)
        self.send_header("Content-Type", "multipart/x-mixed-replace; boundary=frame")
        self.end_headers()
        due = time.monotonic()
        try:
            while True:
                self.wfile.write(b"--frame\r\nContent-Type: image/jpeg\r\nContent-Length: %d\r\n\r\n" % len(jpeg))
                self.wfile.write(jpeg + b"\r\n")
                due += period
                time.sleep(max(0.0, due - time.monotonic()))
        except (BrokenPipeError, ConnectionResetError):
            pass
server = ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), Handler)
print("listening", flush=True)
server.serve_forever()
"""


def free_port() -> int:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def measure(reader: type, url: str, seconds: float) -> dict[str, float]:
    source = reader(url)
    with Pipeline(MODEL, source, policy="latest", max_fps=5, threads=1) as pipeline:
        results = iter(pipeline)
        for _ in range(3):  # warm-up: connected, engine loaded, first frames through
            next(results)
        read0 = source.frames_read
        decoded0 = getattr(source, "frames_decoded", None)
        cpu0, wall0 = time.process_time(), time.perf_counter()
        count = 0
        while time.perf_counter() - wall0 < seconds:
            next(results)
            count += 1
        wall = time.perf_counter() - wall0
        cpu = time.process_time() - cpu0
        read = source.frames_read - read0
        decoded = source.frames_decoded - decoded0 if decoded0 is not None else read
    source.close()
    return {"cpu_per_s": cpu / wall, "read_per_s": read / wall, "decoded_per_s": decoded / wall,
            "results_per_s": count / wall}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=6.0)
    parser.add_argument("--fps", type=float, default=30.0, help="the camera's frame rate")
    args = parser.parse_args()
    port = free_port()
    server = subprocess.Popen([sys.executable, "-c", SERVER, str(port), str(PHOTO), str(args.fps)],
                              stdout=subprocess.PIPE)
    try:
        assert server.stdout is not None and server.stdout.readline().strip() == b"listening"
        url = f"http://127.0.0.1:{port}/stream.mjpg"
        readers = {"opencv": StreamSource, "edgeinfer": MjpegStreamSource}
        samples: dict[str, list[dict[str, float]]] = {name: [] for name in readers}
        for rep in range(args.reps):
            order = list(readers) if rep % 2 == 0 else list(reversed(readers))
            for name in order:
                sample = measure(readers[name], url, args.seconds)
                samples[name].append(sample)
                print(f"rep {rep + 1} {name:<10} CPU {sample['cpu_per_s']:.3f} s/s  read {sample['read_per_s']:.1f}/s"
                      f"  decoded {sample['decoded_per_s']:.1f}/s  results {sample['results_per_s']:.1f}/s", flush=True)
    finally:
        server.kill()
        server.wait()
    print(f"\n1080p MJPEG camera at {args.fps:g} fps, pipeline held to 5 fps (latest), {args.reps} reps of "
          f"{args.seconds:g} s, medians:")
    median = {name: {k: statistics.median(s[k] for s in runs) for k in runs[0]} for name, runs in samples.items()}
    for name, m in median.items():
        print(f"   {name:<10} CPU {m['cpu_per_s']:.3f} cores  read {m['read_per_s']:.1f}/s  decoded "
              f"{m['decoded_per_s']:.1f}/s  results {m['results_per_s']:.1f}/s")
    ratio = median["edgeinfer"]["cpu_per_s"] / median["opencv"]["cpu_per_s"]
    print(f"   edgeinfer / opencv CPU: {ratio:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())

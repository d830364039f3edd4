"""``edgeinfer run --preview``: a real run on a clip serves its annotated frames as MJPEG over HTTP."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.request

import cv2
import numpy as np
from support import scenes
from support.assets import REPO
from support.broker import free_port
from support.pipeline import ULTRAFACE


def test_preview_serves_annotated_mjpeg_parts_while_the_run_lasts(tmp_path):
    clip = scenes.make_scene_clip(tmp_path / "scene.avi")
    port = free_port()
    env = dict(os.environ, PYTHONPATH=f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    line = "door=" + ",".join(str(v) for v in scenes.LINE)
    run = subprocess.Popen([sys.executable, "-m", "edgeinfer", "run", str(ULTRAFACE), "-s", str(clip), "--loop",
                            "--task", "detect", "--max-fps", "10", "--threads", "1", "--line", line,
                            "--preview", f"127.0.0.1:{port}"], env=env, cwd=REPO,
                           stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                stream = urllib.request.urlopen(f"http://127.0.0.1:{port}/stream.mjpeg", timeout=20)
                break
            except OSError:
                assert time.monotonic() < deadline and run.poll() is None, run.stderr.read().decode()  # type: ignore
                time.sleep(0.3)
        with stream:
            assert stream.headers["Content-Type"].startswith("multipart/x-mixed-replace; boundary=")
            parts = [_part(stream) for _ in range(3)]
        for jpeg in parts:
            image = cv2.imdecode(np.frombuffer(jpeg, np.uint8), cv2.IMREAD_COLOR)
            # at most --preview's width, the source's aspect: the clip decodes at 1/2 scale for the model (reduced
            # decoding), and the preview draws that frame as it is rather than enlarging it
            assert image.shape[1] <= 640 and image.shape[0] * 4 == image.shape[1] * 3 and image.shape[2] == 3
        assert len({bytes(p) for p in parts}) == 3  # three different frames
        page = urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=10).read()
        assert b"/stream.mjpeg" in page
    finally:
        run.terminate()
        run.wait(20)


def _part(stream) -> bytes:
    """One part of a multipart/x-mixed-replace body: its headers, then Content-Length bytes."""
    length = None
    while True:
        line = stream.readline()
        if line.lower().startswith(b"content-length:"):
            length = int(line.split(b":")[1])
        elif line in (b"\r\n", b"\n") and length is not None:
            break
    body = stream.read(length)
    stream.readline()
    return body

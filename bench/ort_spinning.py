"""ONNX Runtime's idle workers spinning or sleeping, in a pipeline: edgeinfer run with each, and the plain loop.

A 1280x720 clip (H.264 and MJPEG, made from the shared photos) through YOLO11n-pose on ONNX Runtime at every
usable core: the 40-line OpenCV + ONNX Runtime loop (ONNX Runtime's defaults: its idle workers spin),
edgeinfer's pipeline with ``$EDGEINFER_ORT_SPINNING=1`` (spinning, as before) and with its default (sleeping).
Each program is a process of its own, run in turn, round after round; steady fps after the first result and
CPU per frame.

    PYTHONPATH=. python bench/ort_spinning.py [--rounds 2]
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

import cv2
import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from edgeinfer.capture import cached_test_clip  # noqa: E402

ASSETS = Path(os.environ.get("EDGEINFER_ASSETS", REPO.parent / "shared" / "assets")).resolve()
MODEL = str(ASSETS / "models" / "yolo11n-pose.onnx")
PHOTOS = ("pets.jpg", "kite_and_cold.jpg", "squat.bmp", "face.jpg")


def clips() -> dict[str, Path]:
    """The MJPEG clip (made once, cached) and its H.264 copy."""
    mjpeg = cached_test_clip([ASSETS / "images" / name for name in PHOTOS], size=(1280, 720), fps=30,
                             frames_per_image=25)
    h264 = mjpeg.with_suffix(".mp4")
    if not h264.exists():
        import av

        with av.open(str(mjpeg)) as source, av.open(str(h264), "w") as target:
            stream = target.add_stream("libx264", rate=30)
            stream.width, stream.height, stream.pix_fmt = 1280, 720, "yuv420p"
            for frame in source.decode(video=0):
                for packet in stream.encode(frame.reformat(format="yuv420p")):
                    target.mux(packet)
            for packet in stream.encode():
                target.mux(packet)
    return {"mjpeg": mjpeg, "h264": h264}


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def plain(clip: Path, threads: int) -> tuple[int, float, float]:
    """The loop a user writes: frames, seconds and CPU seconds after the first frame."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads, options.inter_op_num_threads = threads, 1
    session = ort.InferenceSession(MODEL, options, providers=["CPUExecutionProvider"])
    name = session.get_inputs()[0].name
    capture = cv2.VideoCapture(str(clip))
    frames, started, cpu = -1, 0.0, 0.0
    while True:
        ok, frame = capture.read()
        if not ok:
            break
        height, width = frame.shape[:2]
        ratio = min(640 / width, 640 / height)
        new_w, new_h = round(width * ratio), round(height * ratio)
        image = cv2.resize(frame, (new_w, new_h))
        top, left = (640 - new_h) // 2, (640 - new_w) // 2
        image = cv2.copyMakeBorder(image, top, 640 - new_h - top, left, 640 - new_w - left, cv2.BORDER_CONSTANT,
                                   value=(114, 114, 114))
        tensor = np.ascontiguousarray(image[:, :, ::-1].transpose(2, 0, 1))[None].astype(np.float32) / 255.0
        session.run(None, {name: tensor})
        frames += 1
        if frames == 0:
            started, cpu = time.perf_counter(), cpu_seconds()
    return frames, time.perf_counter() - started, cpu_seconds() - cpu


def edgeinfer(clip: Path) -> tuple[int, float, float]:
    """edgeinfer's pipeline (every usable core): frames, seconds and CPU seconds after the first result."""
    from edgeinfer.pipeline.core import Pipeline

    with Pipeline(MODEL, str(clip), delegate="onnxruntime", task="pose") as pipeline:
        results = iter(pipeline)
        next(results)
        started, cpu, frames = time.perf_counter(), cpu_seconds(), 0
        for _ in results:
            frames += 1
        return frames, time.perf_counter() - started, cpu_seconds() - cpu


def one(program: str, codec: str) -> None:
    clip = clips()[codec]
    frames, seconds, cpu = plain(clip, 2) if program == "plain" else edgeinfer(clip)
    spinning = os.environ.get("EDGEINFER_ORT_SPINNING", "0")
    print(f"{program:9} {codec:5} spinning={spinning}  fps {frames / seconds:6.2f}  "
          f"cpu/frame {cpu / frames * 1e3:6.1f} ms", flush=True)


def rounds(count: int) -> None:
    clips()
    for _ in range(count):
        for codec in ("h264", "mjpeg"):
            for program, spinning in (("plain", "1"), ("edgeinfer", "1"), ("edgeinfer", "0")):
                env = {**os.environ, "EDGEINFER_ORT_SPINNING": spinning}
                done = subprocess.run([sys.executable, __file__, "--one", program, codec], env=env,
                                      capture_output=True, text=True, timeout=900)
                print((done.stdout or done.stderr).strip().splitlines()[-1], flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--one", nargs=2, metavar=("PROGRAM", "CODEC"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        one(*args.one)
    else:
        rounds(args.rounds)


if __name__ == "__main__":
    main()

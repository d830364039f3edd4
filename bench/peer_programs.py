"""The two peers bench/peers.py runs edgeinfer against, each as a program of its own.

* ``plain``: the loop a user writes with OpenCV and ONNX Runtime (``plain_loop``, about 40 lines): read a
  frame, letterbox it, scale to [0, 1], HWC -> CHW, ``session.run``, decode and NMS in numpy — Ultralytics'
  own pre- and postprocessing for a static 640x640 export, written out. Runs in the project's environment.
* ``ultralytics``: Ultralytics' ``YOLO(model, task=...).predict(clip, stream=True)`` on the same ONNX file,
  so it runs on ONNX Runtime as well. Runs in a bench-only environment that has Ultralytics (peers.py
  ``--setup-ultralytics`` makes it): this file imports nothing from edgeinfer.
* ``runtime``: no video at all — the plain loop's session invoked again and again on the clip's first frame,
  preprocessed once (``runtime_alone``). Its rate is the ceiling of every program on this runtime at this thread
  count: a program that hid all its decoding, preprocessing and decoding of outputs behind inference would run
  at it, never faster. Its boxes are the first frame's each time (not the clip's): peers.py does not compare them.

Either prints one JSON line per frame, ``{"frame": i, "boxes": [[x1, y1, x2, y2, score, class], ...]}``
(source pixels), as soon as the frame is done: peers.py times the lines as they arrive.

    python bench/peer_programs.py plain|ultralytics|runtime MODEL CLIP --threads N [--conf 0.25 --iou 0.7 --max-det 300]
                                  [--limit FRAMES] [--task pose|detect]
"""

from __future__ import annotations

import argparse
import ast
import json
import sys
from collections.abc import Iterator

import cv2
import numpy as np

Boxes = list[list[float]]


def nms(boxes: np.ndarray, scores: np.ndarray, iou: float) -> list[int]:
    """Greedy non-maximum suppression: indices kept, best score first."""
    order = scores.argsort()[::-1]
    areas = (boxes[:, 2] - boxes[:, 0]) * (boxes[:, 3] - boxes[:, 1])
    keep = []
    while order.size:
        best, rest = order[0], order[1:]
        keep.append(int(best))
        x1 = np.maximum(boxes[best, 0], boxes[rest, 0])
        y1 = np.maximum(boxes[best, 1], boxes[rest, 1])
        x2 = np.minimum(boxes[best, 2], boxes[rest, 2])
        y2 = np.minimum(boxes[best, 3], boxes[rest, 3])
        inter = np.clip(x2 - x1, 0, None) * np.clip(y2 - y1, 0, None)
        order = rest[inter / (areas[best] + areas[rest] - inter) <= iou]
    return keep


def plain_loop(model: str, clip: str, threads: int, conf: float = 0.25, iou: float = 0.7, max_det: int = 300,
               limit: int | None = None, runtime_alone: bool = False) -> Iterator[Boxes]:
    """A YOLO ONNX export over a video with OpenCV and ONNX Runtime, as a user writes it: boxes per frame.

    ``runtime_alone``: read and preprocess only the first frame, then invoke the session on it ``limit`` times
    (the ceiling of any program on this runtime and thread count: see the module's docstring)."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    session = ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])
    name, size = session.get_inputs()[0].name, session.get_inputs()[0].shape[2]  # 1x3x640x640
    classes = len(ast.literal_eval(session.get_modelmeta().custom_metadata_map["names"]))
    cap = cv2.VideoCapture(clip)
    frames, blob = 0, None
    while limit is None or frames < limit:
        if blob is None or not runtime_alone:
            ok, frame = cap.read()
            if not ok:
                break
            h, w = frame.shape[:2]
            scale = min(size / w, size / h)
            nw, nh = round(w * scale), round(h * scale)
            top, left = (size - nh) // 2, (size - nw) // 2
            canvas = np.full((size, size, 3), 114, np.uint8)
            canvas[top:top + nh, left:left + nw] = cv2.resize(frame, (nw, nh), interpolation=cv2.INTER_LINEAR)
            blob = np.ascontiguousarray(canvas[:, :, ::-1].transpose(2, 0, 1)[None], np.float32) / 255.0
        frames += 1
        out = session.run(None, {name: blob})[0][0].T  # 8400 x (cx, cy, w, h, class scores[, keypoints])
        if runtime_alone:  # the ceiling: inference only, nothing decoded
            yield []
            continue
        scores = out[:, 4:4 + classes]
        best, cls = scores.max(1), scores.argmax(1)
        out, best, cls = out[best > conf], best[best > conf], cls[best > conf]
        xyxy = np.concatenate([out[:, :2] - out[:, 2:4] / 2, out[:, :2] + out[:, 2:4] / 2], 1)
        keep = nms(xyxy + cls[:, None] * 7680.0, best, iou)[:max_det]  # offset by class: NMS per class
        xyxy = (xyxy[keep] - [left, top, left, top]) / scale
        xyxy = np.clip(xyxy, 0, [w, h, w, h])
        yield [[*map(float, box), float(s), float(c)] for box, s, c in zip(xyxy, best[keep], cls[keep])]
    cap.release()


def ultralytics_loop(model: str, clip: str, threads: int, task: str, conf: float = 0.25, iou: float = 0.7,
                     max_det: int = 300, limit: int | None = None) -> Iterator[Boxes]:
    """Ultralytics' own predict(stream=True) on the ONNX file, ONNX Runtime at ``threads`` intra-op threads.

    Ultralytics gives ONNX Runtime no thread count (its ONNX backend opens the session with default
    options: one thread per physical core) and has no setting for it, so the session is opened with the
    same SessionOptions the plain loop uses; torch, which does Ultralytics' pre- and postprocessing, gets
    the same thread count."""
    import onnxruntime
    import torch

    torch.set_num_threads(threads)

    class Session(onnxruntime.InferenceSession):
        def __init__(self, path, sess_options=None, *args, **kwargs):
            sess_options = sess_options or onnxruntime.SessionOptions()
            sess_options.intra_op_num_threads = threads
            super().__init__(path, sess_options, *args, **kwargs)

    onnxruntime.InferenceSession = Session
    from ultralytics import YOLO

    results = YOLO(model, task=task).predict(clip, stream=True, conf=conf, iou=iou, max_det=max_det, device="cpu",
                                             verbose=False)
    for index, result in enumerate(results):
        if limit is not None and index >= limit:
            break
        boxes = result.boxes
        yield [[*map(float, box), float(s), float(c)]
               for box, s, c in zip(boxes.xyxy.numpy(), boxes.conf.numpy(), boxes.cls.numpy())]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("program", choices=("plain", "ultralytics", "runtime"))
    parser.add_argument("model")
    parser.add_argument("clip")
    parser.add_argument("--threads", type=int, required=True)
    parser.add_argument("--conf", type=float, default=0.25)
    parser.add_argument("--iou", type=float, default=0.7)
    parser.add_argument("--max-det", type=int, default=300)
    parser.add_argument("--limit", type=int)
    parser.add_argument("--task", default="detect", help="ultralytics: the model's task (pose, detect)")
    args = parser.parse_args(argv)
    common = {"conf": args.conf, "iou": args.iou, "max_det": args.max_det, "limit": args.limit}
    if args.program in ("plain", "runtime"):
        frames = plain_loop(args.model, args.clip, args.threads, **common, runtime_alone=args.program == "runtime")
    else:
        frames = ultralytics_loop(args.model, args.clip, args.threads, args.task, **common)
    for index, boxes in enumerate(frames):
        sys.stdout.write(json.dumps({"frame": index, "boxes": [[round(v, 2) for v in box] for box in boxes]}) + "\n")
        sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Find faces with Ultraface (ONNX): boxes in the source frame's own pixels, optionally drawn and saved.

    python examples/face_detector.py                                  # camera, or a sample clip without one
    python examples/face_detector.py --source group.jpg --save-annotated out/
    python examples/face_detector.py --source lobby.mp4 --score-threshold 0.8

Prints "frame N: K face(s): (x1,y1)-(x2,y2) score; ..." for the first frame, whenever the number of
faces changes, and at most every 2 s otherwise. With --save-annotated DIR the frames it reports are
also written there as JPEGs with the boxes drawn.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from _common import REPORT_EVERY_S, Every, add_common_args, assets, pick_source, summary

import edgeinfer
from edgeinfer.capture import open_source

MODEL = "models/ultraface_rfb_320.onnx"
# Ultraface scores two classes; the decoder skips class 0 (background)
LABELS = edgeinfer.Labels({0: "background", 1: "face"})
PHOTOS = ["grace_hopper.bmp", "face.jpg"]
GREEN = (0, 255, 0)  # OpenCV frames are BGR


def describe(detections: edgeinfer.Detections) -> str:
    boxes = "; ".join(f"({d.box[0]:.0f},{d.box[1]:.0f})-({d.box[2]:.0f},{d.box[3]:.0f}) {d.score:.2f}"
                      for d in detections)
    return f"{len(detections)} face(s)" + (f": {boxes}" if boxes else "")


def annotate(frame, detections: edgeinfer.Detections):
    """Draw the boxes on the frame (the pipeline's copy of it, so drawing in place is fine)."""
    import cv2

    for d in detections:
        x1, y1, x2, y2 = (round(v) for v in d.box)
        cv2.rectangle(frame, (x1, y1), (x2, y2), GREEN, 2)
        cv2.putText(frame, f"{d.score:.2f}", (x1, max(12, y1 - 5)), cv2.FONT_HERSHEY_SIMPLEX, 0.5, GREEN, 1,
                    cv2.LINE_AA)
    return frame


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_common_args(parser)
    parser.add_argument("--score-threshold", type=float, default=0.7, help="drop faces scored below this")
    parser.add_argument("--save-annotated", type=Path, metavar="DIR", help="write the reported frames, boxes "
                        "drawn, to DIR/frame_NNNNNN.jpg")
    args = parser.parse_args(argv)
    folder = assets()
    if args.save_annotated:
        args.save_annotated.mkdir(parents=True, exist_ok=True)

    source = open_source(pick_source(args.source, PHOTOS, same_size=True))
    # task="detect" thresholds the scores, runs NMS and maps boxes back through the letterbox to the
    # source frame's pixels; keep_frames=True hands us a copy of each frame to draw on (costs a copy,
    # so only when we need it).
    with source, edgeinfer.Pipeline(folder / MODEL, source, task="detect", labels=LABELS, delegate=args.delegate,
                                    policy="latest" if source.live else "every", max_frames=args.max_frames,
                                    score_threshold=args.score_threshold,
                                    keep_frames=args.save_annotated is not None) as pipeline:
        print(f"model: {MODEL} on {pipeline.engine.description}, source: {source.description}", file=sys.stderr)
        every = Every(REPORT_EVERY_S)
        last_count = None
        saved = 0
        try:
            for result in pipeline:
                faces = result.result
                if not every.due() and len(faces) == last_count:  # report changes, and a line every 2 s
                    continue
                last_count = len(faces)
                print(f"frame {result.frame_id}: {describe(faces)}")
                if args.save_annotated:
                    import cv2

                    path = args.save_annotated / f"frame_{result.frame_id:06d}.jpg"
                    cv2.imwrite(str(path), annotate(result.frame, faces))
                    saved += 1
        except KeyboardInterrupt:
            pass
        print(summary(pipeline.stats))
        if args.save_annotated:
            print(f"saved {saved} annotated frame(s) in {args.save_annotated}")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except edgeinfer.EdgeInferError as exc:
        sys.exit(f"error: {exc}")

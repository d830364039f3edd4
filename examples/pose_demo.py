#!/usr/bin/env python3
"""Track one person's body keypoints with MoveNet Lightning: 17 points in source pixels, a skeleton drawn.

A multi-person pose model (Ultralytics YOLO pose) gives the same kind of result: one Detection with keypoints
per person; MoveNet's is a list of one.

    python examples/pose_demo.py                                  # camera, or a sample clip without one
    python examples/pose_demo.py --source workout.mp4 --save-annotated out/

For the first frame, and at most every 2 s after it, prints the pose score and a table of the
keypoints (name, x, y, score); keypoints under --min-score are marked "low". With
--save-annotated DIR those frames are also written there with the skeleton drawn.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from _common import REPORT_EVERY_S, Every, add_common_args, assets, pick_source, summary

import edgeinfer
from edgeinfer.capture import open_source

MODEL = "models/movenet_single_pose_lightning_ptq.tflite"
PHOTOS = ["squat.bmp"]
# pairs of keypoints joined by a bone (MoveNet / COCO names)
SKELETON = [
    ("left_shoulder", "right_shoulder"), ("left_shoulder", "left_elbow"), ("left_elbow", "left_wrist"),
    ("right_shoulder", "right_elbow"), ("right_elbow", "right_wrist"), ("left_shoulder", "left_hip"),
    ("right_shoulder", "right_hip"), ("left_hip", "right_hip"), ("left_hip", "left_knee"),
    ("left_knee", "left_ankle"), ("right_hip", "right_knee"), ("right_knee", "right_ankle"),
    ("nose", "left_eye"), ("nose", "right_eye"), ("left_eye", "left_ear"), ("right_eye", "right_ear"),
]


def table(pose: edgeinfer.Detection, min_score: float) -> str:
    rows = [f"  {k.name:<15} {k.x:7.1f} {k.y:7.1f}  {k.score:.2f}" + ("  low" if k.score < min_score else "")
            for k in pose.keypoints]
    return "\n".join(rows)


def annotate(frame, pose: edgeinfer.Detection, min_score: float):
    """Bones between confident keypoints, and a dot on each confident keypoint."""
    import cv2

    for a, b in SKELETON:
        ka, kb = pose.keypoint(a), pose.keypoint(b)
        if ka.score >= min_score and kb.score >= min_score:
            cv2.line(frame, (round(ka.x), round(ka.y)), (round(kb.x), round(kb.y)), (255, 200, 0), 2, cv2.LINE_AA)
    for k in pose.keypoints:
        if k.score >= min_score:
            cv2.circle(frame, (round(k.x), round(k.y)), 4, (0, 0, 255), -1, cv2.LINE_AA)
    return frame


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_common_args(parser)
    parser.add_argument("--min-score", type=float, default=0.3,
                        help="keypoints below this confidence are not drawn (default 0.3)")
    parser.add_argument("--save-annotated", type=Path, metavar="DIR",
                        help="write the reported frames, skeleton drawn, to DIR/frame_NNNNNN.jpg")
    args = parser.parse_args(argv)
    folder = assets()
    if args.save_annotated:
        args.save_annotated.mkdir(parents=True, exist_ok=True)

    source = open_source(pick_source(args.source, PHOTOS, same_size=True))
    # task="pose" letterboxes the frame into MoveNet's 192x192 input (no stretching of the body) and
    # maps every keypoint back to the frame's pixels
    with source, edgeinfer.Pipeline(folder / MODEL, source, task="pose", delegate=args.delegate,
                                    policy="latest" if source.live else "every", max_frames=args.max_frames,
                                    keep_frames=args.save_annotated is not None) as pipeline:
        print(f"model: {MODEL} on {pipeline.engine.description}, source: {source.description}", file=sys.stderr)
        every = Every(REPORT_EVERY_S)
        saved = 0
        try:
            for result in pipeline:
                if not every.due():
                    continue
                if not result.result:  # no person
                    continue
                pose = result.result[0]  # a single-pose model: a list of one person
                confident = sum(k.score >= args.min_score for k in pose.keypoints)
                print(f"frame {result.frame_id}: pose score {pose.score:.2f}, "
                      f"{confident}/{len(pose.keypoints)} keypoints >= {args.min_score:g}")
                print(table(pose, args.min_score))
                if args.save_annotated:
                    import cv2

                    path = args.save_annotated / f"frame_{result.frame_id:06d}.jpg"
                    cv2.imwrite(str(path), annotate(result.frame, pose, args.min_score))
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

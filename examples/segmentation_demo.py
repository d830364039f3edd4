#!/usr/bin/env python3
"""Label every pixel with DeepLab v3 (PASCAL VOC classes) and say which classes cover the frame.

    python examples/segmentation_demo.py                          # camera, or a sample clip without one
    python examples/segmentation_demo.py --source street.mp4 --save-annotated out/

Prints "frame N: dog 48%, background 48%, sheep 4%" for the first frame, whenever the set of
classes covering at least --min-fraction of the frame changes, and at most every 2 s otherwise.
With --save-annotated DIR those frames are also written there with a colour overlay per class.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from _common import REPORT_EVERY_S, Every, add_common_args, assets, pick_source, summary

import edgeinfer
from edgeinfer.capture import open_source

MODEL = "models/deeplabv3_mnv2_dm05_pascal_quant.tflite"
LABELS = "labels/pascal_voc_segmentation_labels.txt"
PHOTOS = ["dog_segmentation.bmp"]


def voc_palette():
    """The PASCAL VOC colour map (256 x BGR): class i gets the colour the VOC tools give it."""
    import numpy as np

    palette = np.zeros((256, 3), np.uint8)
    for i in range(256):
        c, r, g, b = i, 0, 0, 0
        for shift in range(7, -1, -1):  # spread the bits of the class id over the three channels
            r |= (c & 1) << shift
            g |= ((c >> 1) & 1) << shift
            b |= ((c >> 2) & 1) << shift
            c >>= 3
        palette[i] = (b, g, r)
    return palette


def covering(seg: edgeinfer.Segmentation, min_fraction: float) -> list[tuple[str, float]]:
    """(label, share of the frame) of the classes covering at least ``min_fraction``, largest first."""
    found = [(label, f) for label, f in zip(seg.labels, seg.fractions) if f >= min_fraction]
    return sorted(found, key=lambda item: -item[1])


def overlay(frame, seg: edgeinfer.Segmentation, palette):
    """Blend each pixel's class colour into the frame; background (class 0) stays as it was."""
    import cv2

    colours = palette[seg.mask]  # HxWx3: the mask is already in the frame's size
    blended = cv2.addWeighted(frame, 0.4, colours, 0.6, 0.0)
    foreground = seg.mask != 0
    frame[foreground] = blended[foreground]
    return frame


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_common_args(parser)
    parser.add_argument("--min-fraction", type=float, default=0.01,
                        help="name the classes covering at least this share of the frame (default 0.01)")
    parser.add_argument("--save-annotated", type=Path, metavar="DIR",
                        help="write the reported frames with a colour overlay to DIR/frame_NNNNNN.jpg")
    args = parser.parse_args(argv)
    folder = assets()
    if args.save_annotated:
        args.save_annotated.mkdir(parents=True, exist_ok=True)
    palette = voc_palette()

    source = open_source(pick_source(args.source, PHOTOS, same_size=True))
    # task="segment" hands back the class map already warped to the frame's size (Segmentation.mask,
    # uint8 class ids) with the classes present and their share of the pixels
    with source, edgeinfer.Pipeline(folder / MODEL, source, task="segment", labels=folder / LABELS,
                                    delegate=args.delegate, policy="latest" if source.live else "every",
                                    max_frames=args.max_frames,
                                    keep_frames=args.save_annotated is not None) as pipeline:
        print(f"model: {MODEL} on {pipeline.engine.description}, source: {source.description}", file=sys.stderr)
        every = Every(REPORT_EVERY_S)
        shown: set[str] | None = None
        saved = 0
        try:
            for result in pipeline:
                classes = covering(result.result, args.min_fraction)
                names = {label for label, _ in classes}
                if not every.due() and names == shown:
                    continue
                shown = names
                print(f"frame {result.frame_id}: " + ", ".join(f"{label} {f:.0%}" for label, f in classes))
                if args.save_annotated:
                    import cv2

                    path = args.save_annotated / f"frame_{result.frame_id:06d}.jpg"
                    cv2.imwrite(str(path), overlay(result.frame, result.result, palette))
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

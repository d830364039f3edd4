#!/usr/bin/env python3
"""Classify what a camera sees with MobileNet v2: the Pipeline's iterator style, with a live status line.

    python examples/camera_classifier.py                   # /dev/video0, or a sample clip without a camera
    python examples/camera_classifier.py --source clip.mp4 --max-frames 300
    python examples/camera_classifier.py --source rtsp://user:pass@cam.local/stream

Prints a line each time the confident best guess changes ("frame 12: macaw (1.00)"), a status line
that redraws itself on a terminal (one every 5 s when the output is piped), and a summary at the end.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import time

from _common import add_common_args, assets, pick_source, summary

import edgeinfer
from edgeinfer.capture import open_source

MODEL = "models/mobilenet_v2_1.0_224_quant.tflite"
LABELS = "labels/imagenet_labels.txt"
PHOTOS = ["parrot.jpg", "cat.bmp", "grace_hopper.bmp"]  # what the sample clip shows, 10 frames each


class StatusLine:
    """fps, latency and the best guess: redrawn in place on a terminal, a plain line every 5 s otherwise."""

    def __init__(self) -> None:
        self.tty = sys.stdout.isatty()
        self.period = 0.25 if self.tty else 5.0
        self.next = time.monotonic() + self.period

    def update(self, pipeline: edgeinfer.Pipeline, result: edgeinfer.FrameResult) -> None:
        now = time.monotonic()
        if now < self.next:
            return
        self.next = now + self.period
        window = pipeline.take_window()  # figures since the previous call: a live fps, not a lifetime average
        best = result.result[0]
        line = (f"frame {result.frame_id}  {window.fps:5.1f} fps  latency {window.stages['latency']['p50']:5.1f} ms  "
                f"dropped {pipeline.dropped}  {best.label} {best.score:.2f}")
        if self.tty:
            width = shutil.get_terminal_size().columns - 1
            print("\r\033[K" + line[:width], end="", flush=True)
        else:
            print(line)

    def clear(self) -> None:
        """Make room for a normal line."""
        if self.tty:
            print("\r\033[K", end="")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_common_args(parser)
    parser.add_argument("--min-score", type=float, default=0.5,
                        help="announce a new best guess only at this score or above (default 0.5)")
    args = parser.parse_args(argv)
    folder = assets()

    source = open_source(pick_source(args.source, PHOTOS, frames_per_image=10))
    # A live camera runs at its own pace: keep only the newest frame and count what is dropped.
    # A file can wait for us: process every frame.
    policy = "latest" if source.live else "every"
    with source, edgeinfer.Pipeline(folder / MODEL, source, labels=folder / LABELS, delegate=args.delegate,
                                    policy=policy, max_frames=args.max_frames, top_k=3) as pipeline:
        print(f"model: {MODEL} on {pipeline.engine.description}, source: {source.description}", file=sys.stderr)
        if pipeline.engine.fallback_reason:
            print(f"note: {pipeline.engine.fallback_reason}", file=sys.stderr)
        status = StatusLine()
        shown = None
        try:
            for result in pipeline:  # one FrameResult per frame, in order; leaving the loop stops the pipeline
                best = result.result[0]  # top-k Classification list, best first
                if best.score >= args.min_score and best.label != shown:
                    shown = best.label
                    status.clear()
                    print(f"frame {result.frame_id}: {best.label} ({best.score:.2f})")
                status.update(pipeline, result)
        except KeyboardInterrupt:
            pass  # Ctrl-C: fall through to the summary; the with-block closes camera and model
        status.clear()
        print(summary(pipeline.stats))
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except edgeinfer.EdgeInferError as exc:  # a camera that cannot be opened, a model that does not load, ...
        sys.exit(f"error: {exc}")

#!/usr/bin/env python3
"""The callback style: the pipeline runs in the background while the main thread does its own work.

    python examples/callback_worker.py                             # camera, or the sample clip on a loop
    python examples/callback_worker.py --interval 5 --report report.json
    python examples/callback_worker.py --max-frames 200            # stop by itself

The pipeline calls on_result() in its inference thread for every frame. That callback does as
little as possible: it hands the result over through a bounded queue (never blocking the
inference thread: when the queue is full the result is counted and dropped) and updates counters
under a lock. The main thread runs a periodic side job -- here, every --interval seconds, it drains
the queue, tallies labels and writes a JSON report atomically -- until Ctrl-C / SIGTERM or the end
of the run. Shutdown is clean either way: stop the pipeline, drain what is left, write the last
report, close.
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import signal
import sys
import threading
import time
from collections import Counter
from pathlib import Path

from _common import add_common_args, assets, pick_source, summary

import edgeinfer
from edgeinfer.capture import open_source

MODEL = "models/mobilenet_v1_0.25_128_quant.tflite"  # the tiny one: leaves CPU for the main thread's work
LABELS = "labels/imagenet_labels.txt"
PHOTOS = ["parrot.jpg", "cat.bmp", "grace_hopper.bmp"]


class Handoff:
    """What the inference thread shares with the main thread: a bounded queue plus counters under a lock."""

    def __init__(self, size: int) -> None:
        self.results: queue.Queue[edgeinfer.FrameResult] = queue.Queue(maxsize=size)
        self.lock = threading.Lock()
        self.seen = 0  # results the callback got
        self.overflow = 0  # results dropped because the main thread fell behind
        self.last_label: str | None = None

    def on_result(self, result: edgeinfer.FrameResult) -> None:
        """Runs in the pipeline's inference thread: keep it short and never block it."""
        with self.lock:
            self.seen += 1
            self.last_label = result.result[0].label
        try:
            self.results.put_nowait(result)
        except queue.Full:
            with self.lock:
                self.overflow += 1

    def snapshot(self) -> tuple[int, int, str | None]:
        with self.lock:
            return self.seen, self.overflow, self.last_label


class Reporter:
    """The main thread's periodic job: tally the labels handed over and write a report file."""

    def __init__(self, handoff: Handoff, path: Path | None) -> None:
        self.handoff = handoff
        self.path = path
        self.tally: Counter[str] = Counter()
        self.handled = 0
        self.runs = 0

    def run_once(self, pipeline: edgeinfer.Pipeline) -> None:
        while True:  # drain without waiting: whatever arrived since the last run
            try:
                result = self.handoff.results.get_nowait()
            except queue.Empty:
                break
            self.tally[result.result[0].label] += 1
            self.handled += 1
        self.runs += 1
        seen, overflow, last = self.handoff.snapshot()
        top = ", ".join(f"{label} x{n}" for label, n in self.tally.most_common(3)) or "-"
        print(f"report {self.runs}: {seen} frames so far, {pipeline.stats.fps:.1f} fps, last {last}, "
              f"most seen: {top}", flush=True)
        if self.path is not None:
            report = {"time": time.time(), "frames": seen, "handled": self.handled, "overflow": overflow,
                      "labels": dict(self.tally.most_common())}
            partial = self.path.with_name(f".{self.path.name}.partial")
            partial.write_text(json.dumps(report, indent=2))
            os.replace(partial, self.path)  # readers never see half a report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_common_args(parser)
    parser.add_argument("--interval", type=float, default=1.0, help="seconds between side-job runs (default 1)")
    parser.add_argument("--report", type=Path, help="write the JSON report here at every run")
    parser.add_argument("--queue-size", type=int, default=256, help="results the hand-off queue holds")
    parser.add_argument("--max-fps", type=float, default=30.0,
                        help="run inference at most this often (default 30: a file then plays like a camera)")
    args = parser.parse_args(argv)
    folder = assets()

    # SIGTERM (systemd, docker stop, kill) and Ctrl-C both ask the main loop to finish cleanly
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())

    handoff = Handoff(args.queue_size)
    reporter = Reporter(handoff, args.report)
    source = open_source(pick_source(args.source, PHOTOS, frames_per_image=10), loop=True)  # a file restarts
    with source, edgeinfer.Pipeline(folder / MODEL, source, labels=folder / LABELS, delegate=args.delegate,
                                    policy="latest" if source.live else "every", max_frames=args.max_frames,
                                    max_fps=args.max_fps, threads=1, top_k=1) as pipeline:
        print(f"model: {MODEL} on {pipeline.engine.description}, source: {source.description}", file=sys.stderr)
        pipeline.start(handoff.on_result)  # returns at once; results go to the callback
        print("started; Ctrl-C or SIGTERM stops", flush=True)
        # the main thread is free: wake every --interval for the side job, at once on a signal; leave
        # when the run has ended by itself (max_frames reached, the source ended, or the pipeline failed)
        while not stop.wait(args.interval) and not pipeline.wait(0):
            reporter.run_once(pipeline)
        pipeline.stop()  # joins the threads: no callback runs after this
        reporter.run_once(pipeline)  # the results handed over since the last run
        if pipeline.error is not None:
            print(f"error: the pipeline failed: {pipeline.error}", file=sys.stderr)
            return 1
        seen, overflow, _ = handoff.snapshot()
        print(f"stopped: {seen} frames processed, {reporter.handled} handled by the main thread, {overflow} "
              f"dropped from the queue; side job ran {reporter.runs} times")
        print(summary(pipeline.stats))
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except edgeinfer.EdgeInferError as exc:
        sys.exit(f"error: {exc}")

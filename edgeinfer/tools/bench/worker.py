"""One benchmark worker process: loads one model on one delegate and times it on request.

Run by :mod:`edgeinfer.tools.bench.client` as ``python -m edgeinfer.tools.bench.worker``. Each
worker is a fresh process, so its load is a true cold start and its peak RSS belongs to that
delegate alone. Commands arrive as JSON lines on stdin; replies leave as JSON lines on the
original stdout (fd 1 is pointed at stderr, so whatever a native runtime prints cannot corrupt
the protocol).

    {"op": "load", "model": PATH, "delegate": NAME, "threads": N, "cache_dir": DIR|null, "warmup_s": S}
        -> {"ok": true, "load_ms", "first_ms", "cold_ms", "first_at" (time.time() of the first result),
            "description", "rss_before_mb", "rss_after_mb"}
    {"op": "run", "seconds": S}
        -> {"ok": true, "latencies_ms": [...], "wall_s", "cpu_s"}
    {"op": "pipeline", "source": SRC, "task": TASK, "decoder": DECODER, "seconds": S}
        -> {"ok": true, "stages": {stage: [ms, ...]}, "frames", "dropped", "elapsed_s", "cpu_s", "task", "layout"}
       (frames: every result; the stages time those after the first SETTLE, and the run goes on past S
       until one is timed)
    {"op": "stats"} -> {"ok": true, "peak_rss_mb"}
    {"op": "quit"}
Any failure -> {"ok": false, "error": TYPE, "message": TEXT}.
"""

from __future__ import annotations

import json
import os
import resource
import sys
import threading
import time

from ...pipeline.stats import STAGES
from ...runtime.timing import SETTLE  # untimed invokes at the start of every timed block

#: how long a pipeline round may run past its seconds to time one frame beyond its settle frames
FIRST_TIMED_FRAME_S = 60.0


def _peak_rss_mb() -> float:
    # ru_maxrss is in KiB on Linux (bytes on macOS)
    scale = 1 / (1024 * 1024) if sys.platform == "darwin" else 1 / 1024
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * scale, 2)


def _current_rss_mb() -> float:
    try:
        with open("/proc/self/statm") as fh:
            pages = int(fh.read().split()[1])
        return round(pages * os.sysconf("SC_PAGE_SIZE") / (1024 * 1024), 2)
    except (OSError, ValueError, IndexError):
        return _peak_rss_mb()


class _Worker:
    """The one engine this process holds, and the commands it serves on it."""

    def __init__(self) -> None:
        self.engine = None
        self.feed = None
        self.out = None

    def load(self, cmd: dict) -> dict:
        import numpy as np

        from ...runtime.delegates.registry import split_delegate
        from ...runtime.selection import load

        rss_before = _current_rss_mb()
        name, _device = split_delegate(cmd["delegate"])
        if name == "openvino" and cmd.get("cache_dir"):
            from ...runtime.delegates.openvino import shared_core

            shared_core().set_property({"CACHE_DIR": cmd["cache_dir"]})
        start = time.perf_counter()
        engine = self.engine = load(cmd["model"], cmd["delegate"], threads=cmd.get("threads"))
        loaded = time.perf_counter()
        self.feed = [_sample_input(engine, i) for i in range(len(engine.inputs))]
        for index, data in enumerate(self.feed):
            np.copyto(engine.input_view(index), data)
        engine.invoke()
        first = time.perf_counter()
        first_at = time.time()
        self.out = [np.empty_like(engine.output_view(i)) for i in range(len(engine.outputs))]
        deadline = time.perf_counter() + float(cmd.get("warmup_s", 0.0))
        while time.perf_counter() < deadline:
            engine.invoke()
        return {
            "ok": True, "load_ms": (loaded - start) * 1000, "first_ms": (first - loaded) * 1000,
            "cold_ms": (first - start) * 1000, "first_at": first_at, "description": engine.description,
            "rss_before_mb": rss_before, "rss_after_mb": _current_rss_mb(),
        }

    def run(self, cmd: dict) -> dict:
        import numpy as np

        engine = self.engine
        if engine is None:
            return {"ok": False, "error": "BenchmarkError", "message": "run before load"}
        views_in = [engine.input_view(i) for i in range(len(self.feed))]
        pairs_in = list(zip(views_in, self.feed))
        pairs_out = [(self.out[i], engine.output_view(i)) for i in range(len(self.out))]
        invoke = engine.invoke
        copyto = np.copyto
        clock = time.perf_counter
        latencies = []
        append = latencies.append
        for _ in range(SETTLE):  # untimed: another worker's threads may still be spinning
            invoke()
        cpu0 = time.process_time()
        wall0 = clock()
        deadline = wall0 + float(cmd["seconds"])
        while True:
            start = clock()
            for view, data in pairs_in:  # what an application does per frame: write, invoke, read
                copyto(view, data)
            invoke()
            for out, view in pairs_out:
                copyto(out, view)
            end = clock()
            append((end - start) * 1000)
            if end >= deadline:
                break
        return {"ok": True, "latencies_ms": [round(v, 4) for v in latencies], "wall_s": clock() - wall0,
                "cpu_s": time.process_time() - cpu0}

    def pipeline(self, cmd: dict) -> dict:
        """The whole pipeline on the loaded engine for ``seconds``: per-frame stage timings (ms)."""
        from ...pipeline.core import Pipeline

        if self.engine is None:
            return {"ok": False, "error": "BenchmarkError", "message": "pipeline before load"}
        samples: dict[str, list[float]] = {stage: [] for stage in STAGES}
        seen = [0]
        timed = threading.Event()

        def on_result(result) -> None:
            seen[0] += 1
            if seen[0] <= SETTLE:  # the first frames carry thread start-up and the first decode
                return
            timings = result.timings
            for stage, values in samples.items():
                values.append(round(float(getattr(timings, stage)), 4))
            timed.set()

        pipe = Pipeline(self.engine, cmd["source"], task=cmd.get("task"), decoder=cmd.get("decoder"),
                        loop=True)  # None: the model's task, the layout its outputs fit
        try:
            cpu0 = time.process_time()
            start = time.perf_counter()
            pipe.start(on_result)
            seconds = float(cmd["seconds"])
            pipe.wait(seconds)
            # A round too short for this machine to get past the settle frames would report frames with no
            # stage figure: it runs on until one frame is timed (or the run ends: an error, a source ended).
            deadline = start + seconds + FIRST_TIMED_FRAME_S
            while not timed.is_set() and time.perf_counter() < deadline and not pipe.wait(0.02):
                pass
            pipe.stop()
            elapsed = time.perf_counter() - start
            cpu = time.process_time() - cpu0
            if pipe.error is not None:
                raise pipe.error
            dropped = pipe.stats.dropped
            task = pipe.options.task
            layout = pipe.reading.layout.name
        finally:
            pipe.close()
        return {"ok": True, "stages": samples, "frames": seen[0], "dropped": dropped, "elapsed_s": elapsed,
                "cpu_s": cpu, "task": task, "layout": layout}

    def close(self) -> None:
        if self.engine is not None:
            self.engine.close()
            self.engine = None


def _sample_input(engine, index: int):
    """A deterministic input: a noise image through the real preprocessor when the input is an image."""
    import numpy as np

    from ...pipeline.preprocess import Preprocessor, input_geometry

    spec = engine.inputs[index]
    view = engine.input_view(index)
    rng = np.random.default_rng(index)
    try:
        height, width, _channels, _layout = input_geometry(spec)
        frame = rng.integers(0, 256, (max(height, 1) * 2, max(width, 1) * 2, 3), dtype=np.uint8)
        data = np.empty_like(view)
        Preprocessor(spec, (frame.shape[1], frame.shape[0]))(frame, data)
        return data
    except (ValueError, KeyError):
        if view.dtype.kind == "f":
            return rng.standard_normal(view.shape).astype(view.dtype)
        if view.dtype.kind in "iu":
            info = np.iinfo(view.dtype)
            return rng.integers(max(info.min, -128), min(info.max, 255) + 1, view.shape).astype(view.dtype)
        return np.zeros_like(view)


def main() -> int:
    """Serve commands from stdin until ``quit`` or EOF."""
    protocol = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # native prints to stdout land on stderr
    sys.stdout = sys.stderr
    worker = _Worker()

    def reply(data: dict) -> None:
        protocol.write(json.dumps(data) + "\n")
        protocol.flush()

    try:
        for line in sys.stdin:
            if not line.strip():
                continue
            cmd = json.loads(line)
            op = cmd.get("op")
            if op == "quit":
                break
            try:
                if op == "load":
                    reply(worker.load(cmd))
                elif op == "run":
                    reply(worker.run(cmd))
                elif op == "pipeline":
                    reply(worker.pipeline(cmd))
                elif op == "stats":
                    reply({"ok": True, "peak_rss_mb": _peak_rss_mb()})
                else:
                    reply({"ok": False, "error": "ValueError", "message": f"unknown op {op!r}"})
            except Exception as exc:  # reported to the parent, which raises the edgeinfer error
                reply({"ok": False, "error": type(exc).__name__, "message": " ".join(str(exc).split())})
    finally:
        worker.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())

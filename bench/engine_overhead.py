#!/usr/bin/env python3
"""What does the edgeinfer Engine cost over calling the runtime directly?

For each delegate, in one process and one run, the raw vendor call loop and the same model through
``edgeinfer.Engine`` are timed side by side:

    xnnpack      LiteRT           interpreter.set_tensor / invoke / get_tensor      (.tflite)
    onnxruntime  ONNX Runtime     session.run(None, {name: array})                  (.onnx)
    openvino     OpenVINO         infer_request.infer({0: array})                   (.tflite)
    edgeinfer    (each of them)   np.copyto(engine.input_view(0), frame); engine.invoke();
                                  np.copyto(out, engine.output_view(0))

Every loop gets the same model, the same input frame and the same thread count. The six loops run
in blocks of about equal time, interleaved over several repetitions with a rotating order, so
noise from elsewhere hits all of them alike. Reported: the median per-call latency of each loop
and the ratio edgeinfer / raw per delegate (goal: <= 1.03).

    python bench/engine_overhead.py [--threads N] [--reps 15] [--block-seconds 0.25] [--json]

Run it on a quiet machine for figures you publish; the ratio is what matters, not the ms.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

GOAL = 1.03
#: untimed iterations at the start of each block (runtimes' thread pools spin for a while after a run)
SETTLE = 3
MODELS = {
    "xnnpack": "mobilenet_v2_1.0_224_quant.tflite",
    "onnxruntime": "mobilenet_v2_1.0_224_quant.onnx",
    "openvino": "mobilenet_v2_1.0_224_quant.tflite",
}


def assets_dir() -> Path:
    return Path(os.environ.get("EDGEINFER_ASSETS", REPO.parent / "shared" / "assets")).resolve()


def frame_for(size: int):
    """A real photo, resized to the model input: uint8 1 x size x size x 3 RGB."""
    import cv2
    import numpy as np

    image = cv2.imread(str(assets_dir() / "images" / "parrot.jpg"))
    rgb = cv2.cvtColor(cv2.resize(image, (size, size)), cv2.COLOR_BGR2RGB)
    return np.ascontiguousarray(rgb[None])


# ------------------------------------------------------------------------------ raw vendor loops

def raw_litert(model: Path, threads: int, frame):
    from edgeinfer.runtime.delegates.xnnpack import import_litert

    litert = import_litert()
    interpreter = litert.Interpreter(model_path=str(model), num_threads=threads)
    interpreter.allocate_tensors()
    in_index = interpreter.get_input_details()[0]["index"]
    out_index = interpreter.get_output_details()[0]["index"]

    def step():
        interpreter.set_tensor(in_index, frame)
        interpreter.invoke()
        return interpreter.get_tensor(out_index)

    return step


def raw_onnxruntime(model: Path, threads: int, frame):
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.log_severity_level = 3
    session = ort.InferenceSession(str(model), sess_options=options, providers=["CPUExecutionProvider"])
    name = session.get_inputs()[0].name
    feeds = {name: frame}

    def step():
        return session.run(None, feeds)[0]

    return step


def raw_openvino(model: Path, threads: int, frame):
    import openvino as ov

    core = ov.Core()
    compiled = core.compile_model(str(model), "CPU", {"PERFORMANCE_HINT": "LATENCY", "INFERENCE_NUM_THREADS": threads})
    request = compiled.create_infer_request()

    def step():
        return request.infer({0: frame})[0]

    return step


RAW = {"xnnpack": raw_litert, "onnxruntime": raw_onnxruntime, "openvino": raw_openvino}


def edgeinfer_loop(model: Path, delegate: str, threads: int, frame):
    import numpy as np

    import edgeinfer

    engine = edgeinfer.load(model, delegate, threads=threads)
    view = engine.input_view(0)
    out = np.empty_like(engine.output_view(0))
    invoke = engine.invoke
    output = engine.output_view

    def step():
        np.copyto(view, frame)
        invoke()
        np.copyto(out, output(0))
        return out

    return step, engine


# ------------------------------------------------------------------------------ measurement

def measure(loops: dict[str, callable], reps: int, block_seconds: float, progress) -> dict[str, list[float]]:
    """Per-call latencies (ms) of every loop, in interleaved blocks with a rotating order."""
    names = list(loops)
    samples = {name: [] for name in names}
    clock = time.perf_counter
    for name in names:  # warm-up: caches, thread pools, lazy allocations
        for _ in range(20):
            loops[name]()
    for rep in range(reps):
        shift = rep % len(names)  # every loop takes every position equally often
        order = names[shift:] + names[:shift]
        for name in order:
            step = loops[name]
            out = samples[name]
            for _ in range(SETTLE):  # untimed: let the previous loop's spinning worker threads go idle
                step()
            deadline = clock() + block_seconds
            while True:
                start = clock()
                step()
                end = clock()
                out.append((end - start) * 1000.0)
                if end >= deadline:
                    break
        progress(f"repetition {rep + 1}/{reps}")
    return samples


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--reps", type=int, default=15, help="interleaved repetitions")
    parser.add_argument("--block-seconds", type=float, default=0.25, help="time per loop per repetition")
    parser.add_argument("--delegate", action="append", choices=sorted(MODELS), help="only these (repeatable)")
    parser.add_argument("--json", action="store_true", help="print JSON")
    args = parser.parse_args()
    import numpy as np

    delegates = args.delegate or list(MODELS)
    models = assets_dir() / "models"
    frame = frame_for(224)
    loops = {}
    engines = []
    for delegate in delegates:
        model = models / MODELS[delegate]
        loops[f"{delegate}/raw"] = RAW[delegate](model, args.threads, frame)
        step, engine = edgeinfer_loop(model, delegate, args.threads, frame)
        loops[f"{delegate}/edgeinfer"] = step
        engines.append(engine)
        # the two loops must do the same work: same answer on the same frame
        raw_top = int(np.argmax(loops[f"{delegate}/raw"]()))
        edge_top = int(np.argmax(step()))
        if raw_top != edge_top:
            raise SystemExit(f"{delegate}: raw top-1 {raw_top} != edgeinfer top-1 {edge_top}")

    def progress(message: str) -> None:
        if not args.json:
            print(f"  {message}", file=sys.stderr, flush=True)

    samples = measure(loops, args.reps, args.block_seconds, progress)
    for engine in engines:
        engine.close()
    rows = []
    for delegate in delegates:
        raw = samples[f"{delegate}/raw"]
        edge = samples[f"{delegate}/edgeinfer"]
        raw_ms, edge_ms = statistics.median(raw), statistics.median(edge)
        rows.append({"delegate": delegate, "model": MODELS[delegate], "raw_ms": round(raw_ms, 4),
                     "edgeinfer_ms": round(edge_ms, 4), "ratio": round(edge_ms / raw_ms, 4),
                     "raw_calls": len(raw), "edgeinfer_calls": len(edge), "goal_met": edge_ms / raw_ms <= GOAL})
    summary = {"threads": args.threads, "reps": args.reps, "block_seconds": args.block_seconds,
               "load_average_1m": round(os.getloadavg()[0], 2), "goal": GOAL, "results": rows}
    if args.json:
        print(json.dumps(summary, indent=2))
        return 0
    print(f"engine overhead: median per-call latency, {args.threads} threads, {args.reps} interleaved repetitions "
          f"of {args.block_seconds:g} s per loop (load average {summary['load_average_1m']})")
    print(f"{'delegate':<12} {'model':<36} {'raw ms':>8} {'edgeinfer ms':>13} {'ratio':>7}  goal <= {GOAL}")
    for row in rows:
        verdict = "ok" if row["goal_met"] else "OVER"
        print(f"{row['delegate']:<12} {row['model']:<36} {row['raw_ms']:>8.3f} {row['edgeinfer_ms']:>13.3f} "
              f"{row['ratio']:>7.3f}  {verdict}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

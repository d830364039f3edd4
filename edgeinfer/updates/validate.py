"""``python -m edgeinfer.validate_model MODEL``: load a model, run one input, print a JSON verdict.

Run in a child process by the agent before an update goes live, so a model that crashes or hangs
its runtime cannot take the agent down. Exit code 0 and ``{"ok": true, ...}`` only when the model
loaded, ran, and produced finite outputs.
"""

from __future__ import annotations

import argparse
import json
import sys
import time


def validate(model: str, delegate: str | None) -> dict:
    """Load, fill every input with mid-range data, invoke twice, check the outputs are finite."""
    import numpy as np

    from ..runtime.selection import load

    started = time.perf_counter()
    with load(model, delegate) as engine:
        loaded_ms = (time.perf_counter() - started) * 1000
        for index in range(len(engine.inputs)):
            view = engine.input_view(index)
            if view.dtype.kind in "iu":
                info = np.iinfo(view.dtype)
                view[...] = (int(info.min) + int(info.max)) // 2
            else:
                view[...] = 0.0
        timings = []
        for _ in range(2):
            t0 = time.perf_counter()
            engine.invoke()
            timings.append((time.perf_counter() - t0) * 1000)
        finite = all(
            bool(np.isfinite(engine.output_view(i)).all()) if engine.output_view(i).dtype.kind == "f" else True
            for i in range(len(engine.outputs))
        )
        report = {"ok": finite, "delegate": engine.description, "load_ms": round(loaded_ms, 2),
                  "infer_ms": round(min(timings), 3),
                  "inputs": [list(s.shape) for s in engine.inputs],
                  "outputs": [list(s.shape) for s in engine.outputs]}
        if not finite:
            report["error"] = "the model produced NaN or infinite outputs"
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m edgeinfer.validate_model")
    parser.add_argument("model")
    parser.add_argument("--delegate")
    args = parser.parse_args(argv)
    from ..errors import EdgeInferError

    try:
        report = validate(args.model, args.delegate)
    except EdgeInferError as exc:
        report = {"ok": False, "error": " ".join(str(exc).split())}
    print(json.dumps(report))
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())

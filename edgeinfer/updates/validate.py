"""Validating a staged model in a child process, both sides.

The child, ``python -m edgeinfer.validate_model MODEL`` (:func:`main`): load a model, run one
input, print a JSON verdict. Exit code 0 and ``{"ok": true, ...}`` only when the model loaded,
ran, and produced finite outputs. The agent runs it with :func:`validate_in_subprocess` before an
update goes live, so a model that crashes or hangs its runtime cannot take the agent down.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

from ..errors import EdgeInferError, UpdateRejected

DEFAULT_VALIDATE_TIMEOUT_S = 60.0


# ---------------------------------------------------------------------------------------- the agent's side
def validate_in_subprocess(model: str | os.PathLike, *, delegate: str | None = None,
                           timeout_s: float = DEFAULT_VALIDATE_TIMEOUT_S, interpreter: str | None = None) -> dict:
    """Load ``model`` and run one input in a separate Python process; UpdateRejected unless it works.

    A model that crashes the runtime (segfault) or hangs it only takes the child down.
    ``interpreter`` defaults to this Python (another venv's python may be given).
    """
    command = [interpreter or sys.executable, "-m", "edgeinfer.validate_model", str(model)]
    if delegate:
        command += ["--delegate", delegate]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        raise UpdateRejected("validation_timeout", f"the model did not load and run within {timeout_s:.0f} s") from None
    lines = done.stdout.strip().splitlines()
    try:
        report = json.loads(lines[-1]) if lines else {}
    except ValueError:
        report = {}
    if done.returncode != 0 or not report.get("ok"):
        detail = report.get("error") or (done.stderr.strip().splitlines() or [f"exit code {done.returncode}"])[-1]
        if done.returncode < 0:
            detail = f"the runtime crashed (signal {-done.returncode})"
        raise UpdateRejected("validation_failed", detail)
    return report


# ---------------------------------------------------------------------------------------- the child's side

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
    """The child's entry point: print the verdict as one JSON line; exit code 0 only if ok."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m edgeinfer.validate_model")
    parser.add_argument("model")
    parser.add_argument("--delegate")
    args = parser.parse_args(argv)
    try:
        report = validate(args.model, args.delegate)
    except EdgeInferError as exc:
        report = {"ok": False, "error": " ".join(str(exc).split())}
    print(json.dumps(report))
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())

"""A planted runtime whose answers are wrong and which is the fastest: what the delegate probe must refuse.

``skewed`` runs the real model on ONNX Runtime, then halves every output value: a YOLO detector's boxes land
at half their coordinates and half their size (and their scores halve), a different answer on any frame with
an object. It is fast by remembering: an invoke whose input equals the previous one's returns the previous
outputs without running the model again, as a cache in an accelerator's driver could — so in the probe's
timing, where the input stays put, it beats every real runtime by a wide margin.

Registered the way a third-party delegate is, through the ``edgeinfer.delegates`` entry point
(:func:`install_entry_point` writes a dist-info folder onto a path). It names no ``packages``: its cache key
is where it is registered.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from edgeinfer import Delegate, ModelFormat
from edgeinfer.runtime.delegates.onnxruntime import OnnxRuntimeDelegate
from edgeinfer.runtime.engine import Engine

NAME = "skewed"
#: every output value is multiplied by this
FACTOR = 0.5


class SkewedEngine(Engine):
    """ONNX Runtime underneath; outputs of its own, the inner ones halved; the model run again only for a new input."""

    delegate = NAME

    def __init__(self, inner: Engine) -> None:
        super().__init__(inner.model, threads=inner.threads)
        self._inner = inner
        self._inputs, self._outputs = inner.inputs, inner.outputs
        self._input_arrays = [inner.input_view(i) for i in range(len(inner.inputs))]
        self._output_arrays = [np.empty_like(inner.output_view(i)) for i in range(len(inner.outputs))]
        self._seen: list[np.ndarray] | None = None
        #: invokes that ran the model (a new input), and all of them
        self.runs = 0
        self.invokes = 0

    def _invoke(self) -> None:
        self.invokes += 1
        if self._seen is not None and all(np.array_equal(a, b) for a, b in zip(self._input_arrays, self._seen)):
            return  # the same input as before: the same (skewed) outputs
        self._inner.invoke()
        self.runs += 1
        self._seen = [a.copy() for a in self._input_arrays]
        for mine, theirs in zip(self._output_arrays, (self._inner.output_view(i) for i in range(len(self._outputs)))):
            np.multiply(theirs, FACTOR, out=mine, casting="unsafe")

    def _close(self) -> None:
        self._inner.close()


class SkewedDelegate(Delegate):
    """``skewed``: ONNX models, always available, wrong and fast."""

    name = NAME
    formats = frozenset({ModelFormat.ONNX})

    def unavailable_reason(self, device=None, host=None):
        return None

    def load(self, model, *, threads=None, device=None):
        return SkewedEngine(OnnxRuntimeDelegate().load(model, threads=threads))


def install_entry_point(site: Path) -> Path:
    """Write the dist-info that registers ``skewed`` in the ``edgeinfer.delegates`` group under ``site``."""
    info = site / "skeweddelegate-1.0.dist-info"
    info.mkdir(parents=True, exist_ok=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: skeweddelegate\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(f"[edgeinfer.delegates]\n{NAME} = support.skewed_delegate:SkewedDelegate\n")
    return site

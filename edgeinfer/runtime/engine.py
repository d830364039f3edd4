"""The :class:`Engine` every delegate returns.

An engine owns one loaded model on one runtime. Its inputs are exposed as **writable numpy views
of the runtime's own input buffers**: preprocessing writes into ``engine.input_view(i)`` and
``invoke()`` reads from there with no copy. Outputs are views too; they are overwritten by the
next ``invoke()``, so copy what you keep (``run()`` does that for you).
"""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from typing import TYPE_CHECKING

from ..errors import ClosedError, InputMismatch
from .model import ModelInfo, TensorSpec

if TYPE_CHECKING:
    import numpy as np


class Engine(ABC):
    """One model loaded on one delegate: specs, zero-copy input/output views, invoke, close."""

    #: the delegate's registry name, e.g. ``"xnnpack"``
    delegate: str = ""

    def __init__(self, model: ModelInfo, *, threads: int | None = None, device: str | None = None) -> None:
        self.model = model
        self.threads = threads
        self.device = device
        #: why this engine is not the one first asked for (set by selection), else None
        self.fallback_reason: str | None = None
        #: the selection plan (edgeinfer.runtime.selection.Plan) that chose this engine, when selection loaded it
        self.selection = None
        self._closed = False
        self._close_lock = threading.Lock()
        self._input_arrays: list[np.ndarray] = []
        self._output_arrays: list[np.ndarray] = []
        self._inputs: tuple[TensorSpec, ...] = ()
        self._outputs: tuple[TensorSpec, ...] = ()

    # -- specs -------------------------------------------------------------------------------
    @property
    def inputs(self) -> tuple[TensorSpec, ...]:
        """Input tensor specs as the runtime sees them (shape fully resolved)."""
        return self._inputs

    @property
    def outputs(self) -> tuple[TensorSpec, ...]:
        """Output tensor specs as the runtime sees them."""
        return self._outputs

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def description(self) -> str:
        """``delegate`` or ``delegate:device`` for logs and telemetry."""
        return f"{self.delegate}:{self.device}" if self.device else self.delegate

    # -- data --------------------------------------------------------------------------------
    def input_view(self, index: int = 0) -> np.ndarray:
        """Writable view of input ``index``'s buffer; write the next frame here, then ``invoke()``."""
        self._check_open()
        return self._input_arrays[index]

    def output_view(self, index: int = 0) -> np.ndarray:
        """Read-only-by-convention view of output ``index``, valid until the next ``invoke()``."""
        self._check_open()
        return self._output_arrays[index]

    def set_input(self, data: np.ndarray, index: int = 0) -> None:
        """Copy ``data`` into input ``index`` after checking its shape and dtype."""
        view = self.input_view(index)
        spec = self._inputs[index]
        if getattr(data, "shape", None) != view.shape:
            raise InputMismatch(
                f"input {index} ({spec.name!r}) expects shape {tuple(view.shape)}, got "
                f"{tuple(getattr(data, 'shape', ()))} — resize the data to the model's input"
            )
        if data.dtype != view.dtype:
            raise InputMismatch(
                f"input {index} ({spec.name!r}) expects dtype {view.dtype}, got {data.dtype} — "
                f"convert it (and quantise with scale={spec.scale}, zero_point={spec.zero_point} if set)"
            )
        view[...] = data

    def invoke(self) -> None:
        """Run the model on what is in the input views; results land in the output views."""
        self._check_open()
        self._invoke()

    def run(self, *inputs: np.ndarray) -> list[np.ndarray]:
        """Convenience: set every input, invoke, return copies of the outputs."""
        if len(inputs) != len(self._inputs):
            raise InputMismatch(f"the model has {len(self._inputs)} input(s), {len(inputs)} given")
        for index, data in enumerate(inputs):
            self.set_input(data, index)
        self.invoke()
        return [array.copy() for array in self._output_arrays]

    # -- lifetime ----------------------------------------------------------------------------
    def close(self) -> None:
        """Release the runtime's resources. Idempotent."""
        with self._close_lock:
            if self._closed:
                return
            self._closed = True
            self._input_arrays = []
            self._output_arrays = []
            self._close()

    def __enter__(self) -> Engine:
        self._check_open()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else "open"
        return f"<{type(self).__name__} {self.description} {self.model.path} {state}>"

    def _check_open(self) -> None:
        if self._closed:
            raise ClosedError(f"engine for {self.model.path} is closed — load the model again")

    # -- for delegates -----------------------------------------------------------------------
    @abstractmethod
    def _invoke(self) -> None:
        """Run one inference (errors mapped to edgeinfer errors)."""

    @abstractmethod
    def _close(self) -> None:
        """Drop runtime objects."""

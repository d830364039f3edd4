"""The engine a pipeline runs, and everything built from it for the frames it gets.

An :class:`InferencePlan` holds what depends on (engine, frame size): one preprocessor per thread,
a staged model input per ring slot, the task's decoder and the transform back to source pixels.
:class:`ModelBinding` owns the engine, builds plans when the frame size changes, and swaps in a
new engine at a frame boundary (``Pipeline.swap_engine``).
"""

from __future__ import annotations

import logging
import threading
from typing import TYPE_CHECKING, Any

from ..errors import EdgeInferError
from .preprocess import Preprocessor, Transform, input_geometry

if TYPE_CHECKING:
    from ..capture import FrameSource
    from ..runtime.engine import Engine
    from .labels import Labels
    from .options import PipelineOptions
    from .tasks import Task

log = logging.getLogger("edgeinfer.pipeline")

#: the pytorch-ssd family (Ultraface) normalises float input as (pixel - 127) / 128
SSD_FLOAT_MEAN, SSD_FLOAT_STD = 127.0, 128.0


class InferencePlan:
    """Everything that depends on (engine, frame size): preprocessors, staged inputs, decoder."""

    __slots__ = ("decoder", "engine", "frame_shape", "gen", "native", "pre", "pre_staged", "staged", "transform",
                 "view")

    def __init__(self, gen: int, engine: Engine, frame_shape: tuple[int, ...], native: tuple[int, int] | None,
                 pre: Preprocessor, pre_staged: Preprocessor, decoder: Any, slots: int, transform: Transform) -> None:
        import numpy as np

        self.gen = gen
        self.engine = engine
        self.frame_shape = frame_shape
        self.native = native  # the source's own frame size when frames arrive reduced, else None
        # one preprocessor per thread: each owns scratch buffers, and both threads may preprocess at once
        self.pre = pre  # inference thread, into the engine's input view
        self.pre_staged = pre_staged  # capture thread, into staged[slot index]
        self.transform = transform  # frame → model input, expressed in the source's own pixels
        self.decoder = decoder
        self.view = engine.input_view(0)
        self.staged = [np.empty(self.view.shape, self.view.dtype) for _ in range(slots)]

    def fits(self, frame_shape: tuple[int, ...], native: tuple[int, int] | None) -> bool:
        """Whether this plan is the one for a frame of ``frame_shape`` decoded from ``native``."""
        return self.frame_shape == frame_shape and self.native == native


class ModelBinding:
    """The pipeline's engine (owned or borrowed), its current plan, and engine swaps."""

    def __init__(self, engine: Engine, *, owns_engine: bool, task: Task, options: PipelineOptions,
                 labels: Labels | None, source: FrameSource, slots: int) -> None:
        self.engine = engine
        self.owns_engine = owns_engine
        self.task = task
        self.labels = labels
        self.plan: InferencePlan | None = None
        self._options = options
        self._resize = options.resize or task.resize
        self._source = source
        self._slots = slots
        self._gen = 0
        self._gen_lock = threading.Lock()
        self._swap: tuple[Engine, threading.Event, list] | None = None

    # -------------------------------------------------------------------------- checks
    def check(self, engine: Engine) -> None:
        """ValueError, before anything runs, when ``engine`` cannot serve this pipeline's task."""
        if len(engine.inputs) != 1:
            raise ValueError(f"the pipeline feeds one image input; {engine.model.path} has {len(engine.inputs)}")
        input_geometry(engine.inputs[0])  # ValueError when the input is not an image
        self._decoder(engine)

    def offer_input_size(self, engine: Engine) -> None:
        """Let the source decode frames as small as the model input (MJPEG: 1/2, 1/4, 1/8 scale)."""
        if self._options.decode_reduced:
            height, width, _, _ = input_geometry(engine.inputs[0])
            self._source.prefer_min_size((width, height))

    # --------------------------------------------------------------------------- plans
    def _decoder(self, engine: Engine) -> Any:
        return self.task.decoder(engine, self.labels, self._options.decoder_settings())

    def _normalisation(self, engine: Engine, decoder: Any) -> tuple[Any, Any]:
        mean, std = self._options.mean, self._options.std
        if (mean is None and std is None and engine.inputs[0].dtype.startswith("float")
                and getattr(decoder, "layout", None) == "ssd"):
            return SSD_FLOAT_MEAN, SSD_FLOAT_STD
        return mean, std

    def build(self, engine: Engine, frame_shape: tuple[int, ...], native: tuple[int, int] | None) -> InferencePlan:
        """A new plan for ``engine`` and frames of ``frame_shape`` (decoded from ``native`` when reduced)."""
        decoder = self._decoder(engine)
        mean, std = self._normalisation(engine, decoder)
        size = (frame_shape[1], frame_shape[0])
        pre, pre_staged = (Preprocessor(engine.inputs[0], size, resize=self._resize, mean=mean, std=std)  # type: ignore[arg-type]
                           for _ in range(2))
        # results are in the source's own pixels even when its frames arrive reduced
        transform = pre.transform if native is None else pre.transform.for_source_size(*native)
        with self._gen_lock:
            self._gen += 1
            gen = self._gen
        return InferencePlan(gen, engine, frame_shape, native, pre, pre_staged, decoder, self._slots, transform)

    def plan_for(self, frame_shape: tuple[int, ...], native: tuple[int, int] | None) -> InferencePlan:
        """Inference thread: the plan for this frame, rebuilt when the frame size changed."""
        plan = self.plan
        if plan is None or not plan.fits(frame_shape, native):
            plan = self.plan = self.build(self.engine, frame_shape, native)
        return plan

    # --------------------------------------------------------------------------- swaps
    @property
    def swap_pending(self) -> bool:
        """A swap waits for the next frame boundary."""
        return self._swap is not None

    def swap(self, engine: Engine, *, running: bool, timeout: float) -> Engine:
        """Use ``engine`` from the next frame on; the previous engine (now the caller's to close)."""
        if engine is self.engine:
            return engine
        if engine.closed:
            raise ValueError("cannot swap in a closed engine")
        self.check(engine)
        plan = self.plan
        prepared = self.build(engine, plan.frame_shape, plan.native) if plan is not None else None
        if not running:
            old = self.engine
            self.engine, self.plan = engine, prepared
            self.owns_engine = True
            return old
        done = threading.Event()
        holder: list = [prepared]
        self._swap = (engine, done, holder)
        if not done.wait(timeout):
            if self._swap is not None and self._swap[0] is engine:
                self._swap = None
                raise EdgeInferError(f"the pipeline did not reach a frame boundary within {timeout:g} s")
            done.wait()
        return holder[1]

    def replace(self, engine: Engine) -> None:
        """Use ``engine`` now (a delegate failover: no inference thread is using the binding, or it is the
        caller); the plan is rebuilt for the next frame. The pipeline owns ``engine``."""
        self.engine = engine
        self.plan = None
        self.owns_engine = True
        self.offer_input_size(engine)

    def apply_pending_swap(self) -> None:
        """Inference thread, at a frame boundary (or at the end of the run): apply a requested swap."""
        request, self._swap = self._swap, None
        if request is None:
            return
        engine, done, holder = request
        old = self.engine
        self.engine = engine
        self.plan = holder[0]
        self.owns_engine = True
        self.offer_input_size(engine)
        holder.append(old)
        log.info("swapped engine %s -> %s", old.description, engine.description)
        done.set()

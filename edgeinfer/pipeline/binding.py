"""The engine a stream's frames go into, and everything built from it for the frames it gets.

An :class:`InferencePlan` holds what depends on (engine, frame size): one preprocessor per thread,
a staged model input per ring slot, and the transform back to source pixels. :class:`ModelBinding`
holds the engine row serving the stream (:class:`~.engine_worker.BatchRow`) and builds a plan when
the frame size or the engine changes.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

from .preprocess import Preprocessor, Transform, input_geometry

if TYPE_CHECKING:
    from ..capture import FrameSource
    from ..runtime.engine import Engine
    from .labels import Labels
    from .options import PipelineOptions
    from .tasks import ModelReading, Task


def size_inputs(decoder: object) -> tuple[int, ...]:
    """The inputs past the image a decoder wants filled with the image input's (width, height) once per plan
    (its ``size_inputs``; most decoders have none)."""
    return tuple(getattr(decoder, "size_inputs", ()))


class InferencePlan:
    """Everything that depends on (engine, frame size): preprocessors, staged inputs, the transform."""

    __slots__ = ("engine", "frame_shape", "gen", "native", "pre", "pre_staged", "staged", "transform", "view")

    def __init__(self, gen: int, engine: Engine, frame_shape: tuple[int, ...], native: tuple[int, int] | None,
                 pre: Preprocessor, pre_staged: Preprocessor, slots: int, transform: Transform) -> None:
        import numpy as np

        self.gen = gen
        self.engine = engine
        self.frame_shape = frame_shape
        self.native = native  # the source's own frame size when frames arrive reduced, else None
        # one preprocessor per thread: each owns scratch buffers, and both threads may preprocess at once
        self.pre = pre  # inference thread, into the engine's input view
        self.pre_staged = pre_staged  # capture thread, into staged[slot index]
        self.transform = transform  # frame → model input, expressed in the source's own pixels
        self.view = engine.input_view(0)
        self.staged = [np.empty(self.view.shape, self.view.dtype) for _ in range(slots)]

    def fits(self, frame_shape: tuple[int, ...], native: tuple[int, int] | None) -> bool:
        """Whether this plan is the one for a frame of ``frame_shape`` decoded from ``native``."""
        return self.frame_shape == frame_shape and self.native == native


class ModelBinding:
    """The engine row a stream's frames go into, and the plan for their size."""

    def __init__(self, engine: Engine, *, task: Task, options: PipelineOptions, labels: Labels | None,
                 source: FrameSource, slots: int) -> None:
        self.engine = engine
        self.task = task
        self.labels = labels
        self.plan: InferencePlan | None = None
        self._options = options
        self._source = source
        self._slots = slots
        self._gen = 0
        self._gen_lock = threading.Lock()

    # -------------------------------------------------------------------------- checks
    def check(self, engine: Engine) -> None:
        """ValueError, before anything runs, when ``engine`` cannot serve this pipeline's task."""
        input_geometry(engine.inputs[0])  # ValueError when the input is not an image
        claimed = size_inputs(self._decoder(engine).decoder)
        others = [spec.name or str(i) for i, spec in enumerate(engine.inputs) if i and i not in claimed]
        if others:
            raise ValueError(f"the pipeline feeds one image input (and a size input its layout names); "
                             f"{engine.model.path} also has {', '.join(others)}")

    def offer_input_size(self, engine: Engine) -> None:
        """Let the source decode frames as small as the model input (MJPEG: 1/2, 1/4, 1/8 scale): both sides of it
        for a stretch or a crop, the side that limits the frame for a letterbox."""
        if self._options.decode_reduced:
            from ..capture.jpeg import DecodeFloor

            height, width, _, _ = input_geometry(engine.inputs[0])
            letterbox = self._decoder(engine).resize == "letterbox"
            self._source.prefer_min_size(DecodeFloor(width, height, either=letterbox))

    def use_options(self, options: PipelineOptions, engine: Engine) -> None:
        """The run's options changed while it runs (pipeline/live_options.py): frames decoded as small as the model
        input, or at full size again (evidence or samples want whole frames), from the next frame on."""
        self._options = options
        if options.decode_reduced:
            self.offer_input_size(engine)
        else:
            self._source.prefer_min_size(None)

    # --------------------------------------------------------------------------- plans
    def _decoder(self, engine: Engine) -> ModelReading:
        """How ``engine`` is read for this run's task: its decoder, its resize and normalisation."""
        from .tasks import read_model

        options = self._options
        return read_model(engine, task=options.task, decoder=options.decoder, labels=self.labels,
                          settings=options.decoder_settings(), **options.feed_options())

    def build(self, engine: Engine, frame_shape: tuple[int, ...], native: tuple[int, int] | None) -> InferencePlan:
        """A new plan for ``engine`` and frames of ``frame_shape`` (decoded from ``native`` when reduced)."""
        reading = self._decoder(engine)
        size = (frame_shape[1], frame_shape[0])
        pre, pre_staged = (reading.preprocessor(engine.inputs[0], size) for _ in range(2))
        # results are in the source's own pixels even when its frames arrive reduced
        transform = pre.transform if native is None else pre.transform.for_source_size(*native)
        for index in size_inputs(reading.decoder):  # D-FINE's orig_target_sizes: boxes in input pixels
            engine.input_view(index)[...] = (pre.width, pre.height)
        with self._gen_lock:
            self._gen += 1
            gen = self._gen
        return InferencePlan(gen, engine, frame_shape, native, pre, pre_staged, self._slots, transform)

    def plan_for(self, frame_shape: tuple[int, ...], native: tuple[int, int] | None) -> InferencePlan:
        """Inference thread: the plan for this frame, rebuilt when the frame size changed."""
        plan = self.plan
        if plan is None or not plan.fits(frame_shape, native):
            plan = self.plan = self.build(self.engine, frame_shape, native)
        return plan

    def replace(self, engine: Engine) -> None:
        """Use ``engine`` from the next frame on (a failover, a model update: the engine's thread, between two
        batches); the plan is rebuilt for the next frame."""
        self.engine = engine
        self.plan = None
        self.offer_input_size(engine)

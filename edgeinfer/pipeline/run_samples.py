"""The capture side of a run of several streams (``MultiPipeline.samples``): what its samples say of the pipeline
and its model, who hears of them, and frames asked for. Apart from ``sampling.py`` so that a run with capture off
loads none of the capture rules' modules (nor the event rules' they use)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .sampling import StreamSampler


class PipelineSamples:
    """The capture side of a run of several streams (``MultiPipeline.samples``): what its samples say of the pipeline
    and its model, who hears of them, and frames asked for."""

    def __init__(self, pipeline: str, open_streams: Callable[[], list[Any]]) -> None:
        self._open_streams = open_streams
        self._context = (pipeline, "")
        self._listeners: tuple[Callable[[dict], Any], ...] = ()

    def _samplers(self, stream: str = "") -> list[tuple[str, StreamSampler | None]]:
        """The open streams' samplers (of ``stream`` only, when named)."""
        return [(s.name, s.sampler) for s in self._open_streams() if not stream or s.name == stream]

    def attach(self, sampler: StreamSampler | None, model_of: Callable[[], Any]) -> None:
        """A new stream's sampler (None: the stream does not capture): told the pipeline's names and listeners, and
        how to read the model serving it."""
        if sampler is None:
            return
        sampler.pipeline, sampler.model_version = self._context
        sampler.model_of = model_of
        for listener in self._listeners:
            sampler.add_listener(listener)

    def describe(self, pipeline: str, model_version: str | None) -> None:
        """Name the pipeline and the model's version in every sample from now on (the agent's names)."""
        self._context = (pipeline, model_version or "")
        for _, sampler in self._samplers():
            if sampler is not None:
                sampler.pipeline, sampler.model_version = self._context

    def add_listener(self, listener: Callable[[dict], Any]) -> None:
        """Call ``listener(info)`` for each sample written or refused by the disk, on any stream, streams added
        later too (:meth:`StreamSampler.add_listener`)."""
        self._listeners = (*self._listeners, listener)
        for _, sampler in self._samplers():
            if sampler is not None:
                sampler.add_listener(listener)

    def request(self, frames: int, stream: str = "", command_id: str = "") -> list[str]:
        """Keep the next ``frames`` frames of ``stream`` (of every stream: "") whatever the rules say (``command_id``:
        the command that asks, named in each sample); the streams asked. ValueError for a stream that is not open or
        a pipeline without capture."""
        samplers = self._samplers(stream)
        if not samplers:
            raise ValueError(f"no open stream {stream!r}" if stream else "no stream is open")
        if any(sampler is None for _, sampler in samplers):
            raise ValueError("this pipeline does not capture (options capture and capture_dir)")
        for _, sampler in samplers:
            sampler.request(frames, command_id)  # type: ignore[union-attr]
        return [name for name, _ in samplers]

"""A stream's optional parts from the run's options — tracking with its lines and zones, the event rules, the capture
rules — and how they are wired to each other. A :class:`~.stream.Stream` builds them when it opens; a run whose
options change while it runs (:mod:`.live_options`) builds new ones and puts them in place between two batches.
Each part's module is imported only when the options ask for the part (a plain run loads none of them)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..capture import FrameSource
    from .analytics import StreamAnalytics
    from .events import StreamEvents
    from .options import PipelineOptions
    from .sampling import StreamSampler


def analytics_part(source: FrameSource, options: PipelineOptions) -> StreamAnalytics | None:
    """Tracking, lines and zones (None when the options do not track). A file's frames are timed by its own frame
    rate (holds mean clip seconds, however fast it is read)."""
    if not options.tracking:
        return None
    from .analytics import analytics_from_options

    fps = None if source.live else source.fps
    return analytics_from_options(options, fps=fps if fps and fps > 0 else None)


def events_part(stream: str, options: PipelineOptions) -> StreamEvents | None:
    """The event rules (None without rules); a named stream keeps its evidence in a folder of its own."""
    if not options.events:
        return None
    from .events import events_from_options, stream_folder

    folder = stream_folder(options.evidence_dir, stream) if stream else options.evidence_dir
    return events_from_options(options, stream=stream, evidence_dir=folder)


def sampler_part(stream: str, options: PipelineOptions) -> StreamSampler | None:
    """The capture rules (None without rules or a capture_dir); a named stream keeps its samples apart."""
    if not options.capture or options.capture_dir is None:
        return None
    from .events import stream_folder
    from .sampling import sampler_from_options

    folder = stream_folder(options.capture_dir, stream) if stream else options.capture_dir
    return sampler_from_options(options, stream=stream, folder=folder)


def wire(analytics: StreamAnalytics | None, events: StreamEvents | None, sampler: StreamSampler | None) -> None:
    """The crossings and entries of ``analytics`` reach the event and capture rules; the events draw its lines and
    zones on their snapshots."""
    if analytics is None:
        return
    for part in (events, sampler):
        if part is not None:
            analytics.add_listener(part.on_analytics)
    if events is not None:
        from .annotate import Geometry

        events.drawing = (Geometry.of(analytics), analytics.counts)


def unwire(analytics: StreamAnalytics | None, *parts: Any) -> None:
    """Undo :func:`wire` for ``parts`` (replaced ones)."""
    if analytics is None:
        return
    for part in parts:
        if part is not None:
            analytics.remove_listener(part.on_analytics)

"""Options a run takes while it runs: a threshold, ``max_fps``, lines and zones, event rules, capture rules.

:meth:`MultiPipeline.reconfigure <edgeinfer.pipeline.multi.MultiPipeline.reconfigure>` (the agent's configuration
revisions, agent/configuration.py) changes these without stopping a stream: the capture threads go on reading, the
frame ids go on counting. What the new options need is built first, outside the engine's thread (a rule that does not
parse, a line no task with boxes can count: ValueError, nothing changed); then the engine's thread puts it in place
between two batches (:meth:`~.engine_worker.EngineWorker.between_batches`), so no frame is answered half with the old
parts and half with the new; the parts replaced are closed afterwards (an event's recording finishes with the
post-roll it has).

- the decoder's ``score_threshold``, ``iou_threshold``, ``max_detections``, ``top_k``: new decoders on the same engine;
- ``max_fps``: the pacing of the capture threads (``every``) and of the engine's thread (``latest``);
- ``lines``, ``zones`` (and ``track``, ``line_band``, ``line_hold_s``, ``line_trigger``): the stream's analytics
  replace their geometry (``StreamAnalytics.replace_geometry``: the tracks go on, a line keeping its name keeps its
  counts), or are made, or dropped;
- ``events`` and the evidence's settings, ``capture`` and the sample store's: new rules, a new store; a source that
  decodes frames reduced (MJPEG, JPEG folders) decodes them whole from the next frame on when evidence or samples
  need them (and reduced again when they no longer do; ``reduced_decode`` too).

Anything else — the model, the task, the delegate, the source's own settings — needs a new run:
:func:`restart_needed` names it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .._regions import task_problem
from .stream_parts import analytics_part, events_part, sampler_part, unwire, wire

if TYPE_CHECKING:
    from .engine_worker import EngineWorker
    from .options import PipelineOptions
    from .run_samples import PipelineSamples
    from .stream import Stream

#: the decoder's settings: new decoders on the same engine
DECODER_OPTIONS = ("top_k", "score_threshold", "iou_threshold", "max_detections")
#: tracking, lines and zones
GEOMETRY_OPTIONS = ("track", "lines", "zones", "line_band", "line_hold_s", "line_trigger")
#: the event rules and their evidence
EVENT_OPTIONS = ("events", "event_cooldown_s", "events_per_minute", "evidence_dir", "evidence_max_mb",
                 "evidence_pre_s", "evidence_post_s", "evidence_fps", "evidence_width")
#: the capture rules and their store
CAPTURE_OPTIONS = ("capture", "capture_dir", "capture_max_mb", "capture_per_minute")
#: every option a running run takes (:func:`restart_needed` says which others changed)
LIVE_OPTIONS = frozenset((*DECODER_OPTIONS, "max_fps", "reduced_decode", *GEOMETRY_OPTIONS, *EVENT_OPTIONS,
                          *CAPTURE_OPTIONS))


def changed_options(old: PipelineOptions, new: PipelineOptions) -> set[str]:
    """The options whose values differ."""
    return {f.name for f in dataclasses.fields(old) if getattr(old, f.name) != getattr(new, f.name)}


def restart_needed(old: PipelineOptions, new: PipelineOptions) -> set[str]:
    """The changed options a running run cannot take (empty: :meth:`MultiPipeline.reconfigure` takes them all)."""
    changed = changed_options(old, new)
    blocked = changed - LIVE_OPTIONS
    if new.record_source is not None and changed & set(EVENT_OPTIONS):  # its recorder is the events' own
        blocked.add("record_source")
    return blocked


@dataclass
class _StreamChange:
    """What changes on one stream: its new parts (a field left as ``_KEEP`` is not changed)."""

    stream: Stream
    analytics: Any
    events: Any
    sampler: Any


_KEEP: Any = object()


def plan(old: PipelineOptions, new: PipelineOptions, streams: list[Stream]) -> tuple[set[str], list[_StreamChange]]:
    """The options that change and, per stream, the parts built for them (not yet in place). ValueError, nothing
    changed, when the run cannot take ``new`` while it runs."""
    blocked = restart_needed(old, new)
    if blocked:
        raise ValueError(f"{', '.join(sorted(blocked))} cannot change while the pipeline runs: it needs a restart")
    refusal = task_problem(new.task or "classify", "tracking, lines and zones") if new.tracking else None
    if refusal:  # the words every place that takes lines and zones says (_regions)
        raise ValueError(refusal)
    names = changed_options(old, new)
    geometry, events, capture = (bool(names & set(group)) for group in (GEOMETRY_OPTIONS, EVENT_OPTIONS,
                                                                         CAPTURE_OPTIONS))
    changes = []
    for stream in streams:
        change = _StreamChange(stream, _KEEP, _KEEP, _KEEP)
        if geometry:
            change.analytics = analytics_part(stream.source, new)
        if events:
            change.events = events_part(stream.name, new)
        if capture:
            change.sampler = sampler_part(stream.name, new)
        changes.append(change)
    return names, changes


def install(changes: list[_StreamChange], *, event_listeners: tuple[Callable[[dict], Any], ...],
            samples: PipelineSamples, model_of: Callable[[Stream], Callable[[], Any]]) -> list[Any]:
    """Put each stream's new parts in place (the engine's thread, between two batches); the parts replaced, for the
    caller to close once they are out of the engine's hands."""
    replaced: list[Any] = []
    for change in changes:
        stream = change.stream
        old = (stream.analytics, stream.events, stream.sampler)
        unwire(stream.analytics, stream.events, stream.sampler)
        if change.analytics is not _KEEP:
            current = stream.analytics
            if current is not None and change.analytics is not None:  # the tracks and same-named counts go on
                current.replace_geometry(change.analytics.lines, change.analytics.zones)
            else:
                stream.analytics = change.analytics
        if change.events is not _KEEP:
            stream.events = change.events
            for listener in event_listeners if change.events is not None else ():
                change.events.add_listener(listener)
            if change.events is not None:
                change.events.record = stream.record
        if change.sampler is not _KEEP:
            stream.sampler = change.sampler
            samples.attach(change.sampler, model_of(stream))
        wire(stream.analytics, stream.events, stream.sampler)
        replaced += [part for part, now in zip(old[1:], (stream.events, stream.sampler)) if part is not now]
    return replaced


def close_replaced(parts: list[Any]) -> None:
    """Finish the replaced event and capture rules (the recordings in progress with the post-roll they have)."""
    for part in parts:
        if part is not None:
            part.close()


def check(run: Any, options: PipelineOptions) -> set[str]:
    """The options of ``run`` that ``options`` changes; ValueError when it cannot take them while it runs: one needs
    a new run, or a rule cannot work with the model the run reads (pipeline/rule_check.py, as at its start)."""
    from .rule_check import check_rules

    if options.task is None:
        options = dataclasses.replace(options, task=run.options.task)
    blocked = restart_needed(run.options, options)
    if blocked:
        raise ValueError(f"{', '.join(sorted(blocked))} cannot change while the pipeline runs: it needs a restart")
    reading = run.reading
    if reading is not None:
        if options.tracking and not reading.gives_boxes:
            raise ValueError(f"tracking, lines and zones need results with boxes; the model read as "
                             f"{reading.task!r} ({reading.layout.name}) gives none")
        check_rules(options, run.labels, run.engine.model.path,
                    thresholded_boxes=reading.gives_boxes and reading.layout.thresholded)
    return changed_options(run.options, options)


def reconfigure(run: Any, options: PipelineOptions, timeout: float = 30.0) -> set[str]:
    """``MultiPipeline.reconfigure``: run ``run`` with ``options`` from the next batch on, every stream going on. The
    options that changed; ValueError, the run untouched, for one that needs a new run or a rule the model cannot
    take (:func:`check`); ``options.task`` None keeps the run's task. The new parts are built here, put in place by
    the engine's thread between two batches, and the replaced ones closed. (The run's helper: it reads its parts.)"""
    check(run, options)
    if options.task is None:
        options = dataclasses.replace(options, task=run.options.task)
    with run._lock:
        names, changes = plan(run.options, options, run._streams.open_streams())
    if not names:
        return names
    workers = run._engines.workers
    replaced: list[Any] = []

    def worker_of(stream: Stream) -> EngineWorker:
        return next((worker for worker in workers if stream in worker.streams), run._default)

    def put_in_place() -> None:
        run.options = run._engines.options = options
        for worker in workers:
            worker.use_options(options)
        for change in changes:
            change.stream.capture.use_options(options)
            change.stream.binding.use_options(options, worker_of(change.stream).row())
        replaced.extend(install(changes, event_listeners=run._event_listeners, samples=run.samples,
                                model_of=lambda stream: (lambda: worker_of(stream).engine.model)))

    run._default.boundary.call(put_in_place, timeout)
    close_replaced(replaced)
    return names

"""One supervised pipeline: built and watched in its own thread, restarted with backoff when it fails.

:class:`PipelineRunner` runs in thread ``edgeinfer-pipeline-<name>``: it builds the run — one
:class:`~edgeinfer.pipeline.multi.MultiPipeline` for a ``pipelines:`` entry, of one unnamed stream for a
``source`` (what :class:`edgeinfer.Pipeline` runs) or of every named stream of ``sources`` on one engine,
failed streams opened again on the pipeline's backoff — watches it, reports ``pipeline_started`` /
``fallback`` / ``pipeline_ended`` / ``pipeline_failed`` / ``pipeline_restarting`` (and, with several
sources, ``stream_failed`` / ``stream_restored`` / ``stream_ended``) events through the ``emit``
function it is given, and restarts a failed pipeline with exponential backoff and equal jitter (a run
that lasted :data:`STABLE_RUN_S` resets it). Between telemetry ticks it hands out the pipeline's stats
window (with several sources, a :class:`~edgeinfer.pipeline.stats.RunStats`: the aggregate and each
stream's); a model update hot-swaps the engine through :meth:`~PipelineRunner.swap_engine`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..errors import EdgeInferError
from ..link.vocabulary import EventKind
from ..pipeline.stats import PipelineStats, combine_streams, merge_stats
from ..util.backoff import EQUAL_JITTER, Backoff
from .model_check import FirstStart
from .pipeline_config import PipelineConfig

if TYPE_CHECKING:
    from ..pipeline.failover import DelegateEvent
    from ..pipeline.multi import MultiPipeline, StreamEvent
    from ..runtime.engine import Engine

log = logging.getLogger(__name__)

#: a pipeline that ran this long before failing restarts after the minimum delay again
STABLE_RUN_S = 60.0
#: how long "wait for a stop or a restart command" waits (for ever, in practice)
_UNTIL_TOLD = 1e9

PipelineFactory = Callable[[PipelineConfig], "MultiPipeline"]
#: ``emit(event, level, message, *, pipeline=None, cmd_id=None, data=None)``: report an event
EmitFn = Callable[..., None]
ErrorFn = Callable[[BaseException], None]


def default_pipeline_factory(config: PipelineConfig) -> MultiPipeline:
    """The run of a pipeline config (not started): one unnamed stream for ``source``; for ``sources``, every
    named stream on one engine (``batch`` frames per invoke where the delegate batches), a failed stream
    opened again on the pipeline's backoff unless ``restart: never``."""
    from ..pipeline.multi import MultiPipeline

    if config.sources:
        sources = {stream.name: stream.source for stream in config.sources}
        return MultiPipeline(config.model, sources, config.options, batch=config.batch, name=config.name,
                             reopen=config.restart != "never")
    return MultiPipeline(config.model, {"": config.source}, config.options, name=config.name)


def pipeline_window(config: PipelineConfig, pipeline: MultiPipeline,
                    windows: dict[str, PipelineStats]) -> PipelineStats | None:
    """What telemetry reports of a pipeline's per-stream ``windows``: one source, its stream's figures; several,
    their aggregate (a RunStats) with each stream's window and status, in config order."""
    sources = config.sources
    if not sources:
        return windows.get("")
    status = {entry["name"]: entry["status"] for entry in pipeline.stream_status()}
    ordered = {stream.name: windows[stream.name] for stream in sources if stream.name in windows}
    return combine_streams(ordered, status, delegate=pipeline.engine.description, source=source_text(config))


def source_text(config: PipelineConfig) -> str:
    """The pipeline's source, or its streams as ``name=source, ...``."""
    sources = config.sources
    return ", ".join(f"{s.name}={s.source}" for s in sources) if sources else str(config.source)


#: what a ``rule_triggered`` event carries of the pipeline's event (never the device's file paths)
RULE_EVENT_FIELDS = ("event_id", "stream", "rule", "kind", "name", "label", "track_id", "score", "direction", "box",
                     "frame_id", "timestamp", "source_time", "suppressed", "frames", "duration_s", "snapshot_bytes",
                     "clip_bytes")
#: and what a detection gives beyond its box, when it gives it (pipeline/events.py ``detection_shapes``)
RULE_EVENT_SHAPES = ("keypoints", "polygons", "rotated_box")


def rule_event_data(event: dict, *, upload: bool) -> dict[str, Any]:
    """The ``data`` of a ``rule_triggered`` event message; ``upload``: the evidence is on its way to the manager."""
    data = {key: event.get(key) for key in RULE_EVENT_FIELDS}
    data.update({key: event[key] for key in RULE_EVENT_SHAPES if event.get(key) is not None})
    data["upload"] = bool(upload and event.get("clip"))
    return data


#: at most one ``sample_failed`` event this often per pipeline (a full disk fails every kept frame)
SAMPLE_FAILED_EVERY_S = 60.0


class SampleReports:
    """A pipeline's samples, for the agent: each one written goes to ``on_sample(info, pipeline)`` (the
    uploader); one the disk refused is a ``sample_failed`` event, one a minute at most."""

    def __init__(self, pipeline: str, emit: EmitFn, on_sample: Callable[[dict, str], None] | None) -> None:
        self.pipeline, self._emit, self._on_sample = pipeline, emit, on_sample
        self._failed_at = -SAMPLE_FAILED_EVERY_S

    def __call__(self, info: dict) -> None:
        if "error" not in info:
            if self._on_sample is not None:
                self._on_sample(info, self.pipeline)
            return
        now = time.monotonic()
        if now - self._failed_at >= SAMPLE_FAILED_EVERY_S:
            self._failed_at = now
            data = {key: str(info.get(key, ""))[:500] for key in ("error", "stream", "rule")}
            self._emit(EventKind.SAMPLE_FAILED, "warning", f"pipeline {self.pipeline}: {info['error']}",
                       pipeline=self.pipeline, data=data)


def runner_entry(runner: PipelineRunner) -> dict[str, Any]:
    """A pipeline's entry in the ``state`` message (with several sources: each stream's too)."""
    config, running = runner.config, runner.pipeline
    # the task the model was read for; before it loads, the configured one ("auto": from the model)
    task = running.options.task if running is not None else config.task or "auto"
    entry = {"name": runner.name, "status": runner.status, "task": task, "source": source_text(config),
             "delegate": runner.delegate, "fallback_reason": runner.fallback_reason, "error": runner.last_error,
             "restarts": runner.restarts, "model": dict(runner.model), "degraded": runner.degraded,
             "delegate_wanted": runner.delegate_wanted}
    if config.sources:
        live = {s["name"]: s for s in running.stream_status()} if running is not None else {}
        entry["streams"] = [live.get(s.name) or {"name": s.name, "source": str(s.source), "status": runner.status,
                                                 "error": None} for s in config.sources]
    return entry


def _started(name: str, engine: Engine, model: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """A pipeline_started event's message and data: the delegate, the model, and the delegate probe's choice and
    figures when it chose the delegate."""
    message = f"pipeline {name} running on {engine.description}"
    data: dict[str, Any] = {"delegate": engine.description, "model": model}
    choice = getattr(engine.selection, "probe", None)
    if choice is not None:
        message += f"; {choice.summary()}"
        data["delegate_choice"] = choice.to_dict()
    return message, data


class PipelineRunner:
    """Runs one pipeline in a named thread; restarts it with backoff when it fails."""

    def __init__(self, config: PipelineConfig, *, emit: EmitFn, on_change: Callable[[], None],
                 factory: PipelineFactory = default_pipeline_factory, restart_min_s: float = 1.0,
                 restart_max_s: float = 60.0, on_evidence: Callable[[dict, str], None] | None = None,
                 on_sample: Callable[[dict, str], None] | None = None, on_config_error: ErrorFn | None = None) -> None:
        self.config = config
        self.name = config.name
        self._emit = emit
        self._on_change = on_change
        self._factory = FirstStart(factory, on_config_error)  # a first start failed as configured: not restarted
        #: ``on_evidence(event, pipeline)``: an event's snapshot and clip are written (the uploader takes them)
        self._on_evidence = on_evidence
        self._sample_reports = SampleReports(config.name, emit, on_sample)
        self._backoff = Backoff(initial_s=restart_min_s, max_s=restart_max_s, jitter=EQUAL_JITTER)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._restart_requested = threading.Event()
        self._thread: threading.Thread | None = None
        self._pipeline: MultiPipeline | None = None
        self._events_of: MultiPipeline | None = None  # the run whose rule events are reported
        self._leftover: PipelineStats | None = None
        self.status = "starting"
        self.restarts = 0
        self.last_error: str | None = None
        self.failed_at = 0.0  # when it last failed (unix time): a configuration's health gate reads it
        self.delegate: str | None = None
        self.fallback_reason: str | None = None
        #: running on a fallback delegate after the wanted one failed at run time (the pipeline goes on)
        self.degraded = False
        self.delegate_wanted: str | None = None
        self.model: dict[str, Any] = {"path": config.model, "sha256": None, "version": config.version,
                                      "format": None}
        self.last_run_frames = 0
        #: seconds from the agent process's start to this pipeline's first result (its cold start)
        self.first_result_s: float | None = None

    @property
    def pipeline(self) -> MultiPipeline | None:
        """The running pipeline, or None between runs."""
        with self._lock:
            return self._pipeline

    # -- control --------------------------------------------------------------------------
    def start(self) -> PipelineRunner:
        """Start supervising (the pipeline is built in the runner's thread)."""
        self._thread = threading.Thread(target=self._run, name=f"edgeinfer-pipeline-{self.name}", daemon=True)
        self._thread.start()
        return self

    def request_restart(self) -> None:
        """Stop the current run (if any) and start again now."""
        self._restart_requested.set()

    def request_stop(self) -> None:
        """Tell the thread to stop without waiting for it (stop() joins); lets several runners stop at once."""
        self._stop.set()
        self._restart_requested.set()

    def stop(self, timeout: float = 10.0) -> None:
        """Stop the pipeline and join the thread."""
        self.request_stop()
        if self._thread is not None:
            self._thread.join(timeout)
            if self._thread.is_alive():
                log.warning("pipeline %s did not stop within %.0f s", self.name, timeout)

    def close(self) -> None:
        """Same as stop(); idempotent."""
        self.stop()

    def swap_engine(self, engine: Engine, *, version: str | None = None) -> Engine:
        """Hot-swap the running pipeline's engine between two frames (capture keeps going).

        Later restarts load the new model too. Returns the previous engine, which the caller closes
        (or keeps, to roll back). EdgeInferError when the pipeline is not running; ValueError (the
        run untouched) when the engine does not fit the task.
        """
        with self._lock:
            pipeline = self._pipeline
        if pipeline is None:
            raise EdgeInferError(f"pipeline {self.name} is not running ({self.status}); nothing to swap")
        old = pipeline.swap_engine(engine)
        info = engine.model
        self.config = dataclasses.replace(self.config, model=str(info.path), version=version)
        pipeline.samples.describe(self.name, version)
        self.delegate = engine.description
        self.fallback_reason = engine.fallback_reason
        self.model = {"path": str(info.path), "sha256": info.sha256, "version": version, "format": info.format.value}
        self._on_change()
        return old

    def take_window(self) -> PipelineStats | None:
        """Stats since the previous call (with several sources a RunStats), or None when nothing ran in the window."""
        with self._lock:
            pipeline, leftover, self._leftover = self._pipeline, self._leftover, None
            current = None
            if pipeline is not None:
                try:
                    current = self._window_of(pipeline)
                except Exception:
                    log.exception("pipeline %s: take_window failed", self.name)
        return merge_stats(leftover, current)

    def stats(self) -> PipelineStats | None:
        """The running pipeline's stats since it started (the streams' aggregate), or None between runs."""
        pipeline = self.pipeline
        return pipeline_window(self.config, pipeline, pipeline.stats()) if pipeline is not None else None

    def _window_of(self, pipeline: MultiPipeline) -> PipelineStats | None:
        return pipeline_window(self.config, pipeline, pipeline.take_window())

    def describe(self) -> dict[str, Any]:
        """This pipeline's entry in the ``state`` message (with several sources: each stream's too)."""
        return runner_entry(self)

    def follow_events(self, pipeline: MultiPipeline) -> None:
        """Report what the run's event rules fire, once per run (a configuration revision may give a running run
        its first rules: agent/config_apply.py)."""
        if pipeline is not self._events_of:
            self._events_of = pipeline
            pipeline.add_event_listener(self._on_rule_event)

    # -- the thread -----------------------------------------------------------------------
    def _set_status(self, status: str) -> None:
        if status != self.status:
            self.status = status
            self._on_change()

    def _wait(self, seconds: float) -> bool:
        """Sleep up to ``seconds``; True if interrupted by stop or a restart request."""
        return self._restart_requested.wait(seconds)

    def _run(self) -> None:
        attempt = 0
        while not self._stop.is_set():
            self._restart_requested.clear()
            self._set_status("starting")
            started = time.monotonic()
            error: BaseException | None = None
            pipeline = None
            try:
                pipeline = self._factory(self.config)
                self._follow(pipeline)
                pipeline.start()
            except Exception as exc:
                error = exc
                if pipeline is not None:
                    with contextlib.suppress(Exception):
                        pipeline.close()
            else:
                error, requested = self._watch(pipeline)
                if self._stop.is_set():
                    break
                if requested:
                    self.restarts += 1
                    attempt = 0
                    self._emit(EventKind.PIPELINE_RESTARTING, "info", f"pipeline {self.name} restarting on request",
                               pipeline=self.name, data={"reason": "requested", "restarts": self.restarts})
                    continue
                if error is None:
                    self._report_ended()
                    if self.config.restart != "always":
                        self._wait(_UNTIL_TOLD)
                        continue
            if self._stop.is_set():
                break
            if error is not None:
                if time.monotonic() - started >= STABLE_RUN_S:
                    attempt = 0
                self._report_failed(error)
                if self._factory.hands_over(error) or self.config.restart == "never":
                    self._wait(_UNTIL_TOLD)
                    continue
            attempt += 1
            self._wait(self._restart_delay(attempt))
        self._set_status("stopped")

    def _report_ended(self) -> None:
        self.last_error = None
        self._set_status("ended")
        self._emit(EventKind.PIPELINE_ENDED, "info", f"pipeline {self.name} ended (its source has no more frames)",
                   pipeline=self.name, data={"frames": self.last_run_frames})

    def _report_failed(self, error: BaseException) -> None:
        self.last_error = f"{type(error).__name__}: {' '.join(str(error).split())}"
        self.failed_at = time.time()
        self._set_status("failed")
        self._emit(EventKind.PIPELINE_FAILED, "error", f"pipeline {self.name} failed: {self.last_error}",
                   pipeline=self.name, data={"error": self.last_error, "type": type(error).__name__})

    def _restart_delay(self, attempt: int) -> float:
        """Announce restart ``attempt`` and return how long to wait before it."""
        delay = self._backoff.delay(attempt)
        self._set_status("restarting")
        self.restarts += 1
        self._emit(EventKind.PIPELINE_RESTARTING, "warning",
                   f"pipeline {self.name} restarts in {delay:.1f} s (attempt {attempt})", pipeline=self.name,
                   data={"delay_s": round(delay, 2), "attempt": attempt, "restarts": self.restarts})
        return delay

    def _watch(self, pipeline: MultiPipeline) -> tuple[BaseException | None, bool]:
        """Publish the running pipeline, wait until it ends or we are told to stop; (error, restart requested)."""
        self._report_started(pipeline)
        try:
            while not self._restart_requested.is_set():
                if pipeline.wait(0.25):
                    break
        finally:
            requested = self._restart_requested.is_set()
            if requested:
                with contextlib.suppress(Exception):
                    pipeline.stop()
            with self._lock:
                self._pipeline = None
                try:
                    self._leftover = merge_stats(self._leftover, self._window_of(pipeline))
                    self.last_run_frames = sum(stats.frames for stats in pipeline.stats().values())
                except Exception:
                    log.debug("final stats failed", exc_info=True)
            error = None if requested else pipeline.error
            with contextlib.suppress(Exception):
                pipeline.close()
        return error, requested and not self._stop.is_set()

    def _follow(self, pipeline: MultiPipeline) -> None:
        """Report its delegate failovers and failbacks (it runs on through them), what its event rules fire (once the
        evidence is written), its streams' fates (several sources); name its samples and pass them on."""
        self.degraded, self.delegate_wanted = False, None
        pipeline.add_delegate_listener(self._on_delegate_event)
        if self.config.events:
            self.follow_events(pipeline)
        if self.config.sources:
            pipeline.add_stream_listener(self._on_stream_event)
        pipeline.samples.describe(self.name, self.config.version)
        pipeline.samples.add_listener(self._sample_reports)

    def _first_result(self, _result: Any) -> None:
        """An observer until a run's first result: the agent's cold start (the first run's, counted from
        the process's start), and the heap the loading freed given back to the kernel."""
        from ..util.native import trim_malloc

        pipeline = self.pipeline
        if pipeline is not None:
            pipeline.remove_observer(self._first_result)
        if self.first_result_s is None:
            from .telemetry import process_age_s

            self.first_result_s = process_age_s()
        trim_malloc()

    def _on_rule_event(self, event: dict) -> None:
        data = rule_event_data(event, upload=self._on_evidence is not None)
        what = event.get("kind", "event") + (f" {event['name']}" if event.get("name") else "")
        where = f"{self.name}/{event['stream']}" if event.get("stream") else self.name
        self._emit(EventKind.RULE_TRIGGERED, "info", f"pipeline {where}: {what} by {event.get('label')}"
                   + (f" #{event['track_id']}" if event.get("track_id") is not None else ""),
                   pipeline=self.name, data=data)
        if self._on_evidence is not None and event.get("clip"):
            self._on_evidence(event, self.name)

    def _on_stream_event(self, event: StreamEvent) -> None:
        self._emit(event.kind, event.level, event.message, pipeline=self.name, data=event.data)
        self._on_change()

    def _on_delegate_event(self, event: DelegateEvent) -> None:
        self.delegate = event.delegate
        self.degraded = event.kind == EventKind.DELEGATE_FALLBACK
        self.delegate_wanted = event.wanted if self.degraded else None
        if self.degraded:
            message = (f"pipeline {self.name}: delegate {event.previous} failed ({event.reason}); "
                       f"running degraded on {event.delegate}")
        else:
            message = f"pipeline {self.name}: delegate {event.delegate} restored (was on {event.previous})"
        self._emit(event.kind, "warning" if self.degraded else "info", message, pipeline=self.name,
                   data=event.to_dict())
        self._on_change()

    def _report_started(self, pipeline: MultiPipeline) -> None:
        """Take the delegate and model the pipeline runs on, make it the current one, and say so."""
        engine = pipeline.engine
        info = engine.model
        self.delegate = engine.description
        self.fallback_reason = engine.fallback_reason
        self.model = {"path": str(info.path), "sha256": info.sha256, "version": self.config.version,
                      "format": info.format.value}
        with self._lock:
            self._pipeline = pipeline
        pipeline.add_observer(self._first_result)
        self.last_error = None
        self._set_status("running")
        message, data = _started(self.name, engine, self.model)
        self._emit(EventKind.PIPELINE_STARTED, "info", message, pipeline=self.name, data=data)
        if self.fallback_reason:
            self._emit(EventKind.FALLBACK, "warning",
                       f"pipeline {self.name} runs on {self.delegate}: {self.fallback_reason}",
                       pipeline=self.name, data={"delegate": self.delegate, "reason": self.fallback_reason})

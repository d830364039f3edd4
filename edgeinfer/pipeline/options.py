"""Every option of a pipeline, in one frozen record.

:class:`PipelineOptions` is the single definition that ``Pipeline(model, source, **options)``
validates, that the agent's ``pipelines:`` entries in ``agent.yaml`` are read into (each field is a
YAML key), and that the CLI's choices come from (:data:`POLICIES`, :data:`~.tasks.TASK_NAMES`).
"""

from __future__ import annotations

import dataclasses
import functools
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..capture import DEFAULT_BACKOFF
from ..forms.regions import task_problem, text_rule
from ..util.backoff import Backoff
from ..util.config import bounds, current_names, out_of_bounds
from .decoders import (
    DECODER_NAME_FORM,
    DECODER_NAME_PATTERN,
    DEFAULT_IOU_THRESHOLD,
    DEFAULT_MAX_DETECTIONS,
    DEFAULT_SCORE_THRESHOLD,
    DecoderSettings,
    decoder_problem,
)
from .preprocess import CHANNEL_ORDERS, PAD_PLACES, RESIZE_MODES
from .tasks import TASK_NAMES, get_task
from .zones import DEFAULT_BAND, DEFAULT_HOLD_S, TRIGGERS, named_regions

if TYPE_CHECKING:
    from .labels import Labels

#: ``every``: process every frame (back-pressure on the source); ``latest``: drop stale frames
POLICIES = ("every", "latest")
#: where preprocessing runs: decided from measured stage times, or pinned to one thread
PREPROCESS_PLACES = ("auto", "capture", "inference")
#: options that only a pipeline whose task gives boxes takes (tracking, lines, zones: ``forms.regions.BOX_TASKS``)
BOX_OPTIONS = ("track", "lines", "zones")
DEFAULT_QUEUE_SIZE = 2
DEFAULT_WATCHDOG_FLOOR_S = 1.0
DEFAULT_WATCHDOG_FACTOR = 10.0
DEFAULT_PROBE_BACKOFF = Backoff(initial_s=2.0, max_s=60.0, factor=2.0)
#: samples kept for percentiles (the last this many frames)
DEFAULT_STATS_WINDOW = 4096
MIN_STATS_WINDOW = 16


def _choices(*values: str) -> dict[str, Any]:
    return {"choices": values}


#: the options' old names (old name → name), each still read as its name — by agent.yaml's reader, the configuration
#: document's check (link/config_schema.py carries it, generated) and ``Pipeline(...)`` — and never written
RENAMED_OPTIONS = {
    "capture": "sample",  # old names: dataset sampling was "capture", the cameras' word
    "capture_dir": "samples_dir",  # old name
    "capture_max_mb": "samples_max_mb",  # old name
    "capture_per_minute": "samples_per_minute",  # old name
}


@dataclass(frozen=True, kw_only=True)
class PipelineOptions:
    """How a pipeline loads its model, opens its source, paces, preprocesses and decodes."""

    # what to do
    #: None: the task the model's metadata states, else the first output layout that fits (a 1xN output: classify)
    task: str | None = field(default=None, metadata=_choices(*TASK_NAMES))
    #: how the outputs are read (edgeinfer.pipeline.decoders): None chooses from the outputs and the metadata. A
    #: built-in's name or an installed plug-in's: the schema takes any name (the fleet cannot know a device's
    #: plug-ins), the device checks it is one here
    decoder: str | None = field(default=None, metadata={
        "pattern": DECODER_NAME_PATTERN, "form": DECODER_NAME_FORM})
    labels: str | os.PathLike | Labels | None = None
    top_k: int = field(default=5, metadata=bounds(minimum=1))
    score_threshold: float = field(default=DEFAULT_SCORE_THRESHOLD, metadata=bounds(minimum=0, maximum=1))
    iou_threshold: float = field(default=DEFAULT_IOU_THRESHOLD, metadata=bounds(minimum=0, maximum=1))
    max_detections: int = field(default=DEFAULT_MAX_DETECTIONS, metadata=bounds(minimum=1))
    # the model
    delegate: str | None = None
    #: when neither a delegate nor a device profile is named, measure the runtimes that can run the model once on
    #: this machine and run the fastest whose answers agree with the reference's (docs/profiles.md); False: the
    #: plan's first
    delegate_probe: bool = True
    threads: int | None = field(default=None, metadata=bounds(minimum=1))
    # delegate failures at run time (see edgeinfer.pipeline.failover)
    #: go on with the plan's next delegate when the one running fails or hangs (strict mode never does)
    failover: bool = True
    #: watch each invoke: one that has not returned within the bound is a hung delegate
    watchdog: bool = True
    #: the watchdog's bound is watchdog_factor x the recent p99 invoke time, never under this floor
    watchdog_floor_s: float = field(default=DEFAULT_WATCHDOG_FLOOR_S, metadata=bounds(exclusiveMinimum=0))
    watchdog_factor: float = field(default=DEFAULT_WATCHDOG_FACTOR, metadata=bounds(minimum=1))
    #: while degraded, how often the wanted delegate is tried again
    probe_backoff: Backoff = DEFAULT_PROBE_BACKOFF
    # the source
    loop: bool = False
    size: tuple[int, int] | None = None
    fps: float | None = field(default=None, metadata=bounds(exclusiveMinimum=0))
    fourcc: str | None = None
    backoff: Backoff = DEFAULT_BACKOFF
    # pacing
    policy: str = field(default="every", metadata=_choices(*POLICIES))
    max_fps: float | None = field(default=None, metadata=bounds(exclusiveMinimum=0))
    max_frames: int | None = field(default=None, metadata=bounds(minimum=1))
    queue_size: int = field(default=DEFAULT_QUEUE_SIZE, metadata=bounds(minimum=1))
    # preprocessing (None: what the model's metadata states, else its family's: docs/pipeline.md)
    resize: str | None = field(default=None, metadata=_choices(*RESIZE_MODES))
    mean: float | tuple[float, ...] | None = None
    std: float | tuple[float, ...] | None = None
    #: the channel order the model takes: ``rgb`` or ``bgr``
    channels: str | None = field(default=None, metadata=_choices(*CHANNEL_ORDERS))
    #: where a letterbox's border goes: ``centre``, or ``corner`` (the image at the top-left, YOLOX's)
    pad: str | None = field(default=None, metadata=_choices(*PAD_PLACES))
    preprocess_in: str = field(default="auto", metadata=_choices(*PREPROCESS_PLACES))
    #: frames kept for the caller stay full size; otherwise sources that can decode less may
    reduced_decode: bool = True
    keep_frames: bool = False
    # tracking and counting (edgeinfer.pipeline.analytics, tasks with boxes: forms.regions.BOX_TASKS; docs/analytics.md)
    #: give detections track ids (implied by lines or zones)
    track: bool = False
    #: counting lines, each ``"x1,y1,x2,y2"`` or ``"NAME=x1,y1,x2,y2"`` in source pixels (names, shapes: forms.regions)
    lines: tuple[str, ...] = field(default=(), metadata=text_rule("line"))
    #: zones, each ``"x1,y1,x2,y2,x3,y3[,...]"`` or ``"NAME=..."`` (a polygon in source pixels)
    zones: tuple[str, ...] = field(default=(), metadata=text_rule("zone"))
    #: frames a track must be matched in before it counts
    track_min_hits: int = field(default=3, metadata=bounds(minimum=1))
    #: the hysteresis band around a line or a zone's edge, a fraction of the box height
    line_band: float = field(default=DEFAULT_BAND, metadata=bounds(minimum=0))
    #: seconds (of the stream's time) a track must stay beyond the band on a new side before it counts
    line_hold_s: float = field(default=DEFAULT_HOLD_S, metadata=bounds(minimum=0))
    #: what must be beyond the band: ``anchor`` (the anchor point) or ``box`` (the whole box)
    line_trigger: str = field(default="anchor", metadata=_choices(*TRIGGERS))
    # events with evidence (edgeinfer.pipeline.events; docs/events.md)
    #: rules: ``line_crossed[:LINE][/LABEL,...]``, ``zone_entered[:ZONE][/...]``, ``detection[:SCORE][/...]``
    events: tuple[str, ...] = ()
    #: a subject (a track, or a label without tracking) fires a ``detection`` rule at most once in this many seconds
    event_cooldown_s: float = field(default=10.0, metadata=bounds(minimum=0))
    #: events recorded a minute at most, per stream (the rest counted as rate-limited)
    events_per_minute: int = field(default=30, metadata=bounds(minimum=1))
    #: where the snapshots and clips go (None: events without evidence)
    evidence_dir: str | os.PathLike | None = None
    #: the store's bound; the oldest events go first
    evidence_max_mb: float = field(default=200.0, metadata=bounds(exclusiveMinimum=0))
    #: seconds of clip before and after the event's frame
    evidence_pre_s: float = field(default=2.0, metadata=bounds(exclusiveMinimum=0))
    evidence_post_s: float = field(default=3.0, metadata=bounds(minimum=0))
    #: frames a second the clip keeps, and their width at most (JPEG)
    evidence_fps: float = field(default=5.0, metadata=bounds(exclusiveMinimum=0))
    evidence_width: int = field(default=640, metadata=bounds(minimum=16))
    #: the source the evidence (snapshot, clip) comes from, when not the one detection reads (Frigate's
    #: detect / record split: a camera's main stream; files are read in step, frame n with frame n); used only
    #: with events and an evidence_dir
    record_source: str | None = None
    # sampling rules (pipeline/sampling.py; docs/datasets.md): frames kept with the model's output; off by default
    #: rules: ``uncertain:LOW-HIGH[/LABEL,...]``, ``drift:DISTANCE[@FRAMES]``, ``event:RULE``, ``random:RATE``,
    #: ``request`` (only the frames asked for)
    sample: tuple[str, ...] = ()
    #: where the samples go (sampling is off without it)
    samples_dir: str | os.PathLike | None = None
    #: the store's bound; the oldest samples go first
    samples_max_mb: float = field(default=100.0, metadata=bounds(exclusiveMinimum=0))
    #: samples each rule keeps a minute at most, per stream
    samples_per_minute: int = field(default=6, metadata=bounds(minimum=1))
    # motion gating (edgeinfer.pipeline.motion): unchanged frames reuse the last result, marked reused
    motion_gate: bool = False
    #: gray levels a pixel of the small comparison copy must change by
    motion_threshold: float = field(default=20.0, metadata=bounds(exclusiveMinimum=0, exclusiveMaximum=255))
    #: the share of the frame that must change
    motion_min_area: float = field(default=0.002, metadata=bounds(minimum=0, maximum=1))
    #: frames skipped in a row at most: then one goes through whatever it looks like
    motion_max_skip: int = field(default=30, metadata=bounds(minimum=0))
    #: OpenCV's process-wide thread count while the pipeline runs (None leaves it alone)
    opencv_threads: int | None = field(default=1, metadata=bounds(minimum=0))
    stats_window: int = field(default=DEFAULT_STATS_WINDOW, metadata=bounds(minimum=MIN_STATS_WINDOW))

    def __post_init__(self) -> None:
        for option in dataclasses.fields(self):  # the choices and bounds in the fields' metadata (the schema's too)
            choices = option.metadata.get("choices")
            value = getattr(self, option.name)
            if choices and value is not None and value not in choices:
                raise ValueError(f"{option.name} must be one of {', '.join(choices)}, not {value!r}")
            problem = out_of_bounds(option.name, value, option.metadata)
            if problem:
                raise ValueError(problem)
        if self.decoder is not None:  # a built-in or an installed plug-in (its entry point; not imported here)
            problem = decoder_problem(self.decoder)
            if problem:
                raise ValueError(problem)
        for name in ("line_band", "line_hold_s"):
            if not getattr(self, name) < float("inf"):
                raise ValueError(f"{name} must be finite and >= 0, not {getattr(self, name)!r}")
        if self.tracking and self.task is not None and not get_task(self.task).boxes:
            raise ValueError(task_problem(self.task, "tracking, lines and zones"))
        if self.lines or self.zones:
            named_regions(self.lines, self.zones)  # the names and shapes every line and zone has (forms.regions)
        if self.events:
            from .events import rules_from_options

            rules_from_options(self)
        if self.sample:
            from .sampling import SamplingRule

            for text in self.sample:
                SamplingRule.parse(text)

    @classmethod
    @functools.cache
    def names(cls) -> tuple[str, ...]:
        """Every option name (the keyword arguments of ``Pipeline`` and the keys of an agent pipeline)."""
        return tuple(option.name for option in dataclasses.fields(cls))

    @classmethod
    def option(cls, name: str) -> dataclasses.Field:
        """The field of option ``name``: its default, and its ``choices`` and bounds in its metadata — what a CLI
        flag or a tool's option that sets it takes and checks (``util.config.out_of_bounds``), as ``__post_init__``
        does; KeyError for an unknown name."""
        return {option.name: option for option in dataclasses.fields(cls)}[name]

    @classmethod
    def merged(cls, options: PipelineOptions | None, overrides: Mapping[str, Any]) -> PipelineOptions:
        """``options`` (or the defaults) with ``overrides`` applied (an option's old name read as its name:
        :data:`RENAMED_OPTIONS`); TypeError names an unknown option."""
        overrides, problems = current_names(overrides, RENAMED_OPTIONS)
        if problems:
            raise TypeError(problems[0])
        unknown = sorted(set(overrides) - set(cls.names()))
        if unknown:
            raise TypeError(f"unknown pipeline option(s) {', '.join(unknown)}; options are: {', '.join(cls.names())}")
        base = options if options is not None else cls()
        return dataclasses.replace(base, **overrides) if overrides else base

    @property
    def decode_reduced(self) -> bool:
        """Whether a source may decode frames smaller than its own size (never when frames are kept, nor
        when events keep evidence: a snapshot at the model's 1/4 scale shows too little)."""
        return (self.reduced_decode and not self.keep_frames and not (self.events and self.evidence_dir)
                and not (self.sample and self.samples_dir))  # a sample is the full-size frame

    @property
    def tracking(self) -> bool:
        """Whether the pipeline tracks (asked for, or implied by lines or zones)."""
        return self.track or bool(self.lines) or bool(self.zones)

    def feed_options(self) -> dict[str, Any]:
        """How frames are fed, as far as the options say (``tasks.read_model``'s keyword arguments)."""
        return {"resize": self.resize, "mean": self.mean, "std": self.std, "channels": self.channels, "pad": self.pad}

    def decoder_settings(self) -> DecoderSettings:
        """The options the task's decoder reads."""
        return DecoderSettings(top_k=self.top_k, score_threshold=self.score_threshold,
                               iou_threshold=self.iou_threshold, max_detections=self.max_detections)

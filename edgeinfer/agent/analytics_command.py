"""The ``set_analytics`` command: a pipeline's counting lines and zones replaced while it runs, kept across restarts.

The new geometry is checked as every line and zone is (``_regions``: the names, a line of nonzero length, a polygon
of 3 distinct points enclosing an area, each name used once; the pipeline's task one with boxes; every point inside
the stream's frame once a frame was seen), applied to the running streams
through :meth:`~edgeinfer.pipeline.analytics.StreamAnalytics.replace_geometry` (tracks carry on, a line or zone
keeping its name keeps its counts), written to ``<data_dir>/analytics/<pipeline>.json`` and applied again to
every later run of the pipeline (the agent's restarts included), overriding agent.yaml's ``lines`` / ``zones``
until the next ``set_analytics``. Reported as an ``analytics_changed`` event.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .._fs import atomic_write_text
from .._regions import check_regions, task_problem
from ..errors import CommandRejected, EdgeInferError
from ..link.vocabulary import Command, EventKind

if TYPE_CHECKING:
    from ..pipeline.multi import MultiPipeline, StreamEvent
    from .commands import CommandContext, CommandRouter
    from .pipeline_config import PipelineConfig
    from .runner import PipelineFactory
    from .services import AgentServices

log = logging.getLogger(__name__)

# the message's form; what a line and a zone are (their names, bounds and shapes) is _regions' to say, in its words
SET_ANALYTICS_ARGS_SCHEMA = {
    "type": "object", "required": ["pipeline", "lines", "zones", "revision"], "additionalProperties": False,
    "properties": {
        "pipeline": {"type": "string", "minLength": 1, "maxLength": 64},
        "stream": {"type": "string", "maxLength": 64},
        "lines": {"type": "object", "additionalProperties": {"type": "array", "items": {"type": "number"}}},
        "zones": {"type": "object", "additionalProperties": {
            "type": "array", "items": {"type": "array", "items": {"type": "number"}}}},
        "revision": {"type": "integer", "minimum": 0},
    },
}
#: the refusal of lines and zones for a pipeline whose results are not boxes
NO_BOXES = "task_without_boxes"


class AnalyticsSettings:
    """``set_analytics`` for the agent: validation, the pipelines' stored geometry, applying it to their runs."""

    def __init__(self, agent: AgentServices, data_dir: Path) -> None:
        self._agent = agent
        self._folder = Path(data_dir) / "analytics"
        self._lock = threading.Lock()

    def register(self, router: CommandRouter) -> None:
        router.register(Command.SET_ANALYTICS, self.handle, args_schema=SET_ANALYTICS_ARGS_SCHEMA,
                        description="replace a pipeline's counting lines and zones without restarting it")

    def factory(self, base: PipelineFactory) -> PipelineFactory:
        """``base`` whose every run starts with its pipeline's stored geometry (a reopened stream gets it again)."""
        def build(config: PipelineConfig) -> MultiPipeline:
            pipeline = base(config)
            self.apply_stored(config.name, pipeline)
            if config.sources:
                pipeline.add_stream_listener(lambda event: self._reopened(config.name, pipeline, event))
            return pipeline

        return build

    def _reopened(self, name: str, pipeline: MultiPipeline, event: StreamEvent) -> None:
        if event.kind == EventKind.STREAM_RESTORED:
            self.apply_stored(name, pipeline)

    # -- the store ----------------------------------------------------------------------------------
    def _path(self, pipeline: str) -> Path:
        return geometry_path(self._folder.parent, pipeline)

    def stored(self, pipeline: str) -> dict[str, Any] | None:
        """``{"revision", "streams": {stream ("" = every stream): {"lines", "zones"}}}`` or None."""
        try:
            return json.loads(self._path(pipeline).read_text())
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as exc:  # unreadable: the agent.yaml's geometry holds, said once
            log.error("stored lines and zones of %s unreadable (%s); using agent.yaml's", pipeline, exc)
            return None

    def apply_stored(self, name: str, pipeline: MultiPipeline) -> None:
        record = self.stored(name)
        if record is None:
            return
        for stream, shapes in record.get("streams", {}).items():
            try:
                apply_geometry(pipeline, _targets(pipeline, stream), shapes["lines"], shapes["zones"], check=False)
            except (EdgeInferError, ValueError, KeyError) as exc:
                log.error("pipeline %s: stored lines and zones not applied: %s", name, exc)

    # -- the command --------------------------------------------------------------------------------
    def handle(self, args: Mapping[str, Any], ctx: CommandContext) -> dict[str, Any]:
        name, stream = args["pipeline"], args.get("stream", "")
        lines, zones, revision = dict(args["lines"]), dict(args["zones"]), int(args["revision"])
        runner = ctx.agent.runner(name)  # ValueError names the pipelines
        streams = [s.name for s in runner.config.sources] or [""]
        if stream not in streams:
            raise CommandRejected("unknown_stream", f"pipeline {name} has no stream {stream!r}")
        with self._lock:
            pipeline = runner.pipeline
            # running: the task its model was read for; else the configured one (None: the model's, unknown yet)
            refusal = task_problem(runner.config.task) if pipeline is None else boxes_refusal(pipeline)
            if refusal:
                raise CommandRejected(NO_BOXES, refusal)
            try:
                check_regions(lines, zones)  # names, bounds, shapes: every line and zone's (_regions)
                if pipeline is not None:
                    apply_geometry(pipeline, _targets(pipeline, stream), lines, zones, check=True)
            except (ValueError, KeyError) as exc:
                raise CommandRejected("invalid_geometry", str(exc)) from None
            record = self.stored(name) or {"streams": {}}
            if not stream:
                record["streams"] = {}  # the whole pipeline's geometry replaces every stream's
            record["streams"][stream] = {"lines": lines, "zones": zones}
            record["revision"] = revision
            self._folder.mkdir(parents=True, exist_ok=True)
            atomic_write_text(self._path(name), json.dumps(record, sort_keys=True))
        data = {"pipeline": name, "stream": stream, "revision": revision, "lines": lines, "zones": zones}
        ctx.agent.emit(EventKind.ANALYTICS_CHANGED, "info",
                       f"pipeline {name}: {len(lines)} line(s), {len(zones)} zone(s) (revision {revision})",
                       pipeline=name, cmd_id=ctx.command_id, data=data)
        return {"pipeline": name, "stream": stream, "revision": revision, "applied": pipeline is not None}


def geometry_path(data_dir: Path, pipeline: str) -> Path:
    """Where ``set_analytics`` keeps a pipeline's lines and zones: ``<data_dir>/analytics/<pipeline>.json``."""
    return Path(data_dir) / "analytics" / f"{pipeline}.json"


def forget_geometry(data_dir: Path, pipeline: str) -> None:
    """Drop what ``set_analytics`` kept for ``pipeline``: a configuration revision that sets its lines or zones (or
    removes it) is the word from now on (agent/config_apply.py)."""
    geometry_path(data_dir, pipeline).unlink(missing_ok=True)


def apply_geometry(pipeline: MultiPipeline, streams: list[str], lines: Mapping[str, Any],
                   zones: Mapping[str, Any], *, check: bool) -> None:
    """Give each of ``streams`` these lines and zones (``check``: every point inside its frame); none is changed
    when one refuses them."""
    from ..pipeline.analytics import analytics_for

    options = pipeline.options
    refusal = boxes_refusal(pipeline)
    if refusal:
        raise CommandRejected(NO_BOXES, refusal)
    planned = []
    for name in streams:
        stream = pipeline.get_stream(name)
        if check:
            _check_inside(name, _frame_size(stream), lines, zones)
        planned.append((stream, analytics_for(options, lines, zones)))  # ValueError from the counters' own checks
    for stream, fresh in planned:
        current = stream.analytics
        if current is None:
            if stream.events is not None:
                fresh.add_listener(stream.events.on_analytics)
            stream.analytics = fresh  # read once per frame by the inference thread: the swap is whole
        else:
            current.replace_geometry(fresh.lines, fresh.zones)


def boxes_refusal(pipeline: MultiPipeline) -> str | None:
    """Why this run takes no lines and zones: its task gives no boxes (``_regions.BOX_TASKS``), or its model is
    read as classes per pixel (a semantic segmenter); None when it takes them."""
    reading = pipeline.reading
    refusal = task_problem(pipeline.options.task)
    if refusal is None and reading is not None and not reading.gives_boxes:
        refusal = (f"lines and zones need results with boxes; task {reading.task!r} read as {reading.layout.name} "
                   "gives none")
    return refusal


def _targets(pipeline: MultiPipeline, stream: str) -> list[str]:
    return pipeline.streams if not stream else [stream]


def _frame_size(stream: Any) -> tuple[int, int] | None:
    """(width, height) of the stream's frames in source pixels, once one was seen."""
    native = stream.source.native_size
    if native is not None:
        return native
    plan = stream.binding.plan
    return None if plan is None else (plan.frame_shape[1], plan.frame_shape[0])


def _check_inside(stream: str, size: tuple[int, int] | None, lines: Mapping[str, Any],
                  zones: Mapping[str, Any]) -> None:
    if size is None:
        return
    width, height = size
    shapes = [("line", name, [coords[:2], coords[2:]]) for name, coords in lines.items()]
    shapes += [("zone", name, points) for name, points in zones.items()]
    for kind, name, points in shapes:
        for x, y in points:
            if not (0 <= x <= width and 0 <= y <= height):
                raise CommandRejected("outside_frame", f"{kind} {name!r}: point ({x:g}, {y:g}) is outside stream "
                                                       f"{stream!r}'s {width}x{height} frame")

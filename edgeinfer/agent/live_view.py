"""The ``live_view`` command: a pipeline stream's annotated frames POSTed to the fleet manager while someone watches.

A :class:`LivePush` per (pipeline, stream) runs a :class:`~edgeinfer.pipeline.live_view.LiveViewFeed` (its own thread, a
box of one frame, bounded by ``fps``, ``width`` and ``max_kbps``) whose sink POSTs each JPEG to the command's
``url`` with the device's credential (:class:`~.uploads.DeviceHTTP`, the uploader's client).
The manager repeats the command while someone watches, each time moving ``until`` on: a repeat updates the
running push. 204 goes on; 410 (nobody watches) stops at once; 401/403 (and any other refusal) stop and are
reported once as an ``error`` event; a network error or a 5xx skips that frame. Nothing is recorded.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from ..errors import CommandRejected
from ..link.vocabulary import Command, EventKind
from ..pipeline.live_view import MAX_FPS, LiveViewFeed
from .uploads import DeviceHTTP

if TYPE_CHECKING:
    from ..pipeline.stats import FrameResult
    from .commands import CommandContext, CommandRouter
    from .runner import PipelineFactory
    from .services import AgentServices

log = logging.getLogger(__name__)

#: seconds one frame's POST may take (a slow uplink skips frames rather than queueing them)
POST_TIMEOUT_S = 5.0
#: ``until`` at most this far ahead (the manager moves it ~30 s on every ~10 s)
MAX_AHEAD_S = 300.0

LIVE_VIEW_ARGS_SCHEMA = {
    "type": "object", "required": ["pipeline", "until", "url"], "additionalProperties": False,
    "properties": {
        "pipeline": {"type": "string", "minLength": 1, "maxLength": 64},
        "stream": {"type": "string", "maxLength": 64},
        "fps": {"type": "number", "exclusiveMinimum": 0, "maximum": MAX_FPS},
        "width": {"type": "integer", "minimum": 64, "maximum": 1920},
        "max_kbps": {"type": "integer", "minimum": 16, "maximum": 100000},
        "until": {"type": "number", "minimum": 0},
        "url": {"type": "string", "pattern": "^https?://[^\\s]+$", "maxLength": 2048},
    },
}


class LivePush:
    """One stream's frames POSTed to ``url`` until ``until``, 410, a refusal or :meth:`stop`."""

    def __init__(self, agent: AgentServices, http: DeviceHTTP, pipeline: str, stream: str, args: Mapping[str, Any]):
        self._agent, self._http = agent, http
        self.pipeline, self.stream, self.url = pipeline, stream, str(args["url"])
        runner = agent.runner(pipeline)
        self.feed = LiveViewFeed(lambda: runner.pipeline, stream, self._post, **_bounds(args))
        #: POSTs answered, failed on the network, and the status that stopped the push
        self.sent = self.failed = 0
        self.stopped_by: int | None = None

    def update(self, args: Mapping[str, Any]) -> None:
        self.url = str(args["url"])
        self.feed.update(**_bounds(args))

    def _post(self, jpeg: bytes, result: FrameResult) -> bool:
        import http.client
        import urllib.error

        headers = {"Content-Type": "image/jpeg", "X-Frame-Time": f"{result.timestamp:.6f}",
                   "X-Frame-Id": str(result.frame_id)}
        if self.feed.source_size is not None:  # the editor draws in these pixels, whatever the JPEG's size
            headers["X-Source-Size"] = "{}x{}".format(*self.feed.source_size)
        try:
            self._http.send("POST", self.url, jpeg, headers, timeout=POST_TIMEOUT_S)
        except urllib.error.HTTPError as exc:
            if exc.code >= 500 or exc.code in (408, 429):
                self.failed += 1
                return True  # the manager is busy: this frame is skipped, the next one tries again
            return self._stopped(exc.code)
        except (OSError, http.client.HTTPException) as exc:
            self.failed += 1
            log.debug("live view %s/%s: frame not sent (%s)", self.pipeline, self.stream, exc)
            return True
        self.sent += 1
        return True

    def _stopped(self, status: int) -> bool:
        self.stopped_by = status
        where = f"{self.pipeline}/{self.stream}" if self.stream else self.pipeline
        if status == 410:
            log.info("live view of %s: nobody watches any more", where)
        else:  # refused: said once; the manager's next live_view starts a new push
            self._agent.emit(EventKind.ERROR, "error", f"the fleet manager refused the live view of {where}: "
                             f"HTTP {status}", pipeline=self.pipeline,
                             data={"reason": "live_view_refused", "status": status, "stream": self.stream})
        return False


class LiveViews:
    """The agent's live pushes, one per (pipeline, stream), and the ``live_view`` command."""

    def __init__(self, agent: AgentServices, http: DeviceHTTP) -> None:
        self._agent, self._http = agent, http
        self._lock = threading.Lock()
        self._pushes: dict[tuple[str, str], LivePush] = {}

    def register(self, router: CommandRouter) -> None:
        router.register(Command.LIVE_VIEW, self.handle, args_schema=LIVE_VIEW_ARGS_SCHEMA,
                        description="push a stream's annotated frames to the fleet manager until a time")

    def handle(self, args: Mapping[str, Any], ctx: CommandContext) -> dict[str, Any]:
        name, stream = args["pipeline"], args.get("stream", "")
        runner = ctx.agent.runner(name)  # ValueError names the pipelines
        streams = [s.name for s in runner.config.sources] or [""]
        if stream not in streams:
            raise CommandRejected("unknown_stream", f"pipeline {name} has no stream {stream!r} "
                                                    f"(streams: {', '.join(map(repr, streams))})")
        until = float(args["until"])
        if until <= time.time():
            raise CommandRejected("until_passed", f"until {until} has passed")
        if until > time.time() + MAX_AHEAD_S:
            raise CommandRejected("until_too_far", f"until is more than {MAX_AHEAD_S:.0f} s ahead")
        with self._lock:
            push = self._pushes.get((name, stream))
            updated = push is not None and push.feed.running
            if updated:
                push.update(args)  # type: ignore[union-attr]
            else:
                push = self._pushes[(name, stream)] = LivePush(self._agent, self._http, name, stream, args)
                push.feed.start()
        feed = push.feed  # type: ignore[union-attr]
        return {"pipeline": name, "stream": stream, "until": until, "fps": feed.fps, "width": feed.width,
                "updated": updated}

    def push(self, pipeline: str, stream: str = "") -> LivePush | None:
        with self._lock:
            return self._pushes.get((pipeline, stream))

    def close(self) -> None:
        """Stop every push (the agent stops)."""
        with self._lock:
            pushes, self._pushes = list(self._pushes.values()), {}
        for push in pushes:
            push.feed.stop()


def _bounds(args: Mapping[str, Any]) -> dict[str, Any]:
    return {"fps": float(args.get("fps", 5.0)), "width": int(args.get("width", 640)),
            "max_kbps": float(args.get("max_kbps", 2000)), "until": float(args["until"])}


def add_view_commands(agent: AgentServices, router: CommandRouter, config: Any,
                      factory: PipelineFactory) -> tuple[LiveViews, PipelineFactory]:
    """Register ``live_view`` and ``set_analytics``; the agent's live views, and ``factory`` giving each run its
    stored lines and zones."""
    from .analytics_command import AnalyticsSettings

    views = LiveViews(agent, DeviceHTTP.of(config))
    views.register(router)
    settings = AnalyticsSettings(agent, config.data_dir)
    settings.register(router)
    return views, settings.factory(factory)

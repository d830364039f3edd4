"""Live updates for the dashboard: Server-Sent Events on ``GET /api/stream``.

One thread (``edgeinfer-fleet-live``) looks at the database once a second while anybody listens —
the database, not this process's ingest, because with several managers the device a page shows may
be stored by another one — and sends each listener what changed: ``overview``, ``devices`` (the
changed rows), ``deployments`` (changed summaries), ``deployment`` (a running deployment with its
devices, when it moved), ``events`` (new ones) and ``commands`` (commands whose record changed: a device's
verdict, a capture's frames counted, an expiry passed — ``verdicts.record`` each). Device rows are compared by
a few cheap columns first, and only the changed ones are read whole, so a thousand quiet devices cost one small
query.

A listener is an asyncio queue on the HTTP server's event loop, fed through
``call_soon_threadsafe``. A listener too slow to take its updates (its queue full) is dropped; the
page reconnects and reloads.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
from collections.abc import AsyncIterator
from typing import Any, TypeVar

from .db import FleetDB
from .overview import EVENTS_SHOWN, overview
from .verdicts import record

log = logging.getLogger(__name__)

POLL_S = 1.0
KEEPALIVE_S = 15.0
QUEUE_SIZE = 256
EVENTS_PER_POLL = 200
#: commands are looked at this far back each turn: their times come from whichever manager wrote them (clocks
#: in sync within this; docs/fleet.md asks for NTP)
CLOCK_SLACK_S = 10.0


def frame(event: str, data: Any) -> bytes:
    """One Server-Sent Events frame (``default=str``: what JSON lacks, such as a Decimal, as text)."""
    return f"event: {event}\ndata: {json.dumps(data, default=str, separators=(',', ':'))}\n\n".encode()


class Loop:
    """A daemon thread running ``_run`` from :meth:`start` until :meth:`close`: ``_wake`` hurries it (set it to
    have it look now), ``_stop`` ends it. The manager's polling threads are such loops."""

    thread_name = "edgeinfer-fleet-loop"

    def __init__(self) -> None:
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self: LoopT) -> LoopT:
        self._thread = threading.Thread(target=self._run, name=self.thread_name, daemon=True)
        self._thread.start()
        return self

    def close(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(5)

    def _run(self) -> None:
        raise NotImplementedError


LoopT = TypeVar("LoopT", bound=Loop)


class LiveFeed(Loop):
    """Polls ``db`` while listeners exist; fans what changed out to each of them."""

    thread_name = "edgeinfer-fleet-live"

    def __init__(self, db: FleetDB, *, poll_s: float = POLL_S) -> None:
        super().__init__()
        self.db = db
        self.poll_s = poll_s
        self._listeners: set[tuple[asyncio.AbstractEventLoop, asyncio.Queue]] = set()
        self._lock = threading.Lock()
        self._marks: dict[str, tuple] = {}
        self._rows: dict[str, dict] = {}  # every device's row as last read (what the overview is made from)
        self._deployments: dict[str, str] = {}
        self._overview: str | None = None
        self._last_event: int | None = None
        self._commands: dict[str, tuple] = {}  # command id -> (state, updated_at) as last sent
        self._commands_seen: float | None = None
        #: looks at the database done so far (the first only takes stock: it sends no devices or events)
        self.polls = 0

    @property
    def listeners(self) -> int:
        return len(self._listeners)

    async def stream(self) -> AsyncIterator[bytes]:
        """What ``GET /api/stream`` sends: frames as things change, a keep-alive comment when quiet."""
        queue: asyncio.Queue = asyncio.Queue(QUEUE_SIZE)
        entry = (asyncio.get_running_loop(), queue)
        with self._lock:
            self._listeners.add(entry)
        self._wake.set()
        try:
            yield b": connected\n\n"
            while True:
                try:
                    item = await asyncio.wait_for(queue.get(), KEEPALIVE_S)
                except asyncio.TimeoutError:
                    yield b": keep-alive\n\n"
                    continue
                if item is None:  # dropped: too slow, or the feed closed
                    return
                yield item
        finally:
            with self._lock:
                self._listeners.discard(entry)

    # ------------------------------------------------------------------------------- the thread
    def _run(self) -> None:
        while not self._stop.is_set():
            if not self._listeners:
                self._wake.wait()
                self._wake.clear()
                continue
            try:
                frames = self.changes()
            except Exception as exc:  # the database may be restarting: try again next turn
                log.warning("live updates: %s", exc)
                frames = []
            for item in frames:
                self._send(item)
            self._stop.wait(self.poll_s)
        self._send(None)

    def _send(self, item: bytes | None) -> None:
        with self._lock:
            listeners = list(self._listeners)
        for loop, queue in listeners:
            try:
                loop.call_soon_threadsafe(_offer, queue, item)
            except RuntimeError:  # its loop has closed
                with self._lock:
                    self._listeners.discard((loop, queue))

    def changes(self) -> list[bytes]:
        """The frames for what changed since the last call (the first call: the new events only)."""
        frames: list[bytes] = []
        marks = self.db.device_marks()
        changed = [device_id for device_id, mark in marks.items() if self._marks.get(device_id) != mark]
        first = not self._marks and self._last_event is None
        self._marks = marks
        rows = self.db.devices_by_id(changed) if changed else []
        self._rows = {**{d: r for d, r in self._rows.items() if d in marks}, **{r["device_id"]: r for r in rows}}
        if rows and not first:
            frames.append(frame("devices", rows))
        self._last_event, events = self.db.events_after(self._last_event, EVENTS_PER_POLL)
        if events and not first:
            frames.append(frame("events", events))
        if changed or events or self._overview is None:  # from the rows kept: no second read of every device
            newest = self.db.events_after(None, EVENTS_SHOWN)[1]
            summary = json.dumps(overview(sorted(self._rows.values(), key=lambda r: r["device_id"]), newest),
                                 default=str)
            if summary != self._overview:
                self._overview = summary
                frames.append(f"event: overview\ndata: {summary}\n\n".encode())
        frames += self._deployment_frames(quiet=first)
        frames += self._command_frames(quiet=first)
        self.polls += 1
        return frames

    def _deployment_frames(self, *, quiet: bool) -> list[bytes]:
        """Changed deployments (``quiet``: only note where each stands; the page has just loaded them)."""
        frames: list[bytes] = []
        summaries = self.db.list_deployments()
        moved = []
        for summary in summaries:
            key = json.dumps([summary.get("status"), summary.get("counts"), summary.get("detail")], default=str)
            if self._deployments.get(summary["deployment_id"]) != key:
                self._deployments[summary["deployment_id"]] = key
                moved.append(summary)
        if moved and not quiet:
            frames.append(frame("deployments", moved))
            for summary in moved:
                full = self.db.get_deployment(summary["deployment_id"])
                if full is not None:
                    frames.append(frame("deployment", full))
        return frames


    def _command_frames(self, *, quiet: bool) -> list[bytes]:
        """Commands whose record changed since the last turn (``quiet``: only take stock)."""
        now = time.time()
        since = (self._commands_seen if self._commands_seen is not None else now) - CLOCK_SLACK_S
        self._commands_seen = now
        records = [record(row, now) for row in self.db.commands.changed(since, now)]
        marks = {r["command_id"]: (r["state"], r["updated_at"]) for r in records}
        moved = [r for r in records if self._commands.get(r["command_id"]) != marks[r["command_id"]]]
        self._commands = marks  # what the window holds: a command that left it comes back only when it changes
        return [frame("commands", moved)] if moved and not quiet else []


def _offer(queue: asyncio.Queue, item: bytes | None) -> None:
    """On the listener's loop: queue the frame; a full queue means a listener too slow — end its stream."""
    try:
        queue.put_nowait(item)
    except asyncio.QueueFull:
        while not queue.empty():
            queue.get_nowait()
        queue.put_nowait(None)

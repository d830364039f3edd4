"""Ingest: from the MQTT callback to the database in batches, acknowledged only once stored.

The link thread hands each message to :meth:`Ingest.deliver`, which only queues it. The queue is
bounded: when the writer falls behind, ``deliver`` blocks, the link stops reading its socket, and
the broker keeps the rest in the manager's persistent session — back-pressure, never a silent
drop here. One writer thread takes what has queued up (up to ``batch_size``, waiting up to
``linger_s`` after a batch's first message for more to join it), validates it, stores it in one
transaction per kind (telemetry de-duplicated on (device, boot_id, seq)), and only then
acknowledges each message (MQTT 5 manual PUBACK), so a crash between receipt and commit loses
nothing: the broker redelivers and the database drops the duplicate.

Why the linger: a transaction costs the writer about 1.5 ms of CPU whatever it holds (checkout, the
pool's ping, the statement, the commit, measured on PostgreSQL) and a message's own share is a tenth
of that; devices connecting one after another send their ``state`` a few milliseconds apart, so
without waiting every batch was one message. Waiting ``linger_s`` (0.1 s) for a batch's company only
delays its storing and acknowledgement by as much; a busy fleet fills a batch before then.

Every message is counted once as received and then as exactly one of stored, duplicate or invalid;
the counters are what ``/metrics`` exposes.
"""

from __future__ import annotations

import gc
import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..errors import ProtocolError
from ..link.protocol import decode, parse_topic, payload_text
from ..util.backoff import Backoff
from .db import FleetDB

log = logging.getLogger(__name__)

DEFAULT_QUEUE_SIZE = 20_000
DEFAULT_BATCH_SIZE = 1_000
#: how long the writer waits after a batch's first message for more to join it (see the module's docstring)
DEFAULT_LINGER_S = 0.1
KINDS = ("state", "telemetry", "events")
_LOG_EVERY_S = 10.0  # at most one warning per this many seconds about malformed messages
#: the cyclic collector's young-generation threshold in a process that ingests (CPython's default: 700)
GC_YOUNG_THRESHOLD = 50_000


def tune_garbage_collector() -> None:
    """For a process whose work is ingest (``fleet serve``), once it has started: every parsed message is
    a few dozen containers, and with CPython's defaults the cyclic collector ran a thousand times per
    40,000 messages and took 12 µs a message, measured, walking the batch in flight and everything the
    server built at start-up. The start-up heap is frozen out of the collector's walks (``gc.freeze``:
    it lives as long as the process) and young collections come every 50,000 allocations instead of
    700. Ingest's garbage is acyclic — reference counting frees it at once — so memory does not grow."""
    gc.freeze()
    _young, middle, old = gc.get_threshold()
    gc.set_threshold(GC_YOUNG_THRESHOLD, middle, old)


@dataclass
class IngestStats:
    """Counters since start; read by /metrics and benchmarks (plain ints: one writer updates them)."""

    received: dict[str, int] = field(default_factory=lambda: dict.fromkeys(KINDS, 0))
    stored: dict[str, int] = field(default_factory=lambda: dict.fromkeys(KINDS, 0))
    duplicates: int = 0
    invalid: int = 0
    batches: int = 0
    write_errors: int = 0
    blocked_s: float = 0.0  # time the MQTT thread waited for room in the queue (back-pressure)
    last_batch_s: float = 0.0

    def snapshot(self) -> dict[str, Any]:
        return {"received": sum(self.received.values()), "stored": sum(self.stored.values()),
                "duplicates": self.duplicates, "invalid": self.invalid, "batches": self.batches,
                "write_errors": self.write_errors, "blocked_s": round(self.blocked_s, 3),
                "by_kind": {"received": dict(self.received), "stored": dict(self.stored)}}


@dataclass
class _Batch:
    """Decoded messages, ``(kind, fleet, device, message, text, delivery)`` each, and the deliveries of the
    ones not to be stored (malformed, a cleared retained state): all acknowledged once the batch commits."""

    entries: list[tuple[str, str, str, dict, str, Any]] = field(default_factory=list)
    unstored: list[Any] = field(default_factory=list)

    def of_kind(self, kind: str) -> list[tuple[str, str, dict, str]]:
        return [(fleet, device, message, text) for k, fleet, device, message, text, _ in self.entries if k == kind]

    def deliveries(self) -> list[Any]:
        return [*self.unstored, *(entry[5] for entry in self.entries)]

    def halves(self) -> tuple[_Batch, _Batch]:
        middle = len(self.entries) // 2
        return _Batch(self.entries[:middle], self.unstored), _Batch(self.entries[middle:])


def _refused(exc: BaseException) -> bool:
    """The database refused the data (a value out of range, text it cannot hold), as opposed to being
    unavailable: retrying the same rows would fail the same way for ever."""
    import sqlalchemy as sa

    if isinstance(exc, sa.exc.DBAPIError):
        return isinstance(exc, (sa.exc.DataError, sa.exc.IntegrityError))
    return isinstance(exc, (ValueError, TypeError, OverflowError, UnicodeError, sa.exc.StatementError))


class Ingest:
    """A bounded queue and one writer thread between the MQTT link and the fleet database."""

    def __init__(self, db: FleetDB, *, on_event: Callable[[str, dict], None] | None = None,
                 on_state: Callable[[str, dict], None] | None = None, queue_size: int = DEFAULT_QUEUE_SIZE,
                 batch_size: int = DEFAULT_BATCH_SIZE, linger_s: float = DEFAULT_LINGER_S) -> None:
        self.db = db
        self.stats = IngestStats()
        self.queue_size = queue_size
        self.batch_size = batch_size
        self.linger_s = linger_s
        self._on_event = on_event
        self._on_state = on_state
        self._queue: queue.Queue[tuple[str, bytes, Any] | None] = queue.Queue(maxsize=queue_size)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="edgeinfer-fleet-ingest", daemon=True)
        self._last_warning = 0.0

    @property
    def depth(self) -> int:
        return self._queue.qsize()

    def start(self) -> Ingest:
        self._thread.start()
        return self

    def close(self, timeout: float = 10.0) -> None:
        """Store what is queued (up to ``timeout``), then stop; unstored messages stay unacknowledged."""
        if self._thread.is_alive():
            self._stop.set()
            try:
                self._queue.put(None, timeout=timeout)
            except queue.Full:
                pass
            self._thread.join(timeout)

    # ------------------------------------------------------------------------------ link thread
    def deliver(self, topic: str, payload: bytes, delivery: Any) -> None:
        """The link's ``on_delivery``: queue the message, waiting for room when the writer is behind."""
        kind = topic.rpartition("/")[2]
        self.stats.received[kind if kind in KINDS else "events"] += 1
        item = (topic, payload, delivery)
        try:
            self._queue.put_nowait(item)
        except queue.Full:
            started = time.monotonic()
            while not self._stop.is_set():
                try:
                    self._queue.put(item, timeout=0.5)
                    break
                except queue.Full:
                    continue
            self.stats.blocked_s += time.monotonic() - started

    # ------------------------------------------------------------------------------ writer thread
    def _run(self) -> None:
        backoff = Backoff(initial_s=0.2, max_s=10.0)
        pending: _Batch | None = None
        failures = 0
        while True:
            if pending is None:
                pending, last = self._take()
                if pending is None:
                    return
            else:
                last = self._stop.is_set()
            try:
                self._store(pending)
            except Exception as exc:  # the database is down: keep the batch, retry, never ack
                self.stats.write_errors += 1
                failures += 1
                delay = backoff.delay(failures)
                log.error("fleet database write failed (%s: %s); retrying in %.1f s, %d messages held",
                          type(exc).__name__, exc, delay, len(pending.entries) + len(pending.unstored))
                if self._stop.wait(delay) and failures > 3:
                    return
                continue
            failures = 0
            pending = None
            if last:
                return

    def _take(self) -> tuple[_Batch | None, bool]:
        """Block for one message, then take what else is waiting or comes within ``linger_s`` (up to batch_size).
        (batch, stop after it)."""
        first = self._queue.get()
        if first is None:
            return None, True
        items, last = [first], False
        until = time.monotonic() + self.linger_s
        while len(items) < self.batch_size:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                left = until - time.monotonic()
                if left <= 0 or self._stop.is_set():
                    break
                try:
                    item = self._queue.get(timeout=left)
                except queue.Empty:
                    break
            if item is None:
                last = True
                break
            items.append(item)
        return self._sort(items), last

    def _sort(self, items: list[tuple[str, bytes, Any]]) -> _Batch:
        batch = _Batch()
        for topic, payload, delivery in items:
            try:
                fleet, device, kind = parse_topic(topic)
                if kind == "state" and not payload:
                    batch.unstored.append(delivery)  # a cleared retained message
                    continue
                text = payload_text(kind, payload)
                message = decode(kind, text)
                if kind == "cmd":
                    raise ProtocolError("a device does not publish commands")
            except ProtocolError as exc:
                self.stats.invalid += 1
                batch.unstored.append(delivery)
                self._warn(topic, exc)
                continue
            batch.entries.append((kind, fleet, device, message, text, delivery))
        return batch

    def _store(self, batch: _Batch) -> None:
        """Write the batch. When the database refuses its data rather than being unavailable, find the
        messages it refuses by halves, count each invalid, acknowledge it and store the rest: one bad
        message never holds up the fleet's ingest."""
        try:
            self._write(batch)
        except Exception as exc:
            if not _refused(exc):
                raise
            if len(batch.entries) > 1:
                for half in batch.halves():
                    self._store(half)
                return
            self.stats.invalid += 1
            for delivery in batch.deliveries():
                delivery.ack()
            kind, _fleet, device, *_ = batch.entries[0] if batch.entries else ("?", "", "?")
            log.warning("the fleet database refused a %s message from %s (%s: %s); it is dropped", kind, device,
                        type(exc).__name__, _first_line(exc))

    def _write(self, batch: _Batch) -> None:
        started = time.perf_counter()
        telemetry, events = batch.of_kind("telemetry"), batch.of_kind("events")
        states = batch.of_kind("state")
        stored, duplicates = self.db.store_telemetry(telemetry) if telemetry else (0, 0)
        stored_events = self.db.store_events([item[:3] for item in events]) if events else 0
        if states:
            self.db.record_states([item[:3] for item in states])
        # e.g. rollout progress, before the ack: a crash here gets a redelivery
        for callback, items in ((self._on_event, events), (self._on_state, states)):
            for _fleet, device, message, _text in items if callback is not None else ():
                try:
                    callback(device, message)
                except Exception:
                    log.exception("following a %s message from %s failed", message.get("type"), device)
        for delivery in batch.deliveries():
            delivery.ack()
        self.stats.stored["telemetry"] += stored
        self.stats.stored["events"] += stored_events
        self.stats.stored["state"] += len(states)
        self.stats.duplicates += duplicates
        self.stats.batches += 1
        self.stats.last_batch_s = time.perf_counter() - started

    def _warn(self, topic: str, exc: Exception) -> None:
        now = time.monotonic()
        if now - self._last_warning >= _LOG_EVERY_S:
            self._last_warning = now
            log.warning("ignoring a malformed message on %s: %s (%d malformed so far)", topic, exc,
                        self.stats.invalid)


def _first_line(exc: BaseException) -> str:
    """The first line of an error's text, never an error of its own (a hostile value in it may be odd)."""
    try:
        return str(exc).splitlines()[0][:200]
    except Exception:
        return "(no text)"

"""A bounded on-disk store-and-forward queue for outgoing MQTT messages (SQLite in WAL mode).

A message counts as sent only once the broker has acknowledged it: the agent appends every
telemetry window and event here first, :mod:`edgeinfer.link.mqtt` publishes rows oldest first at QoS 1,
and a row is deleted only when the PUBACK for its packet arrives. Rows therefore survive network
cuts, broker restarts and the agent's own crashes, and drain in order afterwards.

The spool is bounded by the bytes it may take on disk (database + WAL + shared-memory file). When
it is full the oldest rows are dropped — telemetry before events — and the drop counters, which
survive restarts, say how many. Rows handed to the MQTT client and not yet acknowledged are kept
while anything else can go, so a message is never both counted as dropped and delivered.

``synchronous=NORMAL`` in WAL mode: a committed row survives a crash or SIGKILL of the agent; a
power cut can lose the last few commits but never corrupts the file. That trade keeps SD cards
alive (no fsync per telemetry window).
"""

from __future__ import annotations

import logging
import os
import sqlite3
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from ..errors import ClosedError

log = logging.getLogger(__name__)

DEFAULT_MAX_BYTES = 64 * 1024 * 1024
MIN_MAX_BYTES = 256 * 1024
PAGE_SIZE = 4096
#: SQLite's page cache per connection, KiB: the spool is written once and read once, a cache buys little
CACHE_KIB = 256
#: bytes a row costs beyond its topic and payload (row header, index entry, page slack)
ROW_OVERHEAD = 96
#: share of the data budget rows may fill; the rest absorbs B-tree page slack and free-list growth
FILL_FACTOR = 0.75

PRIORITY_TELEMETRY = 0  # dropped first when the spool is full
PRIORITY_EVENT = 1

_SCHEMA = """
CREATE TABLE IF NOT EXISTS messages (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    topic TEXT NOT NULL,
    payload BLOB NOT NULL,
    qos INTEGER NOT NULL,
    retain INTEGER NOT NULL,
    priority INTEGER NOT NULL,
    created REAL NOT NULL,
    size INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS messages_by_priority ON messages (priority, id);
CREATE TABLE IF NOT EXISTS counters (name TEXT PRIMARY KEY, value INTEGER NOT NULL);
"""


@dataclass(frozen=True)
class SpooledMessage:
    """One row of the spool."""

    id: int
    topic: str
    payload: bytes
    qos: int
    retain: bool
    priority: int
    created: float


@dataclass(frozen=True)
class SpoolStats:
    """A snapshot of the spool's counters."""

    pending: int
    bytes: int
    dropped: int
    dropped_events: int
    rejected: int
    disk_bytes: int
    max_bytes: int

    def to_dict(self) -> dict[str, int]:
        return {"pending": self.pending, "bytes": self.bytes, "dropped": self.dropped,
                "dropped_events": self.dropped_events, "rejected": self.rejected,
                "disk_bytes": self.disk_bytes, "max_bytes": self.max_bytes}


def _wal_pages(max_bytes: int) -> int:
    return max(8, min(1000, max_bytes // 16 // PAGE_SIZE))


def data_budget(max_bytes: int) -> int:
    """Bytes of rows (as counted by the spool) that fit in ``max_bytes`` of disk."""
    # WAL up to its checkpoint size plus one transaction's overshoot, the -shm index, the schema pages
    reserve = (_wal_pages(max_bytes) + 24) * PAGE_SIZE + 32 * 1024 + 8 * PAGE_SIZE
    return max(0, int((max_bytes - reserve) * FILL_FACTOR))


class Spool:
    """Bounded, persistent, ordered queue of outgoing messages. Thread-safe; close() is idempotent."""

    def __init__(self, path: str | os.PathLike[str], *, max_bytes: int = DEFAULT_MAX_BYTES) -> None:
        if max_bytes < MIN_MAX_BYTES:
            raise ValueError(f"spool max_bytes must be at least {MIN_MAX_BYTES} (got {max_bytes})")
        self.path = Path(path)
        self.max_bytes = max_bytes
        self._budget = data_budget(max_bytes)
        self._lock = threading.Lock()
        self._inflight: dict[int, int] = {}  # row id -> size, rows handed out and not yet acked
        self._closed = False
        self.path.parent.mkdir(parents=True, exist_ok=True)
        try:
            self._conn = self._open()
        except sqlite3.DatabaseError as exc:
            # A spool that SQLite cannot read (disk error, someone wrote over it) must not stop the
            # agent: keep the file for a post-mortem, start empty, and say so.
            aside = self.path.with_name(f"{self.path.name}.corrupt-{int(time.time())}")
            log.error("spool %s is unreadable (%s); moved it to %s and starting an empty spool", self.path, exc, aside)
            for suffix in ("-wal", "-shm"):
                Path(f"{self.path}{suffix}").unlink(missing_ok=True)
            self.path.replace(aside)
            self._conn = self._open()
        self._recount()
        seq = self._conn.execute("SELECT seq FROM sqlite_sequence WHERE name = 'messages'").fetchone()
        self._last_id = int(seq[0]) if seq else 0
        with self._lock:
            self._transaction(self._trim)
        if self.disk_bytes() > max_bytes:  # the bound was lowered since the file grew: give pages back
            # executescript steps the pragma to completion (execute() would free a single page)
            self._conn.executescript("PRAGMA incremental_vacuum;")
            self._conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()

    def _open(self) -> sqlite3.Connection:
        conn = sqlite3.connect(str(self.path), check_same_thread=False, isolation_level=None, timeout=10)
        try:
            # page_size and auto_vacuum only take effect on a new database; harmless afterwards
            conn.execute(f"PRAGMA page_size = {PAGE_SIZE}")
            conn.execute("PRAGMA auto_vacuum = INCREMENTAL")
            mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
            if str(mode).lower() != "wal":
                raise sqlite3.DatabaseError(f"cannot switch {self.path} to WAL mode (got {mode})")
            conn.execute("PRAGMA synchronous = NORMAL")
            conn.execute(f"PRAGMA cache_size = -{CACHE_KIB}")  # the default 2 MiB would fill with telemetry pages
            wal = _wal_pages(self.max_bytes)
            conn.execute(f"PRAGMA wal_autocheckpoint = {wal}")
            conn.execute(f"PRAGMA journal_size_limit = {wal * PAGE_SIZE}")
            conn.executescript(_SCHEMA)
            conn.execute("PRAGMA quick_check").fetchone()
        except BaseException:
            conn.close()
            raise
        return conn

    # ---------------------------------------------------------------------------------- writing
    def append(self, topic: str, payload: bytes, *, qos: int = 1, retain: bool = False,
               priority: int = PRIORITY_TELEMETRY) -> int:
        """Store one message durably; return its id. May drop the oldest rows to stay in bound."""
        size = len(payload) + len(topic.encode()) + ROW_OVERHEAD
        with self._lock:
            self._check_open()

            def insert() -> int:
                cursor = self._conn.execute(
                    "INSERT INTO messages (topic, payload, qos, retain, priority, created, size) "
                    "VALUES (?, ?, ?, ?, ?, ?, ?)",
                    (topic, bytes(payload), qos, int(retain), priority, time.time(), size))
                row_id = int(cursor.lastrowid)
                self._bytes += size
                self._count += 1
                self._last_id = row_id
                self._trim()
                return row_id

            return self._transaction(insert)

    def _trim(self) -> None:
        """Drop the oldest rows (lowest priority first) until the rows fit the budget. Lock held."""
        while self._bytes > self._budget and self._count > 0:
            protected = list(self._inflight)
            rows = self._conn.execute(
                f"SELECT id, size, priority FROM messages WHERE id NOT IN ({','.join('?' * len(protected))}) "
                "ORDER BY priority, id LIMIT 256", protected).fetchall()
            if not rows:  # everything left is in flight: a bound this small cannot protect them
                rows = self._conn.execute(
                    "SELECT id, size, priority FROM messages ORDER BY priority, id LIMIT 256").fetchall()
            victims: list[int] = []
            events = 0
            for row_id, size, priority in rows:
                if self._bytes <= self._budget:
                    break
                victims.append(row_id)
                self._bytes -= size
                self._count -= 1
                events += priority >= PRIORITY_EVENT
                self._inflight.pop(row_id, None)
            self._conn.execute(f"DELETE FROM messages WHERE id IN ({','.join('?' * len(victims))})", victims)
            self._bump("dropped", len(victims))
            if events:
                self._bump("dropped_events", events)
            log.debug("spool full: dropped %d oldest message(s)", len(victims))

    def _bump(self, name: str, by: int) -> None:
        self._conn.execute("INSERT INTO counters (name, value) VALUES (?, ?) "
                           "ON CONFLICT(name) DO UPDATE SET value = value + excluded.value", (name, by))

    # ---------------------------------------------------------------------------------- reading
    def fetch(self, after_id: int, limit: int) -> list[SpooledMessage]:
        """Up to ``limit`` rows with id > ``after_id``, oldest first; they count as in flight until ack/release."""
        with self._lock:
            self._check_open()
            rows = self._conn.execute(
                "SELECT id, topic, payload, qos, retain, priority, created, size FROM messages WHERE id > ? "
                "ORDER BY id LIMIT ?", (after_id, limit)).fetchall()
            out = []
            for row_id, topic, payload, qos, retain, priority, created, size in rows:
                self._inflight[row_id] = size
                out.append(SpooledMessage(row_id, topic, bytes(payload), qos, bool(retain), priority, created))
            return out

    def ack(self, row_id: int, *, rejected: bool = False) -> None:
        """The broker acknowledged row ``row_id`` (or refused it for good, ``rejected``): delete it."""
        with self._lock:
            if self._closed:
                return

            def delete() -> None:
                row = self._conn.execute("SELECT size FROM messages WHERE id = ?", (row_id,)).fetchone()
                self._inflight.pop(row_id, None)
                if row is not None:
                    self._conn.execute("DELETE FROM messages WHERE id = ?", (row_id,))
                    self._count -= 1
                    self._bytes -= int(row[0])
                if rejected:
                    self._bump("rejected", 1)

            self._transaction(delete)

    def release(self, ids: Iterable[int]) -> None:
        """Rows handed out by fetch() that will not be published after all (e.g. the client refused them)."""
        with self._lock:
            for row_id in ids:
                self._inflight.pop(row_id, None)

    def release_all(self) -> None:
        """Forget every in-flight mark (the client that held them is gone)."""
        with self._lock:
            self._inflight.clear()

    # ---------------------------------------------------------------------------------- figures
    @property
    def last_id(self) -> int:
        """The id of the newest row ever appended (cheap: no query)."""
        return self._last_id

    @property
    def pending(self) -> int:
        """Rows not yet acknowledged by the broker."""
        return self._count

    def counter(self, name: str) -> int:
        """A cumulative counter: ``dropped``, ``dropped_events`` or ``rejected``."""
        with self._lock:
            self._check_open()
            row = self._conn.execute("SELECT value FROM counters WHERE name = ?", (name,)).fetchone()
            return int(row[0]) if row else 0

    def disk_bytes(self) -> int:
        """Bytes the spool takes on disk: the database, its WAL and its shared-memory index."""
        total = 0
        for suffix in ("", "-wal", "-shm"):
            try:
                total += os.stat(f"{self.path}{suffix}").st_size
            except FileNotFoundError:
                pass
        return total

    def stats(self) -> SpoolStats:
        """Pending rows, their bytes, cumulative drop/reject counters, bytes on disk."""
        with self._lock:
            self._check_open()
            counters = dict(self._conn.execute("SELECT name, value FROM counters").fetchall())
            pending, size = self._count, self._bytes
        return SpoolStats(pending=pending, bytes=size, dropped=int(counters.get("dropped", 0)),
                          dropped_events=int(counters.get("dropped_events", 0)),
                          rejected=int(counters.get("rejected", 0)), disk_bytes=self.disk_bytes(),
                          max_bytes=self.max_bytes)

    # ---------------------------------------------------------------------------------- lifetime
    def _transaction(self, work):  # type: ignore[no-untyped-def]
        self._conn.execute("BEGIN IMMEDIATE")
        try:
            result = work()
        except BaseException:
            self._conn.execute("ROLLBACK")
            self._recount()
            raise
        self._conn.execute("COMMIT")
        return result

    def _recount(self) -> None:
        row = self._conn.execute("SELECT COALESCE(SUM(size), 0), COUNT(*) FROM messages").fetchone()
        self._bytes, self._count = int(row[0]), int(row[1])

    def _check_open(self) -> None:
        if self._closed:
            raise ClosedError(f"spool {self.path} is closed — open a new one")

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        """Checkpoint the WAL into the database and close. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            try:
                self._conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            except sqlite3.Error as exc:  # closing must not fail; the WAL is replayed on next open
                log.debug("spool checkpoint at close failed: %s", exc)
            self._conn.close()

    def __enter__(self) -> Spool:
        self._check_open()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<Spool {self.path} pending={self._count} bytes={self._bytes}/{self._budget}>"

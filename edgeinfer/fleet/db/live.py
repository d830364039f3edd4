"""The live view in the fleet database: one ``live_frames`` row per watched (device, pipeline, stream) — until
when someone watches it and its newest frame, overwritten by the next — and one ``analytics`` row per pipeline
with the lines and zones last sent, their revision and command, and those the device last said it applied.

Rows, not this process's memory, because the device may post its frames to one manager behind a load balancer
while the viewer reads from another; each manager polls the rows its own viewers watch (``fleet/liveview.py``).
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

from ...link.vocabulary import EventKind
from .schema import Tables

Key = tuple[str, str, str]  # device, pipeline, stream ("" for a single source)


def _where(t: Any, key: Key) -> Any:
    c = t.c
    return (c.device_id == key[0]) & (c.pipeline == key[1]) & (c.stream == key[2])


def watch(sa: Any, engine: Any, t: Tables, key: Key, until: float) -> None:
    """Someone watches ``key`` until ``until`` (never moved back): an update, or the row's insert."""
    table = t.live_frames
    with engine.begin() as conn:
        done = conn.execute(table.update().where(_where(table, key) & (table.c.watched_until < until))
                            .values(watched_until=until)).rowcount
        if done or conn.execute(sa.select(table.c.seq).where(_where(table, key))).first() is not None:
            return
    try:
        with engine.begin() as conn:
            conn.execute(table.insert().values(device_id=key[0], pipeline=key[1], stream=key[2], watched_until=until,
                                               seq=0))
    except sa.exc.IntegrityError:  # another manager's viewer inserted it first
        watch(sa, engine, t, key, until)


def put_frame(sa: Any, engine: Any, t: Tables, key: Key, frame: dict, *, now: float | None = None) -> int | None:
    """Store ``frame`` (jpeg, width, height, frame_time, frame_id) as ``key``'s newest while someone watches it:
    its seq, or None when nobody does (the frame is dropped)."""
    table, now = t.live_frames, time.time() if now is None else now
    with engine.begin() as conn:
        done = conn.execute(table.update().where(_where(table, key) & (table.c.watched_until >= now))
                            .values(seq=table.c.seq + 1, received_at=now, **frame)).rowcount
        if not done:
            return None
        return int(conn.execute(sa.select(table.c.seq).where(_where(table, key))).scalar_one())


def newer(sa: Any, engine: Any, t: Tables, seen: dict[Key, int]) -> list[dict]:
    """The rows of the keys in ``seen`` whose frame is newer than the seq seen (jpeg included)."""
    if not seen:
        return []
    table = t.live_frames
    found: list[dict] = []
    with engine.connect() as conn:
        for key, seq in seen.items():  # a handful of watched keys per manager: one indexed lookup each
            row = conn.execute(sa.select(table).where(_where(table, key) & (table.c.seq > seq)
                                                      & table.c.jpeg.is_not(None))).mappings().first()
            if row is not None:
                found.append(dict(row))
    return found


def frame(sa: Any, engine: Any, t: Tables, key: Key) -> dict | None:
    """``key``'s row with its newest frame, or None when it has none."""
    table = t.live_frames
    with engine.connect() as conn:
        row = conn.execute(sa.select(table).where(_where(table, key) & table.c.jpeg.is_not(None))).mappings().first()
    return dict(row) if row else None


def frame_size(sa: Any, engine: Any, t: Tables, device_id: str, pipeline: str,
               stream: str | None) -> tuple[int, int] | None:
    """(width, height) of the newest frame of the pipeline (of ``stream``, or of any of its streams)."""
    table, c = t.live_frames, t.live_frames.c
    query = sa.select(c.width, c.height).where((c.device_id == device_id) & (c.pipeline == pipeline)
                                               & c.width.is_not(None))
    if stream is not None:
        query = query.where(c.stream == stream)
    with engine.connect() as conn:
        row = conn.execute(query.order_by(table.c.received_at.desc()).limit(1)).first()
    return (int(row[0]), int(row[1])) if row else None


def save_analytics(sa: Any, engine: Any, t: Tables, key: Key, lines: dict, zones: dict,
                   command_id: str | None = None) -> int:
    """Store a pipeline's new lines and zones, sent by ``command_id``: their revision, one past the last (1 for
    the first)."""
    table = t.analytics
    for _ in range(5):  # two managers saving at once: one write wins, the other goes round again
        try:
            with engine.begin() as conn:
                last = conn.execute(sa.select(table.c.revision).where(_where(table, key))).scalar()
                revision = (last or 0) + 1
                values = {"revision": revision, "lines": lines, "zones": zones, "updated_at": time.time(),
                          "command_id": command_id}
                if last is None:
                    conn.execute(table.insert().values(device_id=key[0], pipeline=key[1], stream=key[2], **values))
                    return revision
                if conn.execute(table.update().where(_where(table, key) & (table.c.revision == last))
                                .values(**values)).rowcount:
                    return revision
        except sa.exc.IntegrityError:
            continue
    raise RuntimeError(f"the analytics of {key} keep changing under this writer")


def analytics(sa: Any, engine: Any, t: Tables, key: Key) -> dict | None:
    with engine.connect() as conn:
        row = conn.execute(sa.select(t.analytics).where(_where(t.analytics, key))).mappings().first()
    return dict(row) if row else None


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _applied(data: Any) -> tuple[Key, int, dict, dict] | None:
    """(pipeline key but its device, revision, lines, zones) of an ``analytics_changed`` event's data when it has
    the form the agent sends (lines ``{name: [x1, y1, x2, y2]}``, zones ``{name: [[x, y], ...]}``), else None."""
    if not isinstance(data, Mapping):
        return None
    pipeline, stream, revision = data.get("pipeline"), data.get("stream") or "", data.get("revision")
    lines, zones = data.get("lines"), data.get("zones")
    if not (isinstance(pipeline, str) and 0 < len(pipeline) <= 64 and isinstance(stream, str) and len(stream) <= 64
            and isinstance(revision, int) and not isinstance(revision, bool) and 0 <= revision < 2**62
            and isinstance(lines, Mapping) and isinstance(zones, Mapping)):
        return None
    if not all(isinstance(v, list) and len(v) == 4 and all(map(_number, v)) for v in lines.values()):
        return None
    if not all(isinstance(v, list) and all(isinstance(p, list) and len(p) == 2 and all(map(_number, p)) for p in v)
               for v in zones.values()):
        return None
    return ("", pipeline, stream), revision, dict(lines), dict(zones)


def record_applied(conn: Any, t: Tables, events: Sequence[tuple[str, dict]], now: float) -> int:
    """The lines and zones devices say they applied (their ``analytics_changed`` events), in ingest's transaction:
    a pipeline's applied revision only moves forward, so a redelivered or older event changes nothing. Only a
    pipeline the manager sent lines and zones has a row. How many rows changed."""
    table, changed = t.analytics, 0
    for device_id, event in events:
        found = _applied(event.get("data")) if event.get("event") == EventKind.ANALYTICS_CHANGED else None
        if found is None:
            continue
        (_, pipeline, stream), revision, lines, zones = found
        older = table.c.applied_revision.is_(None) | (table.c.applied_revision < revision)
        changed += conn.execute(table.update().where(_where(table, (device_id, pipeline, stream)) & older).values(
            applied_revision=revision, applied_lines=lines, applied_zones=zones, applied_at=now)).rowcount
    return changed


def forget(sa: Any, engine: Any, t: Tables, before: float) -> int:
    """Delete the rows nobody has watched since ``before`` (the last frame stays that long for the editor)."""
    with engine.begin() as conn:
        return conn.execute(t.live_frames.delete().where(t.live_frames.c.watched_until < before)).rowcount


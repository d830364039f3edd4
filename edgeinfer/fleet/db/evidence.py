"""Event evidence in the fleet database: one ``evidence`` row per stored file (size, sha256, how many
chunks, how many frames) and its bytes in ``evidence_chunks``, a chunk a row; the events list with
each event's evidence; retention by total bytes (the oldest stored first).

A file is written in one transaction, its row and every chunk, so a reader sees all of it or none.
Its row is the file's identity: a second writer of the same file (an agent's retry, or the same
upload reaching two managers) fails on the primary key and is told what is stored instead.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from typing import Any

from ...forms.evidence import EVENT_ID
from .schema import Tables

#: how many events the retention pass looks at per round
PRUNE_BATCH = 500


def event_id_of(event: dict) -> str | None:
    """``data.event_id`` of a device event, when it is an evidence event id (rule_triggered); else None."""
    data = event.get("data")
    candidate = data.get("event_id") if isinstance(data, dict) else None
    return candidate if isinstance(candidate, str) and EVENT_ID.match(candidate) else None


def _key(t: Tables, device_id: str, event_id: str, file: str) -> Any:
    c = t.evidence.c
    return (c.device_id == device_id) & (c.event_id == event_id) & (c.file == file)


def get(sa: Any, engine: Any, t: Tables, device_id: str, event_id: str, file: str) -> dict | None:
    """The file's row (size, sha256, chunks, frames, created_at), or None when it is not stored."""
    with engine.connect() as conn:
        row = conn.execute(sa.select(t.evidence).where(_key(t, device_id, event_id, file))).mappings().first()
    return dict(row) if row else None


def put(sa: Any, engine: Any, t: Tables, row: dict, chunks: Iterable[bytes]) -> tuple[str, dict]:
    """Store a file: ``row`` (device_id, event_id, file, size, sha256, chunks, frames) and its ``chunks`` in
    one transaction. ("created", row); or, when the file is stored already, ("same", stored row) for the
    same sha256 and ("conflict", stored row) for other bytes — nothing is written then."""
    key = (row["device_id"], row["event_id"], row["file"])
    row = {**row, "created_at": time.time()}
    existing = get(sa, engine, t, *key)
    if existing is None:
        try:
            with engine.begin() as conn:
                conn.execute(t.evidence.insert().values(**row))
                for seq, data in enumerate(chunks):  # one statement a chunk: never more than a chunk in hand
                    conn.execute(t.evidence_chunks.insert().values(device_id=key[0], event_id=key[1], file=key[2],
                                                                   seq=seq, data=data))
            return "created", row
        except sa.exc.IntegrityError:  # another upload of the same file committed first
            existing = get(sa, engine, t, *key)
            if existing is None:
                raise
    return ("same" if existing["sha256"] == row["sha256"] else "conflict"), existing


def chunk(sa: Any, engine: Any, t: Tables, device_id: str, event_id: str, file: str, seq: int) -> bytes | None:
    """The ``seq``-th chunk of a stored file; None when it is gone (deleted by retention meanwhile)."""
    c = t.evidence_chunks.c
    query = sa.select(c.data).where((c.device_id == device_id) & (c.event_id == event_id) & (c.file == file)
                                    & (c.seq == seq))
    with engine.connect() as conn:
        data = conn.execute(query).scalar()
    return bytes(data) if data is not None else None


def of_events(sa: Any, engine: Any, t: Tables, keys: Sequence[tuple[str, str]]) -> dict[tuple[str, str], dict]:
    """{(device_id, event_id): {file: its row}} for the events among ``keys`` that have evidence stored."""
    found: dict[tuple[str, str], dict] = {}
    keys = sorted(set(keys))
    c = t.evidence.c
    for start in range(0, len(keys), 500):
        query = sa.select(c.device_id, c.event_id, c.file, c.size, c.sha256, c.frames).where(
            sa.tuple_(c.device_id, c.event_id).in_(keys[start:start + 500]))
        with engine.connect() as conn:
            for row in conn.execute(query).mappings():
                found.setdefault((row["device_id"], row["event_id"]), {})[row["file"]] = dict(row)
    return found


def total_bytes(sa: Any, engine: Any, t: Tables) -> int:
    with engine.connect() as conn:
        return int(conn.execute(sa.select(sa.func.coalesce(sa.func.sum(t.evidence.c.size), 0))).scalar() or 0)


def prune(sa: Any, engine: Any, t: Tables, max_bytes: int, *, keep: tuple[str, str] | None = None) -> list[tuple]:
    """Delete whole events' evidence, the first stored first, until the files add up to ``max_bytes`` at most;
    ``keep``: an event never deleted here (the one just stored). The (device_id, event_id) deleted."""
    e, ch = t.evidence, t.evidence_chunks
    deleted: list[tuple[str, str]] = []
    while (excess := total_bytes(sa, engine, t) - max_bytes) > 0:
        first = sa.func.min(e.c.created_at).label("first")
        query = (sa.select(e.c.device_id, e.c.event_id, sa.func.sum(e.c.size), first)
                 .group_by(e.c.device_id, e.c.event_id).order_by(first, e.c.event_id, e.c.device_id)
                 .limit(PRUNE_BATCH))
        victims, freed = [], 0
        with engine.connect() as conn:
            for device_id, event_id, size, _first in conn.execute(query):
                if (device_id, event_id) == keep:
                    continue
                victims.append((device_id, event_id))
                freed += int(size)
                if freed >= excess:
                    break
        if not victims:
            break
        with engine.begin() as conn:
            conn.execute(ch.delete().where(sa.tuple_(ch.c.device_id, ch.c.event_id).in_(victims)))
            conn.execute(e.delete().where(sa.tuple_(e.c.device_id, e.c.event_id).in_(victims)))
        deleted += victims
    return deleted


def list_events(sa: Any, engine: Any, t: Tables, *, device_id: str | None = None, kind: str | None = None,
                event_id: str | None = None, limit: int = 100) -> list[dict]:
    """Events newest first (by the device's time, then arrival): ``{"id", "device_id", **payload}`` each."""
    ev = t.events.c
    query = sa.select(ev.id, ev.device_id, ev.payload)
    if device_id is not None:
        query = query.where(ev.device_id == device_id)
    if kind is not None:
        query = query.where(ev.kind == kind)
    if event_id is not None:
        query = query.where(ev.event_id == event_id)
    query = query.order_by(ev.ts.desc(), ev.id.desc()).limit(limit)
    with engine.connect() as conn:
        rows = conn.execute(query).all()
    return [{"id": row_id, "device_id": device, **(payload or {})} for row_id, device, payload in rows]


def event_data(sa: Any, engine: Any, t: Tables, device_id: str, event_id: str) -> dict | None:
    """The ``data`` of the event with this evidence event id (its frames and duration), if it has arrived."""
    ev = t.events.c
    query = (sa.select(ev.payload).where((ev.device_id == device_id) & (ev.event_id == event_id))
             .order_by(ev.id).limit(1))
    with engine.connect() as conn:
        payload = conn.execute(query).scalar()
    data = (payload or {}).get("data")
    return data if isinstance(data, dict) else None

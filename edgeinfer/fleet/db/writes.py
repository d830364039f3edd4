"""Batched, idempotent writes for ingest: telemetry once per (device, boot_id, seq), roll-ups of what
was really inserted, one upsert per device — every statement safe with several writers at once.

``INSERT ... ON CONFLICT`` is spelled per dialect (SQLite ≥ 3.35 and PostgreSQL both have it, with
RETURNING); devices are written in sorted order so two PostgreSQL writers never deadlock.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..verdicts import answer_of
from . import commands, live_view, staging
from .evidence import event_id_of
from .schema import Tables

INT32_MAX = 2**31 - 1  # telemetry.dropped is an INTEGER column


class RawJSON(str):
    """JSON text already serialised — a payload as received and validated — stored as it is instead of
    being parsed and serialised again (a third of the manager's cost per message, measured)."""

    __slots__ = ()


def to_json(value: Any) -> str:
    """The engine's JSON serialiser: :class:`RawJSON` passes through, anything else is serialised."""
    return value if type(value) is RawJSON else json.dumps(value)


def _insert(engine: Any, table: Any) -> Any:
    if engine.dialect.name == "postgresql":
        from sqlalchemy.dialects.postgresql import insert
    elif engine.dialect.name == "sqlite":
        from sqlalchemy.dialects.sqlite import insert
    else:  # pragma: no cover - other databases are not supported for ingest
        raise NotImplementedError(f"ingest supports SQLite and PostgreSQL, not {engine.dialect.name}")
    return insert(table)


def telemetry_row(device_id: str, message: dict, text: str | None = None) -> dict:
    """The telemetry columns of ``message``; ``text``: its JSON as received, stored instead of re-encoding."""
    fps, dropped, worst_p95 = 0.0, 0, None
    for pipeline in message.get("pipelines") or ():  # one loop: this runs for every message the fleet sends
        fps += float(pipeline.get("fps") or 0.0)
        dropped += int(pipeline.get("dropped") or 0)
        p95 = ((pipeline.get("stages") or {}).get("latency") or {}).get("p95")
        if p95 is not None and (worst_p95 is None or float(p95) > worst_p95):
            worst_p95 = float(p95)
    return {"device_id": device_id, "boot_id": str(message.get("boot_id")), "seq": int(message.get("seq", 0)),
            "ts": float(message.get("ts") or time.time()), "fps": fps, "latency_p95_ms": worst_p95,
            "dropped": min(INT32_MAX, dropped), "payload": message if text is None else RawJSON(text)}


def store_telemetry(sa: Any, engine: Any, t: Tables, batch: Sequence[tuple]) -> tuple[int, int]:
    """Insert ``(fleet, device, message[, text])`` items once each (``text``: the message's JSON as received);
    update roll-ups and devices. (stored, duplicates)."""
    rows: dict[tuple[str, str, int], dict] = {}
    fleets: dict[str, str] = {}
    for fleet, device_id, message, *text in batch:
        row = telemetry_row(device_id, message, *text)
        rows.setdefault((row["device_id"], row["boot_id"], row["seq"]), row)
        fleets[device_id] = fleet
    if not rows:
        return 0, len(batch)
    with engine.begin() as conn:
        # in key order: two PostgreSQL writers with overlapping batches then wait for each other, never deadlock
        inserted = _insert_new(engine, conn, t, [rows[key] for key in sorted(rows)])
        stored = [rows[key] for key in rows if key in inserted]
        _roll_up(engine, conn, t, stored)
        latest: dict[str, dict] = {}
        for row in stored or rows.values():
            if row["device_id"] not in latest or row["ts"] >= latest[row["device_id"]]["ts"]:
                latest[row["device_id"]] = row
        upsert_devices(engine, conn, t, [
            (fleets[device_id], device_id, {"last_telemetry": row["payload"], "last_telemetry_ts": row["ts"],
                                            "online": True}) for device_id, row in latest.items()])
    return len(stored), len(batch) - len(stored)


def _insert_new(engine: Any, conn: Any, t: Tables, rows: list[dict]) -> set[tuple[str, str, int]]:
    """Insert the telemetry rows not stored yet; the keys of those inserted."""
    return staging.insert_new(conn, rows, to_json)


def _roll_up(engine: Any, conn: Any, t: Tables, stored: list[dict]) -> None:
    """Add the stored rows to their (device, minute) roll-ups: sums add, the p95 keeps the worst."""
    if not stored:
        return
    sums: dict[tuple[str, int], dict] = {}
    for row in stored:
        key = (row["device_id"], int(row["ts"] // 60))
        acc = sums.setdefault(key, {"device_id": key[0], "minute": key[1], "samples": 0, "fps_sum": 0.0,
                                    "latency_p95_max_ms": None, "dropped_sum": 0})
        acc["samples"] += 1
        acc["fps_sum"] += float(row["fps"] or 0.0)
        acc["dropped_sum"] += int(row["dropped"] or 0)
        if row["latency_p95_ms"] is not None:
            acc["latency_p95_max_ms"] = max(acc["latency_p95_max_ms"] or row["latency_p95_ms"], row["latency_p95_ms"])
    import sqlalchemy as sa

    insert = _insert(engine, t.rollups)
    old, new = t.rollups.c, insert.excluded
    greatest = sa.func.greatest if engine.dialect.name == "postgresql" else sa.func.max  # SQLite: scalar max()
    worst = sa.case((old.latency_p95_max_ms.is_(None), new.latency_p95_max_ms),
                    (new.latency_p95_max_ms.is_(None), old.latency_p95_max_ms),
                    else_=greatest(old.latency_p95_max_ms, new.latency_p95_max_ms))
    statement = insert.on_conflict_do_update(
        index_elements=["device_id", "minute"],
        set_={"samples": old.samples + new.samples, "fps_sum": old.fps_sum + new.fps_sum,
              "dropped_sum": old.dropped_sum + new.dropped_sum, "latency_p95_max_ms": worst})
    # one statement for the batch; keys are unique in it and sorted, the same order for every writer
    conn.execute(statement, [sums[key] for key in sorted(sums)])


def upsert_devices(engine: Any, conn: Any, t: Tables, items: Sequence[tuple[str, str, dict[str, Any]]]) -> None:
    """Create each ``(fleet, device_id, values)`` device or update ``values`` on it: one statement per set of
    columns (no select-then-insert race), devices in sorted order (two PostgreSQL writers never deadlock)."""
    now = time.time()
    by_columns: dict[tuple[str, ...], list[dict]] = {}
    for fleet, device_id, values in sorted(items, key=lambda item: item[1]):
        row = {"device_id": device_id, "fleet": fleet, "first_seen": now, "last_seen": now, "groups": [],
               "online": False, **values}
        by_columns.setdefault(tuple(sorted(values)), []).append(row)
    for columns, rows in by_columns.items():
        conn.execute(_device_upsert(engine, t, columns), rows)


_UPSERTS: dict[tuple[int, tuple[str, ...]], Any] = {}


def _device_upsert(engine: Any, t: Tables, columns: tuple[str, ...]) -> Any:
    """The device upsert that updates ``columns`` (built once per engine and set of columns)."""
    key = (id(t.devices), engine.dialect.name, columns)
    if key in _UPSERTS:
        return _UPSERTS[key]
    import sqlalchemy as sa

    insert = _insert(engine, t.devices)
    old, new = t.devices.c, insert.excluded
    updates: dict[str, Any] = {"fleet": new.fleet, "last_seen": new.last_seen, **{c: new[c] for c in columns}}
    if "last_telemetry_ts" in columns:  # an older batch (a redelivery) must not replace newer telemetry
        newer = old.last_telemetry_ts.is_(None) | (new.last_telemetry_ts >= old.last_telemetry_ts)
        for column in ("last_telemetry", "last_telemetry_ts"):
            updates[column] = sa.case((newer, new[column]), else_=old[column])
        # a known device is online or not by its state (birth, Last Will, shutdown): an agent that stops sends its
        # last window after its offline state, and telemetry held in a spool arrives late — neither is "online"
        updates.pop("online", None)
    statement = insert.on_conflict_do_update(index_elements=["device_id"], set_=updates)
    _UPSERTS[key] = statement
    return statement


def record_states(engine: Any, t: Tables, states: Sequence[tuple[str, str, dict]]) -> None:
    """Devices' ``(fleet, device_id, state)`` messages in one transaction (:func:`state_rows`)."""
    with engine.begin() as conn:
        upsert_devices(engine, conn, t, state_rows(states))


def state_rows(states: Sequence[tuple[str, str, dict]]) -> list[tuple[str, str, dict[str, Any]]]:
    """One ``(fleet, device_id, values)`` per device for :func:`upsert_devices` from its ``(fleet, device_id, state)``
    messages in the order received: a later message's columns override an earlier one's, the others stay (a Last
    Will after a birth is offline and keeps the birth's groups) — as if each had been written in turn."""
    merged: dict[str, tuple[str, dict[str, Any]]] = {}
    for fleet, device_id, state in states:
        values = state_values(state)
        merged[device_id] = (fleet, {**merged[device_id][1], **values} if device_id in merged else values)
    return [(fleet, device_id, values) for device_id, (fleet, values) in merged.items()]


def state_values(state: dict) -> dict[str, Any]:
    """The device columns a retained state message (birth or Last Will) sets."""
    values: dict[str, Any] = {"online": bool(state.get("online")), "state": state}
    if "groups" in state:  # a Last Will carries no groups: keep what the birth said
        values["groups"] = list(state.get("groups") or [])
    pipelines = state.get("pipelines") or []
    if state.get("online") and pipelines:
        first = pipelines[0]  # the registry shows the first pipeline's model; state has them all
        model = first.get("model") or {}
        version = model.get("version")
        values.update(model_name=Path(str(model.get("path") or "")).name or None,
                      model_version=int(version) if str(version or "").isdigit() else None,
                      model_sha256=model.get("sha256"), delegate=first.get("delegate"))
    return values


def store_events(engine: Any, t: Tables, batch: Sequence[tuple[str, str, dict]]) -> int:
    """Keep device events (fallbacks, errors, update progress, triggered rules); returns how many. An event
    whose ``data.event_id`` is an evidence event id keeps it in its own column (its evidence is found by it). In
    the same transaction, a device's answer to a command gives the command its verdict (``verdicts.py``), and the
    lines and zones a device says it applied are its pipeline's applied ones: ingest acknowledges none of it
    before it is all stored, and the same event again changes nothing."""
    if not batch:
        return 0
    now = time.time()
    rows = [{"device_id": device_id, "ts": float(event.get("ts") or now),
             "kind": str(event.get("event") or event.get("kind") or "unknown")[:64], "payload": event,
             "event_id": event_id_of(event)}
            for _fleet, device_id, event in batch]
    fleets = {device_id: fleet for fleet, device_id, _event in batch}
    answers = [(device_id, found) for _fleet, device_id, event in batch if (found := answer_of(event)) is not None]
    with engine.begin() as conn:
        conn.execute(t.events.insert(), rows)
        upsert_devices(engine, conn, t, [(fleet, device_id, {}) for device_id, fleet in fleets.items()])
        if answers:
            commands.answer(conn, t, answers, now)
        live_view.record_applied(conn, t, [(device_id, event) for _fleet, device_id, event in batch], now)
    return len(rows)


def prune(sa: Any, engine: Any, t: Tables, *, raw_before: float, rollup_before: float, events_before: float,
          audit_before: float, batch: int) -> dict[str, int]:
    """Delete rows older than the given UNIX times, ``batch`` rows per transaction (short locks)."""
    deleted = {"telemetry": 0, "telemetry_rollup": 0, "events": 0, "audit_log": 0}
    plans = ((t.telemetry, t.telemetry.c.id, t.telemetry.c.ts < raw_before, "telemetry"),
             (t.events, t.events.c.id, t.events.c.ts < events_before, "events"),
             (t.audit, t.audit.c.id, t.audit.c.ts < audit_before, "audit_log"))
    for table, key, old, name in plans:
        while True:
            with engine.begin() as conn:
                ids = [r[0] for r in conn.execute(sa.select(key).where(old).limit(batch))]
                if ids:
                    conn.execute(table.delete().where(key.in_(ids)))
            deleted[name] += len(ids)
            if len(ids) < batch:
                break
    with engine.begin() as conn:
        result = conn.execute(t.rollups.delete().where(t.rollups.c.minute < int(rollup_before // 60)))
        deleted["telemetry_rollup"] = max(0, result.rowcount or 0)
    return deleted

"""Logs and diagnosis in the fleet database (``fleet/diagnosis.py``): the ``device_logs`` lines devices sent —
stored once per (device, boot, seq), the newest :data:`MAX_LINES_PER_DEVICE` kept per device, aged out by the
retention pass — and one ``diagnosis`` row per device: when its logs were asked for and by which command, until
when someone follows them, when lines last came, and its doctor's last request and result.

Rows, not a manager's memory: the device may answer to one manager behind a load balancer while the person asking
reads from another. A request is claimed with one conditional UPDATE, so two managers (or a flood of requests)
send the device one command per interval.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from .writes import _insert

#: the newest lines kept per device (the oldest go as new ones come)
MAX_LINES_PER_DEVICE = 20_000
#: rows deleted per statement by the retention pass
PRUNE_BATCH = 5_000


class DiagnosisRows:
    """The ``device_logs`` and ``diagnosis`` tables of a fleet database (``FleetDB.diagnosis``)."""

    def __init__(self, sa: Any, engine: Any, tables: Any, *, max_lines: int = MAX_LINES_PER_DEVICE) -> None:
        self.sa, self.engine = sa, engine
        self.logs, self.table = tables.device_logs, tables.diagnosis
        self.max_lines = max_lines

    # -- the per-device row -------------------------------------------------------------------------
    def state(self, device_id: str) -> dict | None:
        with self.engine.connect() as conn:
            row = conn.execute(self.sa.select(self.table).where(self.table.c.device_id == device_id)).mappings().first()
        return dict(row) if row else None

    def _ensure(self, conn: Any, device_id: str) -> None:
        conn.execute(_insert(self.engine, self.table).values(device_id=device_id)
                     .on_conflict_do_nothing(index_elements=["device_id"]))

    def _update(self, device_id: str, **values: Any) -> None:
        with self.engine.begin() as conn:
            self._ensure(conn, device_id)
            conn.execute(self.table.update().where(self.table.c.device_id == device_id).values(**values))

    def claim(self, device_id: str, what: str, now: float, min_gap_s: float) -> bool:
        """Take the right to send ``device_id`` a ``what`` request (``logs`` or ``doctor``) now: True when none
        was sent in the last ``min_gap_s`` seconds (by any manager), and the request time is recorded."""
        column = self.table.c[f"{what}_requested_at"]
        with self.engine.begin() as conn:
            self._ensure(conn, device_id)
            claimed = conn.execute(self.table.update().where(
                (self.table.c.device_id == device_id) & (column.is_(None) | (column <= now - min_gap_s)))
                .values({column: now})).rowcount
        return bool(claimed)

    def sent(self, device_id: str, what: str, command_id: str, *, follow_until: float | None = None) -> None:
        """The command a claimed request went out as (and, following, the ``until`` it carried)."""
        values: dict[str, Any] = {f"{what}_command_id": command_id}
        if follow_until is not None:
            values["follow_until"] = follow_until
        self._update(device_id, **values)

    def put_doctor(self, device_id: str, result_text: str, now: float) -> None:
        self._update(device_id, doctor_received_at=now, doctor_result=result_text)

    # -- lines --------------------------------------------------------------------------------------
    def newest_seq(self, device_id: str, boot_id: str) -> int:
        """The newest line stored of that boot of the device (0: none)."""
        c = self.logs.c
        with self.engine.connect() as conn:
            found = conn.execute(self.sa.select(self.sa.func.max(c.seq))
                                 .where((c.device_id == device_id) & (c.boot_id == boot_id))).scalar()
        return int(found or 0)

    def add(self, device_id: str, boot_id: str, lines: Sequence[dict], *, dropped: int, complete: bool,
            now: float | None = None) -> int:
        """Store an upload's lines (a line already stored is left as it is); how many were new. The device's row
        records when its lines came; the device's oldest lines beyond the bound are deleted."""
        now = time.time() if now is None else now
        rows = [{"device_id": device_id, "boot_id": boot_id, "received_at": now, **line} for line in lines]
        with self.engine.begin() as conn:
            stored = 0
            if rows:
                # RETURNING counts what was new on either database (a driver's rowcount of many rows may not)
                statement = _insert(self.engine, self.logs).on_conflict_do_nothing(
                    index_elements=["device_id", "boot_id", "seq"]).returning(self.logs.c.id)
                stored = len(conn.execute(statement, rows).all())
            self._ensure(conn, device_id)
            conn.execute(self.table.update().where(self.table.c.device_id == device_id).values(
                logs_received_at=now, logs_complete=complete, logs_dropped=dropped))
            if stored:
                self._trim(conn, device_id)
        return stored

    def _trim(self, conn: Any, device_id: str) -> None:
        c = self.logs.c
        edge = conn.execute(self.sa.select(c.id).where(c.device_id == device_id).order_by(c.id.desc())
                            .offset(self.max_lines).limit(1)).scalar()
        if edge is not None:
            conn.execute(self.logs.delete().where((c.device_id == device_id) & (c.id <= edge)))

    def lines(self, device_id: str, *, since: float | None = None, after: int | None = None, min_level: int = 0,
              limit: int = 1000) -> list[dict]:
        """Lines of the device, oldest first: those after id ``after`` (the first ``limit``), or the newest
        ``limit``; at ``min_level`` or above, written at ``since`` or later."""
        c = self.logs.c
        query = self.sa.select(c.id, c.boot_id, c.seq, c.ts, c.level, c.logger, c.message, c.received_at).where(
            c.device_id == device_id)
        if since is not None:
            query = query.where(c.ts >= since)
        if min_level:
            query = query.where(c.level >= min_level)
        if after is not None:
            query = query.where(c.id > after).order_by(c.id).limit(limit)
        else:
            query = query.order_by(c.id.desc()).limit(limit)
        with self.engine.connect() as conn:
            rows = [dict(row) for row in conn.execute(query).mappings()]
        return rows if after is not None else rows[::-1]

    def count(self, device_id: str) -> int:
        with self.engine.connect() as conn:
            return int(conn.execute(self.sa.select(self.sa.func.count()).select_from(self.logs)
                                    .where(self.logs.c.device_id == device_id)).scalar() or 0)

    def prune(self, before: float) -> int:
        """Delete the lines written before ``before`` (unix time), in batches; how many."""
        c, deleted = self.logs.c, 0
        while True:
            with self.engine.begin() as conn:
                ids = [row[0] for row in conn.execute(self.sa.select(c.id).where(c.ts < before).limit(PRUNE_BATCH))]
                if ids:
                    conn.execute(self.logs.delete().where(c.id.in_(ids)))
            deleted += len(ids)
            if len(ids) < PRUNE_BATCH:
                return deleted

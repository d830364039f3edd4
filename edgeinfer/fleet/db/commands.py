"""Commands in the fleet database (``fleet/verdicts.py``): one ``commands`` row per command the manager sent, moved
forward by the device's answers as ingest stores them (in the events' own transaction), and ``command_samples``:
what the manager did with each sample a capture command produced, once per sample.

Every write is one conditional statement, safe with several managers at once: a command re-sent under its id
(a rollout taken over) keeps its row; an answer moves only a command still ``sent``; a sample counts once.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from typing import Any

from ..verdicts import Answer, CommandState
from .schema import Tables

#: what the manager did with a sample a command produced
STORED, DUPLICATE = "stored", "duplicate"
#: the most commands one listing answers
MAX_LIST = 1000


def _insert(engine: Any, table: Any) -> Any:
    if engine.dialect.name == "postgresql":
        from sqlalchemy.dialects.postgresql import insert
    else:
        from sqlalchemy.dialects.sqlite import insert
    return insert(table)


def answer(conn: Any, t: Tables, answers: Sequence[tuple[str, Answer]], now: float) -> int:
    """Record devices' answers (``(device, answer)`` each) on their commands, in the caller's transaction: a command
    of that device still ``sent`` takes the answer, any other is left as it is (its verdict came first, or it is
    another device's). How many commands changed."""
    c, changed = t.commands.c, 0
    for device_id, found in sorted(answers, key=lambda item: item[1].command_id):  # one order for every writer
        statement = t.commands.update().where(
            (c.command_id == found.command_id) & (c.device_id == device_id) & (c.state == CommandState.SENT.value)
        ).values(state=found.state.value, reason=found.reason, message=found.message, result=found.result,
                 answered_at=now, updated_at=now)
        changed += conn.execute(statement).rowcount
    return changed


class CommandRows:
    """The ``commands`` and ``command_samples`` tables of a fleet database (``FleetDB.commands``)."""

    def __init__(self, sa: Any, engine: Any, tables: Tables) -> None:
        self.sa, self.engine, self.t = sa, engine, tables

    def record(self, row: dict) -> bool:
        """A command sent (state ``sent``); False when its id is recorded already (the same command sent again)."""
        now = time.time()
        values = {"state": CommandState.SENT.value, "sent_at": now, "updated_at": now, **row}
        statement = _insert(self.engine, self.t.commands).values(**values).on_conflict_do_nothing(
            index_elements=["command_id"]).returning(self.t.commands.c.command_id)
        with self.engine.begin() as conn:  # RETURNING: psycopg's rowcount of an upsert is not to be relied on
            return conn.execute(statement).first() is not None

    def count_sample(self, device_id: str, sample_id: str, command_id: str, outcome: str) -> bool:
        """What the manager did with a sample of a command: counted once per sample (a retry is not counted again);
        the command's ``updated_at`` moves so that the live updates carry its new counts."""
        now = time.time()
        table = self.t.command_samples
        statement = _insert(self.engine, table).values(
            device_id=device_id, sample_id=sample_id, command_id=command_id, outcome=outcome, received_at=now
        ).on_conflict_do_nothing(index_elements=["device_id", "sample_id"]).returning(table.c.sample_id)
        c = self.t.commands.c
        with self.engine.begin() as conn:
            counted = conn.execute(statement).first() is not None
            if counted:
                conn.execute(self.t.commands.update().where((c.command_id == command_id) & (c.device_id == device_id))
                             .values(updated_at=now))
        return counted

    # --------------------------------------------------------------------------------------- reads
    def _select(self, *where: Any) -> Any:
        """Commands with their samples' counts (``samples_stored``, ``samples_duplicates``)."""
        sa, c, s = self.sa, self.t.commands.c, self.t.command_samples.c
        counted = (sa.select(s.command_id, s.device_id,
                             sa.func.sum(sa.case((s.outcome == STORED, 1), else_=0)).label("stored"),
                             sa.func.sum(sa.case((s.outcome == DUPLICATE, 1), else_=0)).label("duplicates"))
                   .group_by(s.command_id, s.device_id).subquery())
        joined = self.t.commands.outerjoin(counted, (counted.c.command_id == c.command_id)
                                           & (counted.c.device_id == c.device_id))
        return (sa.select(self.t.commands, counted.c.stored.label("samples_stored"),
                          counted.c.duplicates.label("samples_duplicates")).select_from(joined).where(*where))

    def _rows(self, query: Any) -> list[dict]:
        with self.engine.connect() as conn:
            return [dict(row) for row in conn.execute(query).mappings()]

    def get(self, command_id: str) -> dict | None:
        rows = self._rows(self._select(self.t.commands.c.command_id == command_id))
        return rows[0] if rows else None

    def of_device(self, device_id: str, *, cmd: str | None = None, pipeline: str | None = None,
                  states: Iterable[str] | None = None, limit: int = 100) -> list[dict]:
        """A device's commands, newest first: of one word, one pipeline, in some stored states."""
        c = self.t.commands.c
        where = [c.device_id == device_id]
        if cmd is not None:
            where.append(c.cmd == cmd)
        if pipeline is not None:
            where.append(c.pipeline == pipeline)
        if states is not None:
            where.append(c.state.in_(list(states)))
        query = self._select(*where).order_by(c.sent_at.desc(), c.command_id).limit(min(limit, MAX_LIST))
        return self._rows(query)

    def changed(self, since: float, until: float, limit: int = MAX_LIST) -> list[dict]:
        """Commands updated since ``since`` (an answer, a sample counted), and those whose expiry passed between
        ``since`` and ``until`` unanswered: what the live updates look at each turn."""
        c = self.t.commands.c
        expired = (c.state == CommandState.SENT.value) & (c.expires_at >= since) & (c.expires_at < until)
        query = self._select((c.updated_at >= since) | expired).order_by(c.updated_at.desc()).limit(limit)
        return self._rows(query)

    def prune(self, before: float, batch: int = 10_000) -> int:
        """Delete the commands sent before ``before`` and their samples' records; how many commands went."""
        sa, c, s = self.sa, self.t.commands.c, self.t.command_samples.c
        deleted = 0
        while True:
            with self.engine.begin() as conn:
                ids = [row[0] for row in conn.execute(sa.select(c.command_id).where(c.sent_at < before).limit(batch))]
                if ids:
                    conn.execute(self.t.commands.delete().where(c.command_id.in_(ids)))
                    conn.execute(self.t.command_samples.delete().where(s.command_id.in_(ids)))
            deleted += len(ids)
            if len(ids) < batch:
                break
        with self.engine.begin() as conn:  # a sample's record whose command is not (or no longer) known
            conn.execute(self.t.command_samples.delete().where(s.received_at < before))
        return deleted

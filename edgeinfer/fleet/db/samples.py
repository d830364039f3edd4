"""Samples in the fleet database: one ``samples`` row each, its JPEG in the row (a sample is one
frame, a few hundred KiB: no chunking as for clips), listed by filters without the JPEG, changed by a reviewer
or an import, bounded by total bytes and by age (``fleet/samples.py``).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

#: the columns a listing answers (everything but the JPEG and the label filter's helper column)
LISTED = ("device_id", "sample_id", "pipeline", "stream", "rule", "model_name", "model_sha256", "model_version",
          "width", "height", "captured_at", "created_at", "size", "sha256", "phash", "detections", "labels",
          "reviewed", "reviewed_at")
#: rows deleted per statement by the bounds
PRUNE_BATCH = 200
#: the distinct label sets read for the facets' labels (each row's set is one string)
LABEL_SETS = 10_000


@dataclass(frozen=True)
class Filters:
    """What a listing or an export selects; None is no filter."""

    device_id: str | None = None
    pipeline: str | None = None
    stream: str | None = None
    model_version: str | None = None
    rule: str | None = None
    label: str | None = None
    reviewed: bool | None = None
    #: True: only samples with a ground truth (corrected labels, or reviewed: the detections accepted)
    labelled: bool | None = None


def label_names(detections: Sequence[dict]) -> str:
    """`` person car ``: each label once between spaces, so ``LIKE '% person %'`` finds a whole label."""
    names = sorted({str(d["label"]).replace(" ", "_") for d in detections})
    return f" {' '.join(names)} " if names else " "


class SampleRows:
    """The ``samples`` table of a fleet database (``FleetDB.samples``)."""

    def __init__(self, sa: Any, engine: Any, tables: Any) -> None:
        self.sa, self.engine, self.table = sa, engine, tables.samples

    def _key(self, device_id: str, sample_id: str) -> Any:
        c = self.table.c
        return (c.device_id == device_id) & (c.sample_id == sample_id)

    def get(self, device_id: str, sample_id: str) -> dict | None:
        """A sample's row without its JPEG, or None."""
        query = self.sa.select(*(self.table.c[n] for n in LISTED)).where(self._key(device_id, sample_id))
        with self.engine.connect() as conn:
            row = conn.execute(query).mappings().first()
        return dict(row) if row else None

    def jpeg(self, device_id: str, sample_id: str) -> bytes | None:
        with self.engine.connect() as conn:
            data = conn.execute(self.sa.select(self.table.c.jpeg).where(self._key(device_id, sample_id))).scalar()
        return bytes(data) if data is not None else None

    def recent_hashes(self, device_id: str, pipeline: str, stream: str, limit: int) -> list[tuple[str, str]]:
        """(sample_id, phash) of the scene's newest ``limit`` samples: what a new frame is compared with."""
        c = self.table.c
        query = (self.sa.select(c.sample_id, c.phash)
                 .where((c.device_id == device_id) & (c.pipeline == pipeline) & (c.stream == stream))
                 .order_by(c.created_at.desc()).limit(limit))
        with self.engine.connect() as conn:
            return [(sample_id, phash) for sample_id, phash in conn.execute(query)]

    def insert(self, row: dict) -> dict | None:
        """Store a new sample; None when its id is stored already (another upload committed first)."""
        row = {**row, "created_at": time.time(), "label_names": label_names(row["detections"]), "reviewed": False}
        try:
            with self.engine.begin() as conn:
                conn.execute(self.table.insert().values(**row))
        except self.sa.exc.IntegrityError:
            return None
        return row

    def select(self, filters: Filters, *, limit: int, offset: int = 0, jpeg: bool = False) -> list[dict]:
        """Samples newest first (by capture time), without their JPEG unless ``jpeg``."""
        c = self.table.c
        columns = [c[n] for n in LISTED] + ([c.jpeg] if jpeg else [])
        query = self.sa.select(*columns).where(*self._where(filters))
        query = query.order_by(c.captured_at.desc(), c.sample_id).limit(limit).offset(offset)
        with self.engine.connect() as conn:
            return [dict(row) for row in conn.execute(query).mappings()]

    def count(self, filters: Filters) -> int:
        """How many samples the filters select."""
        query = self.sa.select(self.sa.func.count()).select_from(self.table).where(*self._where(filters))
        with self.engine.connect() as conn:
            return int(conn.execute(query).scalar() or 0)

    def facets(self, limit: int) -> dict[str, list[str]]:
        """The values each filter may take, over all samples (at most ``limit`` each, sorted; an empty one is
        no value): what a filter form offers."""
        c, out = self.table.c, {}
        columns = {"devices": c.device_id, "pipelines": c.pipeline, "model_versions": c.model_version, "rules": c.rule}
        with self.engine.connect() as conn:
            for key, column in columns.items():
                query = self.sa.select(column).where(column != "").distinct().order_by(column).limit(limit)
                out[key] = list(conn.execute(query).scalars())
            sets = conn.execute(self.sa.select(c.label_names).distinct().limit(LABEL_SETS)).scalars()
            out["labels"] = sorted({name for names in sets for name in (names or "").split()})[:limit]
        return out

    def _where(self, f: Filters) -> list[Any]:
        c = self.table.c
        equal = {"device_id": f.device_id, "pipeline": f.pipeline, "stream": f.stream,
                 "model_version": f.model_version, "rule": f.rule, "reviewed": f.reviewed}
        where = [c[name] == value for name, value in equal.items() if value is not None]
        if f.label is not None:  # the label as a whole word of label_names; LIKE's own characters escaped
            word = f.label.replace(" ", "_").replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
            where.append(c.label_names.like(f"% {word} %", escape="\\"))
        if f.labelled is not None:
            where.append(self._labelled() if f.labelled else self.sa.not_(self._labelled()))
        return where

    def _labelled(self) -> Any:
        """Has a ground truth: reviewed, or corrected labels set. A JSON column keeps Python's None as JSON
        ``null`` (not SQL NULL), so "no labels" is its text ``null`` on PostgreSQL and SQLite alike."""
        c, sa = self.table.c, self.sa
        return c.reviewed | (sa.func.coalesce(sa.cast(c.labels, sa.Text), "null") != "null")

    def update(self, device_id: str, sample_id: str, *, reviewed: bool | None,
               labels: list[dict] | None) -> bool:
        """Change a sample's reviewed mark and/or its corrected labels; False when there is no such sample."""
        values: dict[str, Any] = {}
        if reviewed is not None:
            values.update(reviewed=reviewed, reviewed_at=time.time() if reviewed else None)
        if labels is not None:
            values.update(labels=labels, label_names=label_names(labels))
        with self.engine.begin() as conn:
            query = self.table.update().where(self._key(device_id, sample_id))
            return conn.execute(query.values(**values) if values else query.values(device_id=device_id)).rowcount > 0

    def set_labels(self, changes: Sequence[tuple[str, str, list[dict]]]) -> int:
        """Corrected labels for many samples in one transaction (an import: all or nothing), each marked
        reviewed; how many samples changed."""
        now, changed = time.time(), 0
        with self.engine.begin() as conn:
            for device_id, sample_id, labels in changes:
                query = self.table.update().where(self._key(device_id, sample_id)).values(
                    labels=labels, label_names=label_names(labels), reviewed=True, reviewed_at=now)
                changed += conn.execute(query).rowcount
        return changed

    def delete(self, device_id: str, sample_id: str) -> bool:
        with self.engine.begin() as conn:
            return conn.execute(self.table.delete().where(self._key(device_id, sample_id))).rowcount > 0

    def total_bytes(self) -> int:
        with self.engine.connect() as conn:
            return int(conn.execute(self.sa.select(self.sa.func.coalesce(self.sa.func.sum(self.table.c.size), 0)))
                       .scalar() or 0)

    def prune(self, max_bytes: int, *, older_than: float | None = None,
              keep: tuple[str, str] | None = None) -> int:
        """Delete samples past their age (``older_than``: created before), then, while the total is over
        ``max_bytes``, the oldest unreviewed ones first — a reviewed sample is a person's work, kept while
        anything else can go. ``keep``: never deleted here (the one just stored). How many were deleted."""
        c, deleted = self.table.c, 0
        if older_than is not None:
            with self.engine.begin() as conn:
                deleted += conn.execute(self.table.delete().where(c.created_at < older_than)).rowcount
        while (excess := self.total_bytes() - max_bytes) > 0:
            query = (self.sa.select(c.device_id, c.sample_id, c.size).order_by(c.reviewed, c.created_at)
                     .limit(PRUNE_BATCH))
            victims, freed = [], 0
            with self.engine.connect() as conn:
                for device_id, sample_id, size in conn.execute(query):
                    if (device_id, sample_id) != keep and freed < excess:
                        victims.append((device_id, sample_id))
                        freed += int(size)
            if not victims:
                break
            with self.engine.begin() as conn:
                conn.execute(self.table.delete().where(self.sa.tuple_(c.device_id, c.sample_id).in_(victims)))
            deleted += len(victims)
        return deleted

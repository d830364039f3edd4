"""The fleet's configuration layers in the database: one row per revision of a layer (``config_revisions``; the
primary key — scope, name, revision — is what makes a save against a stale revision fail, on any number of
managers), and the document each device of a configuration deployment was given (``config_targets``)."""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any

from ...link.vocabulary import DeploymentKind
from ..rollout import DeploymentStatus

#: a layer's row as listed: everything but its document
LISTED = ("scope", "name", "revision", "sha256", "message", "author", "role", "created_at", "restored_from",
          "applied_at", "applied_by")


class ConfigRows:
    """``config_revisions`` and ``config_targets`` of a fleet database (``FleetDB.configs``)."""

    def __init__(self, sa: Any, engine: Any, tables: Any) -> None:
        self.sa, self.engine, self.t = sa, engine, tables
        self.revisions, self.targets = tables.config_revisions, tables.config_targets

    # ----------------------------------------------------------------------------------------- revisions
    def _layer(self, scope: str, name: str) -> Any:
        c = self.revisions.c
        return (c.scope == scope) & (c.name == name)

    def current(self, scope: str, name: str) -> dict | None:
        """The layer's newest revision (with its document), or None for a layer never saved."""
        query = (self.sa.select(self.revisions).where(self._layer(scope, name))
                 .order_by(self.revisions.c.revision.desc()).limit(1))
        with self.engine.connect() as conn:
            row = conn.execute(query).mappings().first()
        return dict(row) if row else None

    def revision(self, scope: str, name: str, revision: int) -> dict | None:
        query = self.sa.select(self.revisions).where(self._layer(scope, name) & (self.revisions.c.revision == revision))
        with self.engine.connect() as conn:
            row = conn.execute(query).mappings().first()
        return dict(row) if row else None

    def history(self, scope: str, name: str, limit: int) -> list[dict]:
        """The layer's newest ``limit`` revisions and the one before them (for the oldest one's diff), newest first."""
        query = (self.sa.select(self.revisions).where(self._layer(scope, name))
                 .order_by(self.revisions.c.revision.desc()).limit(limit + 1))
        with self.engine.connect() as conn:
            return [dict(r) for r in conn.execute(query).mappings()]

    def save(self, scope: str, name: str, *, base: int, document: dict, sha256: str, message: str, author: str,
             role: str | None, applied: bool, restored_from: int | None = None, now: float | None = None) -> int | None:
        """Store revision ``base + 1`` of the layer if ``base`` is its newest now (``applied``: released to the
        devices at once); the new revision, or None when another save came first (the caller's ``base`` is stale:
        409)."""
        c = self.revisions.c
        now = time.time() if now is None else now
        row = {"scope": scope, "name": name, "revision": base + 1, "document": document, "sha256": sha256,
               "message": message, "author": author, "role": role, "created_at": now, "restored_from": restored_from,
               "applied_at": now if applied else None, "applied_by": author if applied else None}
        try:
            with self.engine.begin() as conn:
                newest = conn.execute(self.sa.select(self.sa.func.max(c.revision))
                                      .where(self._layer(scope, name))).scalar()
                if int(newest or 0) != base:
                    return None
                conn.execute(self.revisions.insert().values(**row))  # two saves of one base: one key wins
        except self.sa.exc.IntegrityError:
            return None
        return base + 1

    def mark_applied(self, scope: str, name: str, revision: int, by: str, *, now: float | None = None) -> bool:
        """Release a saved revision to the devices (once); False when it was released already."""
        c = self.revisions.c
        with self.engine.begin() as conn:
            done = conn.execute(self.revisions.update()
                                .where(self._layer(scope, name) & (c.revision == revision) & c.applied_at.is_(None))
                                .values(applied_at=time.time() if now is None else now, applied_by=by))
        return done.rowcount == 1

    def layers(self, *, applied: bool = False) -> list[dict]:
        """Every layer's newest revision (``applied``: its newest released to the devices), with its document,
        ordered by scope and name."""
        c = self.revisions.c
        newest = self.sa.select(c.scope, c.name, self.sa.func.max(c.revision).label("newest"))
        if applied:
            newest = newest.where(c.applied_at.is_not(None))
        newest = newest.group_by(c.scope, c.name).subquery()
        same = (c.scope == newest.c.scope) & (c.name == newest.c.name) & (c.revision == newest.c.newest)
        query = self.sa.select(self.revisions).join(newest, same).order_by(c.scope, c.name)
        with self.engine.connect() as conn:
            return [dict(r) for r in conn.execute(query).mappings()]

    # ------------------------------------------------------------------------------------------- targets
    def add_targets(self, rows: Iterable[dict]) -> None:
        """The documents the devices of a deployment are given (before the deployment exists: its driver sends
        them)."""
        rows = list(rows)
        if rows:
            with self.engine.begin() as conn:
                conn.execute(self.targets.insert(), rows)

    def target(self, deployment_id: str, device_id: str) -> dict | None:
        c = self.targets.c
        query = self.sa.select(self.targets).where((c.deployment_id == deployment_id) & (c.device_id == device_id))
        with self.engine.connect() as conn:
            row = conn.execute(query).mappings().first()
        return dict(row) if row else None

    def holds(self, sha256: str, device_id: str | None = None) -> bool:
        """Whether ``sha256`` is a configuration document (given to ``device_id``, when named)."""
        c = self.targets.c
        where = c.sha256 == sha256
        if device_id is not None:
            where &= c.device_id == device_id
        with self.engine.connect() as conn:
            return conn.execute(self.sa.select(c.sha256).where(where).limit(1)).first() is not None

    def given(self, device_ids: Iterable[str] | None = None) -> list[dict]:
        """Every configuration deployment's target (of ``device_ids``, when given), newest deployment first: the
        device, the document's sha256 and layers, the target's state and detail, the deployment's status, version,
        time and id."""
        ct, dd, dep = self.targets.c, self.t.targets.c, self.t.deployments.c
        query = (self.sa.select(ct.device_id, ct.sha256, ct.layers, ct.deployment_id, dd.state, dd.detail,
                                dd.updated_at, dep.status, dep.version, dep.created_at)
                 .join(self.t.targets, (dd.deployment_id == ct.deployment_id) & (dd.device_id == ct.device_id))
                 .join(self.t.deployments, dep.deployment_id == ct.deployment_id)
                 .order_by(dep.created_at.desc(), dep.deployment_id))
        rows: list[dict] = []
        with self.engine.connect() as conn:
            if device_ids is None:
                return [dict(r) for r in conn.execute(query).mappings()]
            wanted = list(device_ids)
            for start in range(0, len(wanted), 500):  # bounded IN lists
                rows += [dict(r) for r in conn.execute(query.where(ct.device_id.in_(wanted[start:start + 500])))
                         .mappings()]
        return sorted(rows, key=lambda r: (-float(r["created_at"]), r["deployment_id"]))

    def halted(self) -> set[str]:
        """The layer revisions (``group:lobby r5``: a configuration deployment's ``options.config``) whose newest
        rollout was aborted: devices it did not reach are not caught up with them."""
        c = self.t.deployments.c
        query = (self.sa.select(c.options, c.status).where(c.kind == DeploymentKind.CONFIG.value)
                 .order_by(c.created_at))
        newest: dict[str, str] = {}
        with self.engine.connect() as conn:
            for options, status in conn.execute(query):
                reason = (options or {}).get("config")
                if isinstance(reason, str):
                    newest[reason] = status
        return {reason for reason, status in newest.items() if status == DeploymentStatus.ABORTED}

    def newest_version(self) -> int:
        """The highest version a configuration deployment carried (0: none yet)."""
        c = self.t.deployments.c
        query = self.sa.select(self.sa.func.max(c.version)).where(c.kind == DeploymentKind.CONFIG.value)
        with self.engine.connect() as conn:
            return int(conn.execute(query).scalar() or 0)

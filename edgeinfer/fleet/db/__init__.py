"""The fleet database: devices, telemetry and its per-minute roll-ups, events, deployments.

SQLAlchemy Core over SQLite (WAL, the default) or PostgreSQL (``postgresql+psycopg://...``, for
several managers), the schema kept by Alembic migrations (:mod:`.migrate`, run on open).
Telemetry is stored once per (device, boot_id, seq), so QoS 1 redeliveries count once; raw rows
are kept ``raw`` days and roll-ups longer (:meth:`FleetDB.prune`).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from ...errors import ConfigError
from ...link.vocabulary import TargetState
from ...util.optional import import_optional
from ..rollout import DeploymentStatus
from . import evidence, live_view, rollouts, security, writes
from .claims import ClaimRows
from .commands import CommandRows
from .configs import ConfigRows
from .diagnosis import DiagnosisRows
from .samples import SampleRows
from .schema import tables

DEFAULT_DB_URL = "sqlite:///fleet.db"
DAY_S = 86_400.0
DEFAULT_RAW_RETENTION_S = 7 * DAY_S
DEFAULT_ROLLUP_RETENTION_S = 90 * DAY_S
#: who did what through the API: kept a year by default (`fleet serve --audit-days`)
DEFAULT_AUDIT_RETENTION_S = 365 * DAY_S


def create_engine(url: str) -> Any:
    """An engine for ``url``; ConfigError that names the URL when it is not one we can open."""
    sa = import_optional("sqlalchemy", "fleet", "the fleet database")
    try:
        if url.startswith("sqlite"):
            engine = sa.create_engine(url, connect_args={"check_same_thread": False, "timeout": 30},
                                      json_serializer=writes.to_json)
            sa.event.listen(engine, "connect", _sqlite_pragmas)
        else:
            engine = sa.create_engine(url, pool_pre_ping=True, pool_size=5, max_overflow=5,
                                      json_serializer=writes.to_json)
        with engine.connect():
            pass
    except (sa.exc.ArgumentError, sa.exc.OperationalError, sa.exc.NoSuchModuleError, ModuleNotFoundError) as exc:
        raise ConfigError(f"cannot open fleet database {url!r}: {str(exc).splitlines()[0]}") from None
    return engine


class FleetDB:
    """Thread-safe access to the fleet database at ``url``, migrated to the newest schema on open."""

    def __init__(self, url: str = DEFAULT_DB_URL, *, migrate: bool = True) -> None:
        self._sa = import_optional("sqlalchemy", "fleet", "the fleet database")
        if migrate:
            import_optional("alembic", "fleet", "the fleet database's schema migrations")
        self.url = url
        self.engine = create_engine(url)
        if migrate:
            from .migrate import upgrade

            try:
                upgrade(self.engine)
            except ConfigError:
                self.engine.dispose()
                raise
        self.t = tables(self._sa)
        #: samples for datasets (samples.py)
        self.samples = SampleRows(self._sa, self.engine, self.t)
        #: the commands sent to devices and their verdicts (verdicts.py)
        self.commands = CommandRows(self._sa, self.engine, self.t)
        #: devices' log lines and doctor reports, sent on request (diagnosis.py)
        self.diagnosis = DiagnosisRows(self._sa, self.engine, self.t)
        #: the fleet's configuration layers and the documents devices were given (configs.py)
        self.configs = ConfigRows(self._sa, self.engine, self.t)
        #: claims and devices' provisioning requests (claims.py)
        self.claims = ClaimRows(self._sa, self.engine, self.t)
        #: the client certificates the fleet's CA issued to devices, and their revocation (device_certs.py)
        self.certificates = security.CertificateRows(self._sa, self.engine, self.t)

    def close(self) -> None:
        self.engine.dispose()

    # -------------------------------------------------------------------------------- ingest
    def store_telemetry(self, batch: Sequence[tuple]) -> tuple[int, int]:
        """``(fleet, device, telemetry[, its JSON text as received])`` in one transaction; (stored, duplicates)."""
        return writes.store_telemetry(self._sa, self.engine, self.t, batch)

    def store_events(self, batch: Sequence[tuple[str, str, dict]]) -> int:
        return writes.store_events(self.engine, self.t, batch)

    def record_telemetry(self, fleet: str, device_id: str, message: dict) -> bool:
        """Store one telemetry message once; False when (boot_id, seq) was already seen."""
        return self.store_telemetry([(fleet, device_id, message)])[0] == 1

    def record_event(self, fleet: str, device_id: str, event: dict) -> None:
        self.store_events([(fleet, device_id, event)])

    def record_state(self, fleet: str, device_id: str, state: dict) -> None:
        """A device's retained state message (birth or Last Will)."""
        self.record_states([(fleet, device_id, state)])

    def record_states(self, states: Sequence[tuple[str, str, dict]]) -> None:
        """Devices' state messages ``(fleet, device_id, state)``, in the order received, in one transaction."""
        writes.record_states(self.engine, self.t, states)

    def prune(self, *, raw_max_age_s: float = DEFAULT_RAW_RETENTION_S,
              rollup_max_age_s: float = DEFAULT_ROLLUP_RETENTION_S, events_max_age_s: float | None = None,
              audit_max_age_s: float = DEFAULT_AUDIT_RETENTION_S, now: float | None = None,
              batch: int = 10_000) -> dict[str, int]:
        """Delete raw telemetry, roll-ups, events (and the commands they answer) and audit entries past their age;
        rows deleted per table."""
        now = time.time() if now is None else now
        events_max_age_s = rollup_max_age_s if events_max_age_s is None else events_max_age_s
        deleted = writes.prune(self._sa, self.engine, self.t, raw_before=now - raw_max_age_s,
                               rollup_before=now - rollup_max_age_s, events_before=now - events_max_age_s,
                               audit_before=now - audit_max_age_s, batch=batch)
        deleted["commands"] = self.commands.prune(now - events_max_age_s, batch)
        return deleted

    # ------------------------------------------------------------------------------ evidence
    def evidence_file(self, device_id: str, event_id: str, file: str) -> dict | None:
        """A stored evidence file's row (size, sha256, chunks, frames, created_at), or None."""
        return evidence.get(self._sa, self.engine, self.t, device_id, event_id, file)

    def put_evidence(self, row: dict, chunks: Any) -> tuple[str, dict]:
        """Store an evidence file and its chunks in one transaction: ("created" | "same" | "conflict", row)."""
        return evidence.put(self._sa, self.engine, self.t, row, chunks)

    def evidence_chunk(self, device_id: str, event_id: str, file: str, seq: int) -> bytes | None:
        return evidence.chunk(self._sa, self.engine, self.t, device_id, event_id, file, seq)

    def evidence_of(self, keys: Sequence[tuple[str, str]]) -> dict[tuple[str, str], dict]:
        """{(device_id, event_id): {file: row}} for those of ``keys`` with evidence stored."""
        return evidence.of_events(self._sa, self.engine, self.t, keys)

    def evidence_bytes(self) -> int:
        return evidence.total_bytes(self._sa, self.engine, self.t)

    def prune_evidence(self, max_bytes: int, *, keep: tuple[str, str] | None = None) -> list[tuple[str, str]]:
        """Delete the first-stored events' evidence until at most ``max_bytes`` are kept; what was deleted."""
        return evidence.prune(self._sa, self.engine, self.t, max_bytes, keep=keep)

    def list_events(self, *, device_id: str | None = None, kind: str | None = None, event_id: str | None = None,
                    limit: int = 100) -> list[dict]:
        """Events newest first, ``{"id", "device_id", **payload}`` each, filtered by device, kind, evidence id."""
        return evidence.list_events(self._sa, self.engine, self.t, device_id=device_id, kind=kind,
                                    event_id=event_id, limit=limit)

    def event_data(self, device_id: str, event_id: str) -> dict | None:
        """The ``data`` of the device's event with this evidence id, if it has arrived."""
        return evidence.event_data(self._sa, self.engine, self.t, device_id, event_id)

    # ------------------------------------------------------------------------------- the live view
    def watch_live(self, key: live_view.Key, until: float) -> None:
        live_view.watch(self._sa, self.engine, self.t, key, until)

    def put_live_frame(self, key: live_view.Key, frame: dict) -> int | None:
        """The frame's seq, or None when nobody watches ``key`` (it is dropped)."""
        return live_view.put_frame(self._sa, self.engine, self.t, key, frame)

    def newer_live_frames(self, seen: dict[live_view.Key, int]) -> list[dict]:
        return live_view.newer(self._sa, self.engine, self.t, seen)

    def live_frame(self, key: live_view.Key) -> dict | None:
        return live_view.frame(self._sa, self.engine, self.t, key)

    def live_frame_size(self, device_id: str, pipeline: str, stream: str | None) -> tuple[int, int] | None:
        return live_view.frame_size(self._sa, self.engine, self.t, device_id, pipeline, stream)

    def forget_live_frames(self, before: float) -> int:
        return live_view.forget(self._sa, self.engine, self.t, before)

    def save_analytics(self, key: live_view.Key, lines: dict, zones: dict, command_id: str | None = None) -> int:
        """Store a pipeline's lines and zones (sent by ``command_id``); their new revision."""
        return live_view.save_analytics(self._sa, self.engine, self.t, key, lines, zones, command_id)

    def analytics(self, key: live_view.Key) -> dict | None:
        return live_view.analytics(self._sa, self.engine, self.t, key)

    # ----------------------------------------------------------------------------- deployments
    def create_deployment(self, manifest: dict, signature: str, options: dict, waves: list[list[str]]) -> None:
        rollouts.create(self.engine, self.t, manifest, signature, options, waves)

    def advance_target(self, deployment_id: str, device_id: str, state: TargetState, detail: str | None = None, *,
                       now: float | None = None) -> bool:
        """Move a target forward to ``state`` (never backwards, never out of a finished state)."""
        return rollouts.advance(self.engine, self.t, deployment_id, device_id, state, detail,
                                time.time() if now is None else now)

    def set_deployment_status(self, deployment_id: str, status: DeploymentStatus, detail: str | None = None) -> None:
        rollouts.set_status(self.engine, self.t, deployment_id, status, detail)

    def abort_deployment(self, deployment_id: str, detail: str) -> bool:
        """Mark a running deployment aborted, atomically; False when it was not running."""
        return rollouts.abort(self.engine, self.t, deployment_id, detail)

    def set_deployment_analysis(self, deployment_id: str, analysis: dict) -> None:
        """Store a deployment's canary verdict (JSON)."""
        rollouts.set_analysis(self.engine, self.t, deployment_id, analysis)

    def telemetry_between(self, device_ids: list[str], since: float, until: float) -> list[tuple[str, float, dict]]:
        """(device, ts, payload) of these devices' telemetry stored with ``since <= ts <= until``."""
        return rollouts.telemetry_between(self._sa, self.engine, self.t, list(device_ids), since, until)

    def try_lease(self, deployment_id: str, owner: str, ttl_s: float, *, now: float | None = None) -> bool:
        """Take or renew the right to drive a running deployment until now + ttl_s."""
        return rollouts.try_lease(self.engine, self.t, deployment_id, owner, ttl_s,
                                  time.time() if now is None else now)

    def release_lease(self, deployment_id: str, owner: str) -> None:
        rollouts.release_lease(self.engine, self.t, deployment_id, owner)

    def running_deployments(self) -> list[dict]:
        return rollouts.running(self._sa, self.engine, self.t)

    def deployment_targets(self, deployment_id: str) -> list[dict]:
        return rollouts.targets(self._sa, self.engine, self.t, deployment_id)

    # ------------------------------------------------------------------- tokens, audit, credentials
    def insert_token(self, row: dict) -> None:
        security.insert_token(self.engine, self.t, row)

    def list_tokens(self) -> list[dict]:
        return security.list_tokens(self._sa, self.engine, self.t)

    def get_token(self, token_id: str) -> dict | None:
        return security.get_token(self._sa, self.engine, self.t, token_id)

    def revoke_token(self, token_id: str, now: float) -> dict | None:
        """Mark a token revoked (once); its row, or None when there is no such token."""
        return security.revoke_token(self._sa, self.engine, self.t, token_id, now)

    def touch_token(self, token_id: str, now: float) -> None:
        security.touch_token(self.engine, self.t, token_id, now)

    def audit(self, *, actor: str, role: str | None, action: str, target: str | None, remote: str | None,
              detail: dict | None = None, now: float | None = None) -> None:
        """Append to the audit log: who (a token's name), what, on what, from where."""
        self.audit_many([{"actor": actor, "role": role, "action": action, "target": target, "remote": remote,
                          "detail": detail}], now=now)

    def audit_many(self, entries: list[dict], *, now: float | None = None) -> None:
        """:meth:`audit` for several entries (keys as its arguments), in one transaction."""
        security.audit(self.engine, self.t, self.audit_rows(entries, now=now))

    @staticmethod
    def audit_rows(entries: list[dict], *, now: float | None = None) -> list[dict]:
        """The ``audit_log`` rows of entries (keys as :meth:`audit`'s arguments): what :meth:`audit_many` writes, and
        what a transaction that audits its own change writes (a device's provisioning request)."""
        ts = time.time() if now is None else now
        return [{**entry, "ts": ts, "detail": entry.get("detail") or {}} for entry in entries]

    def list_audit(self, limit: int = 100) -> list[dict]:
        """The newest ``limit`` audit entries, oldest first."""
        return security.list_audit(self._sa, self.engine, self.t, limit)

    def put_credentials(self, rows: list[dict]) -> None:
        """Store devices' credentials (replacing earlier ones) in one transaction."""
        security.put_credentials(self.engine, self.t, rows)

    def revoke_credential(self, device_id: str, now: float) -> bool:
        return security.revoke_credential(self.engine, self.t, device_id, now)

    def list_credentials(self) -> list[dict]:
        return security.list_credentials(self._sa, self.engine, self.t)

    def credential_for(self, username: str) -> dict | None:
        return security.get_credential_by_username(self._sa, self.engine, self.t, username)

    # ------------------------------------------------------------------------------ reading (the API)
    def list_devices(self, *, fleet: str | None = None, group: str | None = None) -> list[dict]:
        sa, t = self._sa, self.t
        query = sa.select(t.devices).order_by(t.devices.c.device_id)
        if fleet:
            query = query.where(t.devices.c.fleet == fleet)
        with self.engine.connect() as conn:
            rows = [dict(r) for r in conn.execute(query).mappings()]
        return [r for r in rows if group is None or group in (r["groups"] or [])]

    def get_device(self, device_id: str) -> dict | None:
        sa, t = self._sa, self.t
        with self.engine.connect() as conn:
            row = conn.execute(sa.select(t.devices).where(t.devices.c.device_id == device_id)).mappings().first()
        return dict(row) if row else None

    def device_marks(self) -> dict[str, tuple]:
        """Per device, the columns that change when anything about it does (cheap: no JSON decoded)."""
        sa, c = self._sa, self.t.devices.c
        query = sa.select(c.device_id, c.last_seen, c.online, c.model_version, c.delegate, c.last_telemetry_ts)
        with self.engine.connect() as conn:
            return {row[0]: tuple(row[1:]) for row in conn.execute(query)}

    def devices_by_id(self, device_ids: Sequence[str]) -> list[dict]:
        sa, t = self._sa, self.t
        query = sa.select(t.devices).where(t.devices.c.device_id.in_(list(device_ids))).order_by(t.devices.c.device_id)
        with self.engine.connect() as conn:
            return [dict(r) for r in conn.execute(query).mappings()]

    def events_after(self, after_id: int | None, limit: int = 100) -> tuple[int, list[dict]]:
        """Events stored after id ``after_id`` (None: the newest ``limit``), oldest first, each with its
        ``device_id``; and the newest id seen (to ask for what comes next)."""
        sa, t = self._sa, self.t
        query = sa.select(t.events.c.id, t.events.c.device_id, t.events.c.payload)
        if after_id is None:
            query = query.order_by(t.events.c.id.desc()).limit(limit)
        else:
            query = query.where(t.events.c.id > after_id).order_by(t.events.c.id).limit(limit)
        with self.engine.connect() as conn:
            rows = sorted(conn.execute(query).all(), key=lambda row: row[0])
        newest = rows[-1][0] if rows else (after_id or 0)
        return newest, [{"device_id": device_id, **(payload or {})} for _id, device_id, payload in rows]

    def device_telemetry(self, device_id: str, limit: int = 100) -> list[dict]:
        sa, t = self._sa, self.t
        query = (sa.select(t.telemetry.c.payload).where(t.telemetry.c.device_id == device_id)
                 .order_by(t.telemetry.c.id.desc()).limit(limit))
        with self.engine.connect() as conn:
            return [r[0] for r in conn.execute(query)][::-1]

    def device_rollups(self, device_id: str) -> list[dict]:
        sa, t = self._sa, self.t
        query = sa.select(t.rollups).where(t.rollups.c.device_id == device_id).order_by(t.rollups.c.minute)
        with self.engine.connect() as conn:
            return [dict(r) | {"fps_mean": r["fps_sum"] / r["samples"]} for r in conn.execute(query).mappings()]

    def device_events(self, device_id: str, limit: int = 100) -> list[dict]:
        sa, t = self._sa, self.t
        query = (sa.select(t.events.c.payload).where(t.events.c.device_id == device_id)
                 .order_by(t.events.c.id.desc()).limit(limit))
        with self.engine.connect() as conn:
            return [r[0] for r in conn.execute(query)][::-1]

    def list_deployments(self) -> list[dict]:
        sa, t = self._sa, self.t
        with self.engine.connect() as conn:
            rows = conn.execute(sa.select(t.deployments).order_by(t.deployments.c.created_at)).mappings()
            return [rollouts.summary(sa, conn, t, dict(r)) for r in rows]

    def get_deployment(self, deployment_id: str) -> dict | None:
        sa, t = self._sa, self.t
        with self.engine.connect() as conn:
            row = conn.execute(sa.select(t.deployments)
                               .where(t.deployments.c.deployment_id == deployment_id)).mappings().first()
            if row is None:
                return None
            found = rollouts.summary(sa, conn, t, dict(row))
        found["devices"] = self.deployment_targets(deployment_id)
        return found


def _sqlite_pragmas(dbapi_connection, _record) -> None:
    """WAL, and every commit on disk before it returns (``synchronous=FULL``): ingest acknowledges a batch
    to the broker once its commit returns, and with NORMAL a power cut could undo the last commits of
    messages the broker has already forgotten. One fsync per batch of up to a thousand messages."""
    cursor = dbapi_connection.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA synchronous=FULL")
    cursor.close()

"""The fleet database: devices, telemetry roll-ups, events, deployments (SQLAlchemy Core).

SQLite (WAL) by default; any SQLAlchemy URL works, PostgreSQL included. Telemetry is
de-duplicated on (device, boot_id, seq), so QoS 1 redeliveries count once.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

from .._optional import import_optional
from ..errors import ConfigError

DEFAULT_DB_URL = "sqlite:///fleet.db"
TELEMETRY_KEEP_PER_DEVICE = 2000


def _tables(sa):
    metadata = sa.MetaData()
    devices = sa.Table(
        "devices", metadata,
        sa.Column("device_id", sa.String(128), primary_key=True),
        sa.Column("fleet", sa.String(128), nullable=False),
        sa.Column("groups", sa.JSON, nullable=False, default=list),
        sa.Column("online", sa.Boolean, nullable=False, default=False),
        sa.Column("state", sa.JSON),
        sa.Column("model_name", sa.String(256)),
        sa.Column("model_version", sa.Integer),
        sa.Column("model_sha256", sa.String(64)),
        sa.Column("delegate", sa.String(64)),
        sa.Column("last_telemetry", sa.JSON),
        sa.Column("first_seen", sa.Float, nullable=False),
        sa.Column("last_seen", sa.Float, nullable=False),
    )
    telemetry = sa.Table(
        "telemetry", metadata,
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("device_id", sa.String(128), nullable=False, index=True),
        sa.Column("boot_id", sa.String(64), nullable=False),
        sa.Column("seq", sa.BigInteger, nullable=False),
        sa.Column("ts", sa.Float, nullable=False),
        sa.Column("fps", sa.Float),
        sa.Column("latency_p95_ms", sa.Float),
        sa.Column("dropped", sa.Integer),
        sa.Column("payload", sa.JSON, nullable=False),
        sa.UniqueConstraint("device_id", "boot_id", "seq", name="telemetry_once"),
    )
    rollups = sa.Table(
        "telemetry_rollup", metadata,
        sa.Column("device_id", sa.String(128), primary_key=True),
        sa.Column("minute", sa.BigInteger, primary_key=True),
        sa.Column("samples", sa.Integer, nullable=False),
        sa.Column("fps_sum", sa.Float, nullable=False),
        sa.Column("latency_p95_max_ms", sa.Float),
        sa.Column("dropped_sum", sa.Integer, nullable=False),
    )
    events = sa.Table(
        "events", metadata,
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("device_id", sa.String(128), nullable=False, index=True),
        sa.Column("ts", sa.Float, nullable=False),
        sa.Column("kind", sa.String(64), nullable=False),
        sa.Column("payload", sa.JSON, nullable=False),
    )
    deployments = sa.Table(
        "deployments", metadata,
        sa.Column("deployment_id", sa.String(64), primary_key=True),
        sa.Column("model_name", sa.String(256), nullable=False),
        sa.Column("version", sa.Integer, nullable=False),
        sa.Column("sha256", sa.String(64), nullable=False),
        sa.Column("size", sa.BigInteger, nullable=False),
        sa.Column("target", sa.String(1024), nullable=False),
        sa.Column("options", sa.JSON, nullable=False),
        sa.Column("status", sa.String(32), nullable=False),
        sa.Column("detail", sa.Text),
        sa.Column("manifest", sa.JSON, nullable=False),
        sa.Column("signature", sa.Text, nullable=False),
        sa.Column("created_at", sa.Float, nullable=False),
        sa.Column("updated_at", sa.Float, nullable=False),
    )
    targets = sa.Table(
        "deployment_devices", metadata,
        sa.Column("deployment_id", sa.String(64), primary_key=True),
        sa.Column("device_id", sa.String(128), primary_key=True),
        sa.Column("wave", sa.Integer, nullable=False),
        sa.Column("state", sa.String(32), nullable=False),
        sa.Column("detail", sa.Text),
        sa.Column("updated_at", sa.Float, nullable=False),
    )
    return metadata, devices, telemetry, rollups, events, deployments, targets


class FleetDB:
    """Thread-safe access to the fleet database at ``url``."""

    def __init__(self, url: str = DEFAULT_DB_URL) -> None:
        sa = import_optional("sqlalchemy", "fleet", "the fleet database")

        self._sa = sa
        try:
            if url.startswith("sqlite"):
                self.engine = sa.create_engine(url, connect_args={"check_same_thread": False, "timeout": 30})
                sa.event.listen(self.engine, "connect", _sqlite_pragmas)
            else:
                self.engine = sa.create_engine(url, pool_pre_ping=True)
            (self._metadata, self.devices, self.telemetry, self.rollups, self.events, self.deployments,
             self.targets) = _tables(sa)
            self._metadata.create_all(self.engine)
        except (sa.exc.ArgumentError, sa.exc.OperationalError, ModuleNotFoundError) as exc:
            raise ConfigError(f"cannot open fleet database {url!r}: {exc}") from None
        self._lock = threading.Lock()  # SQLite allows one writer; serialise ours

    def close(self) -> None:
        self.engine.dispose()

    # -------------------------------------------------------------------------------- ingest
    def _upsert_device(self, conn, fleet: str, device_id: str, values: dict[str, Any], now: float) -> None:
        sa = self._sa
        match = self.devices.c.device_id == device_id
        existing = conn.execute(sa.select(self.devices.c.device_id).where(match)).first()
        if existing:
            conn.execute(self.devices.update().where(self.devices.c.device_id == device_id)
                         .values(fleet=fleet, last_seen=now, **values))
        else:
            defaults = {"groups": [], "online": False}
            conn.execute(self.devices.insert().values(device_id=device_id, fleet=fleet, first_seen=now,
                                                      last_seen=now, **(defaults | values)))

    def record_state(self, fleet: str, device_id: str, state: dict) -> None:
        """A device's retained state message (birth or Last Will)."""
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
        with self._lock, self.engine.begin() as conn:
            self._upsert_device(conn, fleet, device_id, values, time.time())

    def record_telemetry(self, fleet: str, device_id: str, message: dict) -> bool:
        """Store one telemetry message once; False when (boot_id, seq) was already seen."""
        sa = self._sa
        now = time.time()
        ts = float(message.get("ts") or now)
        pipelines = message.get("pipelines") or []
        p95s = [((p.get("stages") or {}).get("latency") or {}).get("p95") for p in pipelines]
        p95s = [v for v in p95s if v is not None]
        row = {
            "device_id": device_id, "boot_id": str(message.get("boot_id")), "seq": int(message.get("seq", 0)),
            "ts": ts, "fps": sum(float(p.get("fps") or 0.0) for p in pipelines),
            "latency_p95_ms": max(p95s) if p95s else None,
            "dropped": sum(int(p.get("dropped") or 0) for p in pipelines), "payload": message,
        }
        with self._lock, self.engine.begin() as conn:
            try:
                with conn.begin_nested():
                    conn.execute(self.telemetry.insert().values(**row))
            except sa.exc.IntegrityError:
                return False
            self._upsert_device(conn, fleet, device_id, {"last_telemetry": message, "online": True}, now)
            self._roll_up(conn, row)
            self._prune(conn, device_id)
        return True

    def _roll_up(self, conn, row: dict) -> None:
        sa = self._sa
        minute = int(row["ts"] // 60)
        key = (self.rollups.c.device_id == row["device_id"]) & (self.rollups.c.minute == minute)
        current = conn.execute(sa.select(self.rollups).where(key)).mappings().first()
        fps, p95, dropped = float(row["fps"] or 0.0), row["latency_p95_ms"], int(row["dropped"] or 0)
        if current is None:
            conn.execute(self.rollups.insert().values(device_id=row["device_id"], minute=minute, samples=1,
                                                      fps_sum=fps, latency_p95_max_ms=p95, dropped_sum=dropped))
            return
        worst = max(x for x in (current["latency_p95_max_ms"], p95, -1.0) if x is not None)
        conn.execute(self.rollups.update().where(key).values(
            samples=current["samples"] + 1, fps_sum=current["fps_sum"] + fps,
            latency_p95_max_ms=None if worst < 0 else worst, dropped_sum=current["dropped_sum"] + dropped))

    def _prune(self, conn, device_id: str) -> None:
        sa = self._sa
        keep = (sa.select(self.telemetry.c.id).where(self.telemetry.c.device_id == device_id)
                .order_by(self.telemetry.c.id.desc()).limit(TELEMETRY_KEEP_PER_DEVICE))
        count = conn.execute(sa.select(sa.func.count()).where(self.telemetry.c.device_id == device_id)).scalar()
        if count > TELEMETRY_KEEP_PER_DEVICE + 200:  # prune in batches, not on every row
            conn.execute(self.telemetry.delete().where(
                (self.telemetry.c.device_id == device_id) & self.telemetry.c.id.not_in(keep.scalar_subquery())))

    def record_event(self, fleet: str, device_id: str, event: dict) -> None:
        """Keep a device event (fallbacks, errors, update progress)."""
        now = time.time()
        with self._lock, self.engine.begin() as conn:
            conn.execute(self.events.insert().values(device_id=device_id, ts=float(event.get("ts") or now),
                                                     kind=str(event.get("kind", "unknown"))[:64], payload=event))
            self._upsert_device(conn, fleet, device_id, {}, now)

    # ----------------------------------------------------------------------------- deployments
    def create_deployment(self, manifest: dict, signature: str, options: dict, waves: list[list[str]]) -> None:
        now = time.time()
        with self._lock, self.engine.begin() as conn:
            conn.execute(self.deployments.insert().values(
                deployment_id=manifest["deployment_id"], model_name=manifest["model_name"],
                version=manifest["version"], sha256=manifest["sha256"], size=manifest["size"],
                target=manifest["target"], options=options, status="running", manifest=manifest,
                signature=signature, created_at=now, updated_at=now))
            for wave, devices in enumerate(waves):
                for device_id in devices:
                    conn.execute(self.targets.insert().values(deployment_id=manifest["deployment_id"],
                                                              device_id=device_id, wave=wave, state="pending",
                                                              updated_at=now))

    def set_target_state(self, deployment_id: str, device_id: str, state: str, detail: str | None = None) -> None:
        with self._lock, self.engine.begin() as conn:
            conn.execute(self.targets.update().where(
                (self.targets.c.deployment_id == deployment_id) & (self.targets.c.device_id == device_id)
            ).values(state=state, detail=detail, updated_at=time.time()))

    def set_deployment_status(self, deployment_id: str, status: str, detail: str | None = None) -> None:
        with self._lock, self.engine.begin() as conn:
            conn.execute(self.deployments.update().where(self.deployments.c.deployment_id == deployment_id)
                         .values(status=status, detail=detail, updated_at=time.time()))

    def latest_version(self, model_name: str) -> int | None:
        sa = self._sa
        with self.engine.connect() as conn:
            return conn.execute(sa.select(sa.func.max(self.deployments.c.version))
                                .where(self.deployments.c.model_name == model_name)).scalar()

    # ------------------------------------------------------------------------------ reading (FleetAPI)
    def list_devices(self, *, fleet: str | None = None, group: str | None = None) -> list[dict]:
        sa = self._sa
        query = sa.select(self.devices).order_by(self.devices.c.device_id)
        if fleet:
            query = query.where(self.devices.c.fleet == fleet)
        with self.engine.connect() as conn:
            rows = [dict(r) for r in conn.execute(query).mappings()]
        return [r for r in rows if group is None or group in (r["groups"] or [])]

    def get_device(self, device_id: str) -> dict | None:
        sa = self._sa
        with self.engine.connect() as conn:
            row = conn.execute(sa.select(self.devices).where(self.devices.c.device_id == device_id)).mappings().first()
        return dict(row) if row else None

    def device_telemetry(self, device_id: str, limit: int = 100) -> list[dict]:
        sa = self._sa
        query = (sa.select(self.telemetry.c.payload).where(self.telemetry.c.device_id == device_id)
                 .order_by(self.telemetry.c.id.desc()).limit(limit))
        with self.engine.connect() as conn:
            return [r[0] for r in conn.execute(query)][::-1]

    def device_rollups(self, device_id: str) -> list[dict]:
        sa = self._sa
        query = sa.select(self.rollups).where(self.rollups.c.device_id == device_id).order_by(self.rollups.c.minute)
        with self.engine.connect() as conn:
            return [dict(r) | {"fps_mean": r["fps_sum"] / r["samples"]} for r in conn.execute(query).mappings()]

    def device_events(self, device_id: str, limit: int = 100) -> list[dict]:
        sa = self._sa
        query = (sa.select(self.events.c.payload).where(self.events.c.device_id == device_id)
                 .order_by(self.events.c.id.desc()).limit(limit))
        with self.engine.connect() as conn:
            return [r[0] for r in conn.execute(query)][::-1]

    def list_deployments(self) -> list[dict]:
        sa = self._sa
        with self.engine.connect() as conn:
            rows = conn.execute(sa.select(self.deployments).order_by(self.deployments.c.created_at)).mappings()
            return [self._deployment_summary(conn, dict(r)) for r in rows]

    def get_deployment(self, deployment_id: str) -> dict | None:
        sa = self._sa
        with self.engine.connect() as conn:
            row = conn.execute(sa.select(self.deployments)
                               .where(self.deployments.c.deployment_id == deployment_id)).mappings().first()
            if row is None:
                return None
            summary = self._deployment_summary(conn, dict(row))
            targets = conn.execute(sa.select(self.targets).where(self.targets.c.deployment_id == deployment_id)
                                   .order_by(self.targets.c.wave, self.targets.c.device_id)).mappings()
            summary["devices"] = [dict(t) for t in targets]
        return summary

    def _deployment_summary(self, conn, row: dict) -> dict:
        sa = self._sa
        counts = conn.execute(sa.select(self.targets.c.state, sa.func.count())
                              .where(self.targets.c.deployment_id == row["deployment_id"])
                              .group_by(self.targets.c.state)).all()
        row["counts"] = {state: n for state, n in counts}
        row.pop("manifest", None)
        row.pop("signature", None)
        return row


def _sqlite_pragmas(dbapi_connection, _record) -> None:
    cursor = dbapi_connection.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA synchronous=NORMAL")
    cursor.close()


"""API tokens (hashes only), the audit log, devices' MQTT credentials and certificates in the fleet database."""

from __future__ import annotations

from typing import Any

from .schema import Tables


def insert_token(engine: Any, t: Tables, row: dict) -> None:
    with engine.begin() as conn:
        conn.execute(t.tokens.insert().values(**row))


def list_tokens(sa: Any, engine: Any, t: Tables) -> list[dict]:
    with engine.connect() as conn:
        return [dict(r) for r in conn.execute(sa.select(t.tokens).order_by(t.tokens.c.created_at)).mappings()]


def get_token(sa: Any, engine: Any, t: Tables, token_id: str) -> dict | None:
    with engine.connect() as conn:
        row = conn.execute(sa.select(t.tokens).where(t.tokens.c.token_id == token_id)).mappings().first()
    return dict(row) if row else None


def revoke_token(sa: Any, engine: Any, t: Tables, token_id: str, now: float) -> dict | None:
    c = t.tokens.c
    with engine.begin() as conn:
        conn.execute(t.tokens.update().where((c.token_id == token_id) & c.revoked_at.is_(None)).values(revoked_at=now))
        row = conn.execute(sa.select(t.tokens).where(c.token_id == token_id)).mappings().first()
    return dict(row) if row else None


def touch_token(engine: Any, t: Tables, token_id: str, now: float) -> None:
    with engine.begin() as conn:
        conn.execute(t.tokens.update().where(t.tokens.c.token_id == token_id).values(last_used_at=now))


def audit(engine: Any, t: Tables, rows: list[dict]) -> None:
    """Append entries in one transaction (a batch enrolment is one commit, not one per device)."""
    with engine.begin() as conn:
        conn.execute(t.audit.insert(), rows)


def list_audit(sa: Any, engine: Any, t: Tables, limit: int) -> list[dict]:
    with engine.connect() as conn:
        rows = conn.execute(sa.select(t.audit).order_by(t.audit.c.id.desc()).limit(limit)).mappings()
        return [dict(r) for r in rows][::-1]


def put_credentials(engine: Any, t: Tables, rows: list[dict]) -> None:
    """Insert or replace devices' credentials in one transaction (a re-enrolment issues a new password)."""
    with engine.begin() as conn:
        conn.execute(t.credentials.delete().where(t.credentials.c.device_id.in_([r["device_id"] for r in rows])))
        conn.execute(t.credentials.insert(), rows)


def revoke_credential(engine: Any, t: Tables, device_id: str, now: float) -> bool:
    c = t.credentials.c
    with engine.begin() as conn:
        result = conn.execute(t.credentials.update().where((c.device_id == device_id) & c.revoked_at.is_(None))
                              .values(revoked_at=now))
    return result.rowcount == 1


def list_credentials(sa: Any, engine: Any, t: Tables) -> list[dict]:
    with engine.connect() as conn:
        query = sa.select(t.credentials).order_by(t.credentials.c.device_id)
        return [dict(r) for r in conn.execute(query).mappings()]


def get_credential_by_username(sa: Any, engine: Any, t: Tables, username: str) -> dict | None:
    with engine.connect() as conn:
        row = conn.execute(sa.select(t.credentials).where(t.credentials.c.username == username)).mappings().first()
    return dict(row) if row else None


def add_certificate(engine: Any, t: Tables, row: dict) -> None:
    with engine.begin() as conn:
        conn.execute(t.certificates.insert().values(**row))


def revoke_certificates(sa: Any, engine: Any, t: Tables, device_id: str, now: float) -> list[str]:
    """Revoke every unrevoked certificate of ``device_id``; their serials."""
    c = t.certificates.c
    live = (c.device_id == device_id) & c.revoked_at.is_(None)
    with engine.begin() as conn:
        serials = [r[0] for r in conn.execute(sa.select(c.serial).where(live))]
        conn.execute(t.certificates.update().where(live).values(revoked_at=now))
    return serials


def revoked_certificates(sa: Any, engine: Any, t: Tables, now: float) -> list[dict]:
    """The revoked certificates not yet expired (an expired one needs no CRL entry: it is refused anyway)."""
    c = t.certificates.c
    with engine.connect() as conn:
        query = sa.select(c.serial, c.revoked_at).where(c.revoked_at.is_not(None) & (c.not_after > now))
        return [dict(r) for r in conn.execute(query.order_by(c.serial)).mappings()]


def certificate(sa: Any, engine: Any, t: Tables, serial: str) -> dict | None:
    with engine.connect() as conn:
        row = conn.execute(sa.select(t.certificates).where(t.certificates.c.serial == serial)).mappings().first()
    return dict(row) if row else None



class CertificateRows:
    """The client certificates the fleet's CA issued to devices (``device_certificates``), by serial."""

    def __init__(self, sa: Any, engine: Any, t: Tables) -> None:
        self._sa, self.engine, self.t = sa, engine, t

    def add(self, row: dict) -> None:
        """Record a certificate: serial (hex), device_id, issued_at, not_after, revoked_at."""
        add_certificate(self.engine, self.t, row)

    def revoke(self, device_id: str, now: float) -> list[str]:
        """Revoke every unrevoked certificate of ``device_id``; their serials."""
        return revoke_certificates(self._sa, self.engine, self.t, device_id, now)

    def revoked(self, now: float) -> list[dict]:
        """The revoked certificates still within their lifetime (serial, revoked_at): the CRL's entries."""
        return revoked_certificates(self._sa, self.engine, self.t, now)

    def get(self, serial: str) -> dict | None:
        return certificate(self._sa, self.engine, self.t, serial)

"""Claims and provisioning requests in the fleet database (fleet/claims.py says what they mean): ``claims`` (the token's
hash only), ``claim_serials`` and ``provisioning``. A request is made in one transaction with its claim's row locked
(PostgreSQL: ``FOR UPDATE``; SQLite writes one at a time), so several managers never admit more devices than a claim
allows; the serial's and the device id's uniqueness are the table's, so two managers never give one twice."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

#: what a request's row is listed with (not its CSR)
LISTED = ("device_id", "serial", "claim_id", "fleet", "groups", "state", "public_key_sha256", "hardware", "remote",
          "requested_at", "decided_at", "decided_by", "cert_serial", "not_after")


class ClaimRows:
    """``claims``, ``claim_serials`` and ``provisioning`` of a fleet database (``FleetDB.claims``)."""

    def __init__(self, sa: Any, engine: Any, tables: Any) -> None:
        self.sa, self.engine = sa, engine
        self.claims, self.serials, self.requests = tables.claims, tables.claim_serials, tables.provisioning
        self._taken = (tables.devices, tables.credentials)  # device ids in use besides the requests'
        self.certificates, self.audit = tables.certificates, tables.audit
        self._holders: Any = None  # the statement that finds who holds a device id (made once)

    # ----------------------------------------------------------------------------------------- claims
    def insert_claim(self, row: dict, serials: Iterable[str]) -> None:
        with self.engine.begin() as conn:
            conn.execute(self.claims.insert().values(**row))
            listed = [{"claim_id": row["claim_id"], "serial": s} for s in dict.fromkeys(serials)]
            if listed:
                conn.execute(self.serials.insert(), listed)

    def claim(self, claim_id: str) -> dict | None:
        with self.engine.connect() as conn:
            row = conn.execute(self.sa.select(self.claims).where(self.claims.c.claim_id == claim_id)).mappings().first()
        return dict(row) if row else None

    def list_claims(self) -> list[dict]:
        """Every claim with ``used`` (its pending and approved requests) and ``serials`` (how many it lists)."""
        sa, r, s = self.sa, self.requests.c, self.serials.c
        used = (sa.select(r.claim_id, sa.func.count().label("n")).where(r.state != "rejected")
                .group_by(r.claim_id).subquery())
        listed = sa.select(s.claim_id, sa.func.count().label("n")).group_by(s.claim_id).subquery()
        query = (sa.select(self.claims, sa.func.coalesce(used.c.n, 0).label("used"),
                           sa.func.coalesce(listed.c.n, 0).label("serials"))
                 .outerjoin(used, used.c.claim_id == self.claims.c.claim_id)
                 .outerjoin(listed, listed.c.claim_id == self.claims.c.claim_id)
                 .order_by(self.claims.c.created_at))
        with self.engine.connect() as conn:
            return [dict(row) for row in conn.execute(query).mappings()]

    def revoke_claim(self, claim_id: str, now: float) -> bool:
        """Mark a claim revoked (once); False when there is no such claim."""
        c = self.claims.c
        with self.engine.begin() as conn:
            conn.execute(self.claims.update().where((c.claim_id == claim_id) & c.revoked_at.is_(None))
                         .values(revoked_at=now))
            return conn.execute(self.sa.select(c.claim_id).where(c.claim_id == claim_id)).first() is not None

    # ---------------------------------------------------------------------------------------- requests
    def request_for(self, serial: str) -> dict | None:
        """The request made for this serial (any state), with its CSR and certificate."""
        with self.engine.connect() as conn:
            row = conn.execute(self.sa.select(self.requests).where(self.requests.c.serial == serial)).mappings().first()
        return dict(row) if row else None

    def request(self, device_id: str) -> dict | None:
        query = self.sa.select(self.requests).where(self.requests.c.device_id == device_id)
        with self.engine.connect() as conn:
            row = conn.execute(query).mappings().first()
        return dict(row) if row else None

    def list_requests(self, state: str | None = None) -> list[dict]:
        query = self.sa.select(*(self.requests.c[name] for name in LISTED)).order_by(self.requests.c.requested_at)
        if state is not None:
            query = query.where(self.requests.c.state == state)
        with self.engine.connect() as conn:
            return [dict(row) for row in conn.execute(query).mappings()]

    def add_request(self, claim_id: str, row: dict, admit: Callable[[dict, int, bool], None],
                    names: Iterable[str], approve: Callable[[str], tuple[dict, dict]] | None = None,
                    audit: Callable[[dict], list[dict]] = lambda row: []) -> dict | None:
        """Insert a request under its claim, locked: ``admit(claim, used, listed)`` raises to refuse (the claim's row,
        its pending and approved requests, whether the serial is on its list); the device id is the first of
        ``names`` no device, credential or request holds. ``approve(device_id)``, for a request approved at once,
        gives the request's approved columns and its certificate's row, written in the same transaction, as are the
        ``audit_log`` rows ``audit(row)`` gives (one commit a device, not four). The row as stored, or None when
        another request for this serial committed first (read it again)."""
        sa, c, r = self.sa, self.claims.c, self.requests.c
        try:
            with self.engine.begin() as conn:
                claim = conn.execute(sa.select(self.claims).where(c.claim_id == claim_id).with_for_update()
                                     ).mappings().one()
                used = conn.execute(sa.select(sa.func.count()).select_from(self.requests)
                                    .where((r.claim_id == claim_id) & (r.state != "rejected"))).scalar_one()
                listed = claim["has_serials"] and conn.execute(sa.select(self.serials.c.serial).where(
                    (self.serials.c.claim_id == claim_id) & (self.serials.c.serial == row["serial"]))).first()
                admit(dict(claim), int(used), bool(listed))
                row = {**row, "device_id": self._free_name(conn, names)}
                if approve is not None:
                    approved, certificate = approve(row["device_id"])
                    row.update(approved)
                    conn.execute(self.certificates.insert().values(**certificate))
                conn.execute(self.requests.insert().values(**row))
                entries = audit(row)
                if entries:
                    conn.execute(self.audit.insert(), entries)
        except sa.exc.IntegrityError:
            return None
        return row

    def _free_name(self, conn: Any, names: Iterable[str]) -> str:
        sa = self.sa
        if self._holders is None:  # one statement for the three tables (a fleet provisions thousands at once)
            name = sa.bindparam("name")
            self._holders = sa.union_all(*(sa.select(table.c.device_id).where(table.c.device_id == name)
                                           for table in (self.requests, *self._taken))).limit(1)
        for name in names:
            if conn.execute(self._holders, {"name": name}).first() is None:
                return name
        raise RuntimeError("no free name")  # names() is endless

    def decide(self, device_id: str, state: str, values: dict) -> dict | None:
        """Move a pending request to ``state`` with ``values`` (who, when, the certificate); the row as it is now
        (unchanged when it was not pending), or None when there is no such request."""
        r = self.requests.c
        with self.engine.begin() as conn:
            conn.execute(self.requests.update().where((r.device_id == device_id) & (r.state == "pending"))
                         .values(state=state, **values))
            row = conn.execute(self.sa.select(self.requests).where(r.device_id == device_id)).mappings().first()
        return dict(row) if row else None

"""Claims and provisioning requests in the fleet database (fleet/claims.py says what they mean): ``claims`` (the token's
hash only), ``claim_serials`` and ``provisioning``. Requests are made a batch at a time (fleet/claim_batches.py), in
one transaction with their claim's row locked (its ``used`` count taken by an ``UPDATE``: PostgreSQL locks the row;
SQLite writes one at a time), so several managers never admit more devices than a claim allows; the serial's and the
device id's uniqueness are the table's, so two managers never give one twice. ``claims.used`` counts a claim's
pending and approved requests (migration 0015): a batch's requests add theirs, a rejection frees one, in the same
transaction — a lock held for O(1), not a count of every request the claim made."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any

#: what a request's row is listed with (not its CSR)
LISTED = ("device_id", "serial", "claim_id", "fleet", "groups", "state", "public_key_sha256", "hardware", "remote",
          "requested_at", "decided_at", "decided_by", "cert_serial", "not_after")


class ClaimRows:
    """``claims``, ``claim_serials`` and ``provisioning`` of a fleet database (``FleetDB.claims``)."""

    def __init__(self, sa: Any, engine: Any, tables: Any) -> None:
        self.sa, self.engine = sa, engine
        self.claims, self.serials, self.requests = tables.claims, tables.claim_serials, tables.provisioning
        self.certificates, self.audit = tables.certificates, tables.audit
        # what a batch of devices' requests runs, made once (a fleet provisions thousands at once: no statement built
        # and cache-keyed again each time); a bindparam is never a column's name, which an UPDATE keeps for its SET
        c, r, s = self.claims.c, self.requests.c, self.serials.c
        claim, n = sa.bindparam("claim"), sa.bindparam("n")
        self._claims_of = sa.select(self.claims).where(c.claim_id.in_(sa.bindparam("claims", expanding=True)))
        self._requests_of = sa.select(self.requests).where(r.serial.in_(sa.bindparam("serials", expanding=True)))
        self._take_places = (self.claims.update().where(c.claim_id == claim).values(used=c.used + n)
                             .returning(*self.claims.c))  # locks the claim's row (PostgreSQL) till the commit
        self._give_back = self.claims.update().where(c.claim_id == claim).values(used=c.used - n)
        self._listed = sa.select(s.serial).where((s.claim_id == claim)
                                                 & s.serial.in_(sa.bindparam("serials", expanding=True)))
        names = sa.bindparam("names", expanding=True)
        self._holders = sa.union_all(*(sa.select(table.c.device_id).where(table.c.device_id.in_(names))
                                       for table in (self.requests, tables.devices, tables.credentials)))
        self._inserts = {table.name: table.insert() for table in (self.requests, self.certificates, self.audit)}

    @contextmanager
    def batch(self) -> Iterator[RequestBatch]:
        """One pooled connection and one transaction for what a batch of devices' requests reads and writes
        (:meth:`RequestBatch.write` commits; anything else rolls back on leaving)."""
        with self.engine.connect() as conn:
            try:
                yield RequestBatch(self, conn)
            except BaseException:
                conn.rollback()
                raise

    # ----------------------------------------------------------------------------------------- claims
    def insert_claim(self, row: dict, serials: Iterable[str]) -> None:
        with self.engine.begin() as conn:
            conn.execute(self.claims.insert(), row)
            listed = [{"claim_id": row["claim_id"], "serial": s} for s in dict.fromkeys(serials)]
            if listed:
                conn.execute(self.serials.insert(), listed)

    def list_claims(self) -> list[dict]:
        """Every claim with ``used`` (its pending and approved requests) and ``serials`` (how many it lists)."""
        sa, s = self.sa, self.serials.c
        listed = sa.select(s.claim_id, sa.func.count().label("n")).group_by(s.claim_id).subquery()
        query = (sa.select(self.claims, sa.func.coalesce(listed.c.n, 0).label("serials"))
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
            row = conn.execute(self._requests_of, {"serials": [serial]}).mappings().first()
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

    def decide(self, device_id: str, state: str, values: dict) -> dict | None:
        """Move a pending request to ``state`` with ``values`` (who, when, the certificate); the row as it is now
        (unchanged when it was not pending), or None when there is no such request. A rejection frees its claim's
        place, in the same transaction."""
        sa, c, r = self.sa, self.claims.c, self.requests.c
        with self.engine.begin() as conn:
            row = conn.execute(self.requests.update().where((r.device_id == device_id) & (r.state == "pending"))
                               .values(state=state, **values).returning(*self.requests.c)).mappings().first()
            if row is None:  # not pending (or no such request): as it is
                row = conn.execute(sa.select(self.requests).where(r.device_id == device_id)).mappings().first()
            elif state == "rejected":
                conn.execute(self.claims.update().where(c.claim_id == row["claim_id"]).values(used=c.used - 1))
        return dict(row) if row else None


class RequestBatch:
    """What one batch of devices' requests reads and writes, on one connection in one transaction
    (:meth:`ClaimRows.batch`): few statements for many devices."""

    def __init__(self, rows: ClaimRows, conn: Any) -> None:
        self.rows, self.conn = rows, conn

    def claims(self, claim_ids: Iterable[str]) -> dict[str, dict]:
        """The claims of these ids (an unknown one is absent)."""
        found = self.conn.execute(self.rows._claims_of, {"claims": sorted(set(claim_ids))}).mappings()
        return {row["claim_id"]: dict(row) for row in found}

    def requests(self, serials: Iterable[str]) -> dict[str, dict]:
        """The requests made for these serials (any state), with their CSR and certificate."""
        found = self.conn.execute(self.rows._requests_of, {"serials": sorted(set(serials))}).mappings()
        return {row["serial"]: dict(row) for row in found}

    def take_places(self, claim_id: str, n: int) -> dict:
        """Count ``n`` more requests against the claim, its row locked till the commit: the claim as it now is."""
        return dict(self.conn.execute(self.rows._take_places, {"claim": claim_id, "n": n}).mappings().one())

    def give_back(self, claim_id: str, n: int) -> None:
        """Places taken by :meth:`take_places` for requests then refused."""
        if n:
            self.conn.execute(self.rows._give_back, {"claim": claim_id, "n": n})

    def listed(self, claim_id: str, serials: Iterable[str]) -> set[str]:
        """Which of ``serials`` the claim lists."""
        found = self.conn.execute(self.rows._listed, {"claim": claim_id, "serials": sorted(set(serials))})
        return {row[0] for row in found}

    def holders(self, names: Iterable[str]) -> set[str]:
        """Which of these device ids a request, a device or a credential holds already."""
        return {row[0] for row in self.conn.execute(self.rows._holders, {"names": sorted(set(names))})}

    def write(self, requests: list[dict], certificates: list[dict], audit: list[dict]) -> bool:
        """Insert the batch's requests, the certificates signed for them and their audit rows, and commit; False
        (rolled back) when another request took one of their serials or names first (another manager's)."""
        inserts, conn = self.rows._inserts, self.conn
        try:
            for table, rows in ((self.rows.certificates, certificates), (self.rows.requests, requests),
                                (self.rows.audit, audit)):
                if rows:
                    conn.execute(inserts[table.name], rows)
            conn.commit()
        except self.rows.sa.exc.IntegrityError:
            conn.rollback()
            return False
        return True

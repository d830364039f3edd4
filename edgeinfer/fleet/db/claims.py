"""Claims and provisioning requests in the fleet database (fleet/claims.py says what they mean): ``claims`` (the token's
hash only), ``claim_serials`` and ``provisioning``. A request is made in one transaction with its claim's row locked
(its ``used`` count taken by an ``UPDATE``: PostgreSQL locks the row; SQLite writes one at a time), so several managers
never admit more devices than a claim allows; the serial's and the device id's uniqueness are the table's, so two
managers never give one twice. ``claims.used`` counts a claim's pending and approved requests (migration 0015): the
request's insert adds one, a rejection frees it, in the same transaction — a lock held for O(1), not a count of
every request the claim made."""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterable, Iterator
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
        self._taken = (tables.devices, tables.credentials)  # device ids in use besides the requests'
        self.certificates, self.audit = tables.certificates, tables.audit
        self._bound: Any = None  # the connection of :meth:`one_connection`'s rows
        # what a device's request runs, made once (a fleet provisions thousands at once: no statement built and
        # cache-keyed again each time); a bindparam is never a column's name, which an UPDATE keeps for its SET
        c, r, s = self.claims.c, self.requests.c, self.serials.c
        claim, serial, name = sa.bindparam("claim"), sa.bindparam("serial_"), sa.bindparam("name")
        self._claim_and_request = (  # a device's first statement: its claim, and its request if it made one
            sa.select(self.claims, *(column.label(f"request_{column.name}") for column in self.requests.c))
            .select_from(self.claims.outerjoin(self.requests, r.serial == serial)).where(c.claim_id == claim))
        self._columns = tuple(tuple(column.name for column in table.c) for table in (self.claims, self.requests))
        self._request_for = sa.select(self.requests).where(r.serial == serial)
        self._take_place = (self.claims.update().where(c.claim_id == claim).values(used=c.used + 1)
                            .returning(*self.claims.c))  # locks the claim's row (PostgreSQL) till the commit
        self._listed = sa.select(s.serial).where((s.claim_id == claim) & (s.serial == serial))
        self._holders = sa.union_all(*(sa.select(table.c.device_id).where(table.c.device_id == name)
                                       for table in (self.requests, *self._taken))).limit(1)
        self._inserts = {table.name: table.insert() for table in (self.requests, self.certificates, self.audit)}

    @contextmanager
    def one_connection(self) -> Iterator[ClaimRows]:
        """These rows on one pooled connection, for what one device's request reads and writes: one checkout (and
        pre-ping) and one transaction, not one a call. :meth:`add_request` commits; the rest rolls back on leaving."""
        with self.engine.connect() as conn:
            bound = copy.copy(self)
            bound._bound = conn
            yield bound

    @contextmanager
    def _connection(self) -> Iterator[Any]:
        if self._bound is not None:
            yield self._bound
        else:
            with self.engine.connect() as conn:
                yield conn

    # ----------------------------------------------------------------------------------------- claims
    def insert_claim(self, row: dict, serials: Iterable[str]) -> None:
        with self.engine.begin() as conn:
            conn.execute(self.claims.insert(), row)
            listed = [{"claim_id": row["claim_id"], "serial": s} for s in dict.fromkeys(serials)]
            if listed:
                conn.execute(self.serials.insert(), listed)

    def claim_and_request(self, claim_id: str, serial: str) -> tuple[dict | None, dict | None]:
        """A claim's row (None: no such claim), and the request made for ``serial`` (:meth:`request_for`), in one
        statement: every device's request asks both."""
        with self._connection() as conn:
            row = conn.execute(self._claim_and_request, {"claim": claim_id, "serial_": serial}).mappings().first()
        if row is None:
            return None, None
        claim = {name: row[name] for name in self._columns[0]}
        request = {name: row[f"request_{name}"] for name in self._columns[1]}
        return claim, request if request["serial"] is not None else None  # the outer join's nulls: none made

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
        with self._connection() as conn:
            row = conn.execute(self._request_for, {"serial_": serial}).mappings().first()
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
        with self._connection() as conn:
            try:
                # the place taken first: the UPDATE locks the claim's row, and answers it as it now is
                claim = dict(conn.execute(self._take_place, {"claim": claim_id}).mappings().one())
                listed = claim["has_serials"] and conn.execute(self._listed, {"claim": claim_id,
                                                                              "serial_": row["serial"]}).first()
                admit(claim, claim["used"] - 1, bool(listed))
                row = {**row, "device_id": self._free_name(conn, names)}
                if approve is not None:
                    approved, certificate = approve(row["device_id"])
                    row.update(approved)
                    conn.execute(self._inserts[self.certificates.name], certificate)
                conn.execute(self._inserts[self.requests.name], row)
                entries = audit(row)
                if entries:
                    conn.execute(self._inserts[self.audit.name], entries)
                conn.commit()
            except self.sa.exc.IntegrityError:
                conn.rollback()  # the connection asks again in a new transaction
                return None
            except BaseException:
                conn.rollback()  # refused: the place taken is given back
                raise
        return row

    def _free_name(self, conn: Any, names: Iterable[str]) -> str:
        for name in names:
            if conn.execute(self._holders, {"name": name}).first() is None:
                return name
        raise RuntimeError("no free name")  # names() is endless

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

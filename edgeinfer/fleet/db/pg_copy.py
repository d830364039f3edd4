"""PostgreSQL's bulk path for telemetry: COPY the batch into a temporary table, then one
``INSERT … SELECT … ON CONFLICT DO NOTHING RETURNING``.

Why not the INSERT SQLAlchemy builds: a thousand rows of parameters make one statement with nine
thousand placeholders, too long for psycopg's statement cache, so psycopg re-parses it for every
batch — 70 µs of the manager's CPU per message, measured, more than everything else in ingest put
together. COPY streams the rows (psycopg's C row writer) and the statement stays short.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

_COLUMNS = ("device_id", "boot_id", "seq", "ts", "fps", "latency_p95_ms", "dropped", "payload")
_STAGING = "edgeinfer_telemetry_incoming"
_CREATE = (f"CREATE TEMPORARY TABLE IF NOT EXISTS {_STAGING} (device_id varchar(128), boot_id varchar(64), "
           "seq bigint, ts double precision, fps double precision, latency_p95_ms double precision, "
           "dropped integer, payload json) ON COMMIT DELETE ROWS")
_NAMES = ", ".join(_COLUMNS)
_COPY = f"COPY {_STAGING} ({_NAMES}) FROM STDIN"
# in key order: two managers with overlapping batches then wait for each other, never deadlock
_INSERT = (f"INSERT INTO telemetry ({_NAMES}) SELECT {_NAMES} FROM {_STAGING} ORDER BY device_id, boot_id, seq "
           "ON CONFLICT (device_id, boot_id, seq) DO NOTHING RETURNING device_id, boot_id, seq")


def insert_new(conn: Any, rows: Sequence[dict], to_json: Any) -> set[tuple[str, str, int]]:
    """Insert the telemetry ``rows`` not stored yet, in ``conn``'s transaction; the keys of those inserted.
    psycopg's errors are raised as SQLAlchemy's (DataError, IntegrityError, OperationalError...)."""
    import sqlalchemy as sa

    pooled = conn.connection
    dbapi = conn.dialect.loaded_dbapi
    try:
        with pooled.driver_connection.cursor() as cursor:
            # every time: made in a transaction that then rolls back, the table is gone again
            cursor.execute(_CREATE)
            with cursor.copy(_COPY) as copy:
                for row in rows:
                    copy.write_row((row["device_id"], row["boot_id"], row["seq"], row["ts"], row["fps"],
                                    row["latency_p95_ms"], row["dropped"], to_json(row["payload"])))
            cursor.execute(_INSERT)
            return {tuple(found) for found in cursor.fetchall()}
    except dbapi.Error as exc:
        raise sa.exc.DBAPIError.instance(_INSERT, None, exc, dbapi.Error) from exc

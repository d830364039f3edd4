"""The store-and-forward spool: order, durability across a SIGKILL, the disk bound, drop accounting."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

import pytest
from support.processes import env_with_repo

from edgeinfer.errors import ClosedError
from edgeinfer.link.spool import MIN_MAX_BYTES, PRIORITY_EVENT, PRIORITY_TELEMETRY, Spool

TOPIC = "edgeinfer/v1/default/cam-01/telemetry"


def payload(i: int, size: int = 1000) -> bytes:
    head = f'{{"seq":{i},"pad":"'.encode()
    return head + b"x" * max(0, size - len(head) - 2) + b'"}'


def test_rows_come_back_in_order_and_leave_only_when_acknowledged(tmp_path):
    with Spool(tmp_path / "s.db", max_bytes=MIN_MAX_BYTES * 4) as spool:
        ids = [spool.append(TOPIC, payload(i, 100)) for i in range(10)]
        assert ids == sorted(ids) and spool.pending == 10
        first = spool.fetch(0, 4)
        assert [r.id for r in first] == ids[:4] and first[0].payload == payload(0, 100)
        assert [r.id for r in spool.fetch(first[-1].id, 100)] == ids[4:]
        spool.ack(ids[1])
        spool.ack(ids[1])  # a second PUBACK for the same row changes nothing
        assert spool.pending == 9
        assert [r.id for r in spool.fetch(0, 3)] == [ids[0], ids[2], ids[3]]


def test_rows_survive_a_sigkill_and_ids_never_repeat(tmp_path):
    path = tmp_path / "s.db"
    code = textwrap.dedent(f"""
        import os, signal
        from edgeinfer.link.spool import Spool
        spool = Spool({str(path)!r}, max_bytes=1 << 20)
        for i in range(50):
            spool.append("t", b"m%d" % i)
        os.kill(os.getpid(), signal.SIGKILL)   # no close(), no checkpoint
    """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, env=env_with_repo())
    assert proc.returncode == -signal.SIGKILL
    assert (tmp_path / "s.db-wal").exists()  # the rows were only in the WAL
    with Spool(path, max_bytes=1 << 20) as spool:
        rows = spool.fetch(0, 100)
        assert [r.payload for r in rows] == [b"m%d" % i for i in range(50)]
        for row in rows:
            spool.ack(row.id)
        assert spool.pending == 0
        assert spool.append("t", b"next") > rows[-1].id  # AUTOINCREMENT: an acked id is never reused
    with Spool(path, max_bytes=1 << 20) as spool:
        assert spool.last_id == rows[-1].id + 1


def test_full_spool_stays_under_its_disk_bound_and_counts_what_it_drops(tmp_path):
    bound = 256 * 1024
    path = tmp_path / "s.db"
    peak = 0
    with Spool(path, max_bytes=bound) as spool:
        for i in range(800):
            spool.append(TOPIC, payload(i), priority=PRIORITY_EVENT if i % 100 == 0 else PRIORITY_TELEMETRY)
            if i % 10 == 0:
                peak = max(peak, spool.disk_bytes())
        stats = spool.stats()
        kept = spool.fetch(0, 10_000)
    assert peak <= bound and stats.disk_bytes <= bound
    assert stats.dropped > 600 and stats.pending == len(kept)
    assert stats.dropped + stats.pending == 800  # every message is either kept or counted
    # the newest survive, in order; events outlive telemetry
    seqs = [int(r.payload.split(b",")[0].split(b":")[1]) for r in kept]
    assert seqs == sorted(seqs) and seqs[-1] == 799
    assert stats.dropped_events == 0 and {0, 100, 700}.issubset(seqs)


def test_drop_counter_survives_restart_and_rows_in_flight_are_kept(tmp_path):
    path = tmp_path / "s.db"
    with Spool(path, max_bytes=MIN_MAX_BYTES) as spool:
        spool.append(TOPIC, payload(0))
        spool.append(TOPIC, payload(1))
        inflight = spool.fetch(0, 1)  # handed to the MQTT client, no PUBACK yet
        for i in range(2, 150):
            spool.append(TOPIC, payload(i))
        assert spool.fetch(0, 1)[0].id == inflight[0].id  # the oldest, but in flight: not dropped
        dropped = spool.counter("dropped")
        assert dropped > 0
    with Spool(path, max_bytes=MIN_MAX_BYTES) as spool:
        assert spool.counter("dropped") == dropped


def test_lowering_the_bound_trims_an_existing_spool(tmp_path):
    path = tmp_path / "s.db"
    with Spool(path, max_bytes=4 << 20) as spool:
        for i in range(1200):
            spool.append(TOPIC, payload(i))
    assert os.path.getsize(path) > 1 << 20
    with Spool(path, max_bytes=MIN_MAX_BYTES) as spool:
        assert spool.disk_bytes() <= MIN_MAX_BYTES
        assert spool.counter("dropped") > 1100


def test_an_unreadable_spool_is_moved_aside_not_fatal(tmp_path, caplog):
    path = tmp_path / "s.db"
    path.write_bytes(b"this is not a database" * 200)
    with Spool(path) as spool:
        assert spool.pending == 0
        spool.append("t", b"x")
    assert list(tmp_path.glob("s.db.corrupt-*")) and "unreadable" in caplog.text


def test_bad_bound_and_use_after_close(tmp_path):
    with pytest.raises(ValueError, match="at least"):
        Spool(tmp_path / "s.db", max_bytes=1000)
    spool = Spool(tmp_path / "s.db")
    spool.close()
    spool.close()
    with pytest.raises(ClosedError, match="closed"):
        spool.append("t", b"x")

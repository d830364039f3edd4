"""The spool outbox: what of a :class:`~edgeinfer.link.spool.Spool` is on its way to the broker.

It drains the spool oldest first at QoS 1 with a bounded in-flight window, and deletes a row only
when the PUBACK for that packet's mid arrives (paho's own queue is in memory; the spool is what
survives a crash). It also spots *poison*: a message no broker will take, which would otherwise
block the spool for ever — one over the broker's Maximum Packet Size (announced in an MQTT 5
CONNACK), or one the broker keeps hanging up on.

Only the link thread calls it (paho's callbacks run in that thread too).
"""

from __future__ import annotations

import logging
from typing import Any

from .paho_client import QUEUE_SIZE
from .spool import Spool
from .status import LinkStatus

log = logging.getLogger(__name__)

#: a spooled message is dropped as poison when the connection dies this many times in a row, each
#: time soon after connecting and with that message the oldest unacknowledged one (from the second
#: time on it is sent alone, so nothing else can be to blame)
POISON_STRIKES = 3
#: PUBLISH overhead besides topic and payload: fixed header, remaining length, topic length, packet
#: id, property length (an upper bound, for checking against the broker's Maximum Packet Size)
PUBLISH_OVERHEAD = 12


class Outbox:
    """Spooled rows handed to paho and not yet acknowledged (by mid), and the poison suspect."""

    def __init__(self, spool: Spool | None, status: LinkStatus, *, window: int) -> None:
        self._spool = spool
        self._status = status
        self._window = window
        self._inflight: dict[int, int] = {}       # paho mid -> spool row id
        self._cursor = 0                          # highest spool id handed to paho
        self._max_packet: int | None = None       # the broker's Maximum Packet Size (MQTT 5 CONNACK)
        self._suspect: tuple[int, int] | None = None  # (spool row, strikes): a message that may kill connections

    @property
    def _spool_open(self) -> bool:
        return self._spool is not None and not self._spool.closed

    def idle(self) -> bool:
        """True when no row waits to be published or acknowledged."""
        return not self._inflight and (not self._spool_open or self._spool.pending == 0)

    # ------------------------------------------------------------------------------ connection events
    def connected(self, max_packet: int | None) -> None:
        """A connection was accepted; the broker takes packets up to ``max_packet`` bytes (None: no limit)."""
        self._max_packet = max_packet

    def connection_lost(self, *, short_lived: bool) -> bool:
        """A connection died; True when the caller must discard its paho client and start over from the spool.

        A connection lost soon after connecting (``short_lived``), with spooled messages
        unacknowledged: suspect the oldest of them (a broker drops the connection on a message over
        its size limit, and paho would resend it after every reconnect for ever). It goes alone on
        the next connection; after POISON_STRIKES such losses in a row it is dropped, counted in
        ``rejected``.
        """
        if not self._spool_open or not self._inflight or not short_lived:
            self._suspect = None
            return False
        row = min(self._inflight.values())
        strikes = self._suspect[1] + 1 if self._suspect is not None and self._suspect[0] == row else 1
        if strikes >= POISON_STRIKES:
            self._suspect = None
            self._reject(row, f"the broker dropped the connection {strikes} times in a row while it was in flight "
                              "(over the broker's message size limit?)")
        else:
            self._suspect = (row, strikes)
        # paho would resend its whole queue; start over from the spool, the suspect first and alone
        return True

    def forget_client(self) -> None:
        """The paho client is gone with every mid it held: the rows are fetched again from the spool."""
        self._inflight.clear()
        self._cursor = 0
        if self._spool_open:
            self._spool.release_all()

    # ------------------------------------------------------------------------------ publishing
    def pump(self, client: Any) -> None:
        """Hand rows to ``client`` until the in-flight window is full or the spool has no more."""
        spool = self._spool
        if not self._spool_open:
            return
        # a suspected poison message travels alone until it is acknowledged
        window = 1 if self._suspect is not None else self._window
        while len(self._inflight) < window and spool.last_id > self._cursor:
            rows = spool.fetch(self._cursor, window - len(self._inflight))
            if not rows:
                self._cursor = spool.last_id
                break
            for index, row in enumerate(rows):
                size = len(row.topic.encode()) + len(row.payload) + PUBLISH_OVERHEAD
                if self._max_packet is not None and size > self._max_packet:
                    self._cursor = row.id
                    self._reject(row.id, f"{size} bytes on {row.topic} is over the broker's maximum packet size "
                                         f"({self._max_packet} bytes)")
                    continue
                info = client.publish(row.topic, row.payload, qos=row.qos, retain=row.retain)
                if info.rc == QUEUE_SIZE:
                    spool.release(r.id for r in rows[index:])
                    return
                self._inflight[info.mid] = row.id
                self._cursor = row.id
                self._status.published += 1

    def acknowledged(self, mid: int, reason: Any) -> bool:
        """A PUBACK for ``mid`` arrived: delete its row. False when ``mid`` is not a spooled row's."""
        failed = bool(getattr(reason, "is_failure", False))
        row = self._inflight.pop(mid, None)
        if row is None:
            return False
        if self._suspect is not None and self._suspect[0] == row:
            self._suspect = None  # it got through (or was refused with a reason): not poison
        self._status.acked += 1
        if failed:
            self._status.rejected += 1
            log.warning("broker refused spooled message %d: %s (dropped)", row, reason.getName())
        if self._spool is not None:
            self._spool.ack(row, rejected=failed)
        return True

    def _reject(self, row_id: int, why: str) -> None:
        """Drop a spooled message that no broker will take; it is counted, logged, and never retried."""
        self._status.rejected += 1
        self._status.last_error = f"dropped spooled message {row_id}: {why}"
        log.error("MQTT: dropped spooled message %d: %s", row_id, why)
        if self._spool is not None:
            self._spool.ack(row_id, rejected=True)

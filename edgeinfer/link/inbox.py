"""Received messages that are acknowledged only once they are stored (MQTT 5 manual acknowledgement).

With ``LinkSettings(manual_ack=True)`` paho does not answer a QoS 1 PUBLISH itself. The link hands
each message to ``on_delivery(topic, payload, delivery)``; the receiver stores it (on any thread) and
calls ``delivery.ack()``; the link thread sends the PUBACK. Together with the Receive Maximum, the
broker then never has more than that many messages in flight to us: when the receiver falls
behind, the broker holds the rest in our session instead of sending them, and nothing is lost.

A delivery belongs to one connection: after a reconnect the broker resends what was not
acknowledged (the session survives), so an ack of an older connection is dropped, never sent with
a packet id the new connection may have given to another message. The receiver de-duplicates.
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .paho_client import corked, loop_once

#: after a message, keep reading while more are waiting, up to this many (paho reads one per loop)
READ_BURST = 256
#: the network loop's wait while acknowledgements may arrive from another thread (paho's select() cannot see them)
ACK_POLL_S = 0.002
#: the network loop's wait otherwise (connected; while connecting it is shorter)
LOOP_TIMEOUT_S = 0.1


@dataclass(frozen=True, slots=True)
class Delivery:
    """One received message's acknowledgement handle; ``ack()`` may be called from any thread, once."""

    inbox: Inbox
    connection: int
    mid: int
    qos: int

    def ack(self) -> None:
        self.inbox.acknowledge(self)


DeliveryCallback = Callable[[str, bytes, Delivery], None]


class Inbox:
    """Hands received messages to ``on_delivery`` and queues their acknowledgements for the link thread."""

    def __init__(self, on_delivery: DeliveryCallback, wake: Callable[[], None]) -> None:
        self._on_delivery = on_delivery
        self._wake = wake
        self._acks: collections.deque[Delivery] = collections.deque()
        self._lock = threading.Lock()
        self._connection = 0
        self.outstanding = 0  # delivered on this connection, not yet acknowledged

    def connected(self) -> None:
        """A new connection: acknowledgements of the old one no longer apply."""
        with self._lock:
            self._connection += 1
            self._acks.clear()
            self.outstanding = 0

    def deliver(self, message: Any) -> None:
        """paho's on_message, on the link thread (paho holds its callback lock)."""
        delivery = Delivery(self, self._connection, message.mid, message.qos)
        if message.qos:
            self.outstanding += 1
        self._on_delivery(message.topic, bytes(message.payload), delivery)

    def acknowledge(self, delivery: Delivery) -> None:
        if delivery.qos == 0:
            return
        with self._lock:
            if delivery.connection != self._connection:
                return
            self._acks.append(delivery)
        self._wake()

    def pump(self, client: Any) -> None:
        """Send the queued PUBACKs (on the link thread), in one system call."""
        if not self._acks:
            return
        with self._lock:
            due = [delivery for delivery in self._acks if delivery.connection == self._connection]
            self._acks.clear()
            self.outstanding -= len(due)
        with corked(client):
            for delivery in due:
                client.ack(delivery.mid, delivery.qos)


def network_round(client: Any, status: Any, inbox: Inbox | None) -> int:
    """One round of the link's network loop (paho's result code): wait for traffic — briefly while
    acknowledgements may be due — and, for an inbox, read on without a select() while messages keep
    arriving (paho reads one packet per call)."""
    timeout = LOOP_TIMEOUT_S if status.connected else 0.05
    if inbox is not None and inbox.outstanding and status.connected:
        timeout = ACK_POLL_S
    rc = loop_once(client, timeout)
    for _ in range(READ_BURST if rc == 0 and inbox is not None else 0):
        before = status.received
        rc = client.loop_read()
        if rc != 0 or status.received == before:
            break
    return rc

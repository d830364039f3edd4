"""Received messages that are acknowledged only once they are stored (MQTT 5 manual acknowledgement).

With ``LinkSettings(manual_ack=True)`` paho does not answer a QoS 1 PUBLISH itself. The link hands
each message to ``on_delivery(topic, payload, delivery)``; the receiver stores it (on any thread) and
calls ``delivery.ack()``; the link thread sends the PUBACK. Together with the Receive Maximum, the
broker then never has more than that many messages in flight to us: when the receiver falls
behind, the broker holds the rest in our session instead of sending them, and nothing is lost.

The link thread waits in ``select()`` on its socket and on the inbox's wake-up socket: the first
acknowledgement queued while none is waiting writes one byte to it, so the link thread sends it at
once instead of polling for acknowledgements while messages are outstanding (a wake-up every 2 ms,
most of the link thread's CPU per message when they come one at a time, measured).

A delivery belongs to one connection: after a reconnect the broker resends what was not
acknowledged (the session survives), so an ack of an older connection is dropped, never sent with
a packet id the new connection may have given to another message. The receiver de-duplicates.
"""

from __future__ import annotations

import collections
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .paho_client import corked, loop_once

#: after a message, keep reading while more are waiting, up to this many (paho reads one per loop)
READ_BURST = 256
#: the network loop's wait (connected; while connecting it is shorter): traffic and acknowledgements end it sooner
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
        # written by acknowledge() (any thread), read by the link thread's select(): see the module's docstring
        self._wake_in, self._wake_out = socket.socketpair()
        self._wake_in.setblocking(False)
        self._wake_out.setblocking(False)

    def wake_fileno(self) -> int:
        """What the link thread's ``select()`` waits on besides its socket: readable once an acknowledgement is due."""
        return self._wake_in.fileno()

    def woken(self) -> None:
        """The link thread saw the wake-up socket readable: empty it (the acknowledgements are sent by :meth:`pump`)."""
        try:
            while self._wake_in.recv(4096):
                pass
        except OSError:  # BlockingIOError: emptied; or closed
            pass

    def close(self) -> None:
        """Release the wake-up sockets (an acknowledgement after this is dropped: its connection is gone)."""
        self._wake_in.close()
        self._wake_out.close()

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
            first = not self._acks  # one byte wakes the link thread; the rest go out with the first
            self._acks.append(delivery)
        if first:
            try:
                self._wake_out.send(b"\0")
            except OSError:  # BlockingIOError: bytes already wait there; or closed with the link
                pass
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
    """One round of the link's network loop (paho's result code): wait for traffic or, for an inbox, an
    acknowledgement to send, and read on without a select() while bytes already read ahead hold more
    messages (paho reads one packet per call)."""
    timeout = LOOP_TIMEOUT_S if status.connected else 0.05
    if inbox is None:
        rc = loop_once(client, timeout)
    else:
        rc = loop_once(client, timeout, wake=inbox.wake_fileno(), woken=inbox.woken)
    sock = client.socket()
    pending = getattr(sock, "pending", None)
    for _ in range(READ_BURST if rc == 0 and inbox is not None else 0):
        if pending is None or not pending():
            break  # nothing read ahead: what the kernel holds, the next select() finds (a read now would only fail)
        before = status.received
        rc = client.loop_read()
        if rc != 0 or status.received == before:
            break
    return rc

""""Latest value" retained messages (the device's ``state`` birth), re-published after every connect.

Only the newest payload per topic matters, so these bypass the spool: each topic remembers the
version last handed to paho, and a reconnect marks every topic unsent again.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from .paho_client import QUEUE_SIZE
from .status import LinkStatus

log = logging.getLogger(__name__)


class RetainedMessages:
    """The latest payload of each retained topic, and which of them the current connection has sent."""

    def __init__(self, status: LinkStatus) -> None:
        self._status = status
        self._lock = threading.Lock()  # set() is called from other threads than the link's
        self._latest: dict[str, tuple[bytes, int]] = {}  # topic -> (payload, version)
        self._sent: dict[str, int] = {}                   # topic -> version handed to paho
        self._version = 0
        self._inflight: set[int] = set()                  # paho mids not yet acknowledged

    def set(self, topic: str, payload: bytes) -> None:
        """Make ``payload`` the latest value of ``topic``; it goes out at the next pump."""
        with self._lock:
            self._version += 1
            self._latest[topic] = (bytes(payload), self._version)

    def idle(self) -> bool:
        """True when every latest value has been sent and acknowledged."""
        with self._lock:
            all_sent = all(self._sent.get(t) == v for t, (_p, v) in self._latest.items())
        return all_sent and not self._inflight

    def pump(self, client: Any) -> None:
        """Publish (retained, QoS 1) every latest value this connection has not sent yet."""
        with self._lock:
            pending = [(t, p, v) for t, (p, v) in self._latest.items() if self._sent.get(t) != v]
        for topic, payload, version in pending:
            info = client.publish(topic, payload, qos=1, retain=True)
            if info.rc == QUEUE_SIZE:
                return
            self._inflight.add(info.mid)
            self._status.published += 1
            with self._lock:
                self._sent[topic] = version

    def acknowledged(self, mid: int, reason: Any) -> None:
        """A PUBACK for one of ours (or for a mid nobody tracks any more)."""
        self._inflight.discard(mid)
        if getattr(reason, "is_failure", False):
            log.warning("broker refused a retained message: %s", reason.getName())

    def connection_dropped(self) -> None:
        """The retained state is re-published at every connect."""
        with self._lock:
            self._sent.clear()

    def forget_client(self) -> None:
        """The paho client is gone with the mids it held."""
        self._inflight.clear()

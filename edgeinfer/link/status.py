"""The link's counters and last error, shared by the connection, the outbox and the retained messages."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass
class LinkStatus:
    """Counters and the last error, for telemetry and /metrics."""

    connected: bool = False
    protocol: str = ""
    connects: int = 0
    disconnects: int = 0
    failed_attempts: int = 0
    published: int = 0
    acked: int = 0
    rejected: int = 0
    received: int = 0
    last_error: str | None = None
    connected_since: float | None = None
    session_present: bool | None = None
    #: monotonic time the last connection was lost (None while connected or before the first)
    lost_since: float | None = None

    def to_dict(self) -> dict[str, Any]:
        """The figures telemetry reports (not the timestamps)."""
        return {"connected": self.connected, "protocol": self.protocol, "connects": self.connects,
                "disconnects": self.disconnects, "failed_attempts": self.failed_attempts,
                "published": self.published, "acked": self.acked, "rejected": self.rejected,
                "received": self.received, "last_error": self.last_error}

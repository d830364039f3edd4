"""What the fleet knows of its devices, for the API: every device, one with its recent events and roll-ups,
its telemetry, and the fleet at a glance (``overview.py``)."""

from __future__ import annotations

from .db import FleetDB
from .evidence import EvidenceStore
from .overview import EVENTS_SHOWN, overview

#: a device's page shows this many of its newest events, and this many minutes of roll-ups
DEVICE_EVENTS = 50
DEVICE_ROLLUPS = 60


class DeviceService:
    """Reads devices from the fleet database (their events with their evidence from ``evidence``)."""

    def __init__(self, db: FleetDB, evidence: EvidenceStore) -> None:
        self.db = db
        self.evidence = evidence

    def list(self) -> list[dict]:
        return self.db.list_devices()

    def get(self, device_id: str) -> dict | None:
        """The device with its newest events (each with its evidence), its model slots and roll-ups."""
        device = self.db.get_device(device_id)
        if device is not None:
            events = [{**event, "device_id": device_id}
                      for event in self.db.device_events(device_id, limit=DEVICE_EVENTS)]
            device["events"] = self.evidence.with_evidence(events)
            device["slots"] = (device.get("state") or {}).get("slots")  # as the agent reports them
            device["rollups"] = self.db.device_rollups(device_id)[-DEVICE_ROLLUPS:]
        return device

    def telemetry(self, device_id: str, limit: int) -> list[dict]:
        """The device's newest ``limit`` telemetry messages, oldest first."""
        return self.db.device_telemetry(device_id, limit)

    def overview(self) -> dict:
        return overview(self.db.list_devices(), self.db.events_after(None, EVENTS_SHOWN)[1])

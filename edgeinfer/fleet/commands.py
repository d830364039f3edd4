"""Commands to devices: each one signed with the fleet key for its device only, spooled, sent by the link.

Agents refuse unsigned state-changing commands, and a signed one cannot be replayed on another device
or later: it expires with its manifest (``deploy``) or :data:`~edgeinfer.updates.signing.COMMAND_TTL_S`
from now. A deploy command carries a short-lived download grant for its artifact (``auth.issue_grant``),
so a device without an enrolled credential can still fetch it.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

from ..link.mqtt import MqttLink
from ..link.protocol import Topics, encode, make_command
from ..link.spool import Spool
from ..link.vocabulary import Command
from ..updates.signing import COMMAND_TTL_S, SigningKey, sign_command
from .auth import issue_grant
from .db import FleetDB

#: a download grant lives as long as a rollout waits for its device, and an hour at least
MIN_GRANT_S = 3600.0


class CommandService:
    """Signs and queues commands (QoS 1, in ``spool``); the MQTT link drains the spool to the broker."""

    def __init__(self, db: FleetDB, key: SigningKey, spool: Spool) -> None:
        self.db = db
        self.key = key
        self.spool = spool
        #: the link that sends what is spooled: told at once when there is something new (it also polls)
        self.link: MqttLink | None = None

    def send(self, device: str, cmd: Command, args: dict[str, Any], *, command_id: str | None = None) -> str:
        """Queue ``cmd`` for ``device``, signed for it; the command's id. LookupError for an unknown device."""
        record = self.db.get_device(device)
        if record is None:
            raise LookupError(f"no device {device}")
        command_id = command_id or uuid.uuid4().hex
        manifest = args.get("manifest") if cmd == Command.DEPLOY else None
        expires = manifest.get("expires_at") if isinstance(manifest, dict) else None
        if not isinstance(expires, (int, float)) or isinstance(expires, bool):
            expires = time.time() + COMMAND_TTL_S
        if isinstance(manifest, dict) and "grant" not in args and isinstance(manifest.get("sha256"), str):
            args = {**args, "grant": self.grant(manifest["sha256"], device)}
        message = sign_command(self.key, make_command(command_id, Command(cmd).value, args), device_id=device,
                               expires=expires)
        self.spool.append(Topics(record["fleet"], device).cmd, encode(message))
        if self.link is not None:
            self.link.notify()
        return command_id

    def grant(self, sha256: str, device: str, device_timeout_s: float | None = None) -> str:
        """A short-lived signed URL grant for one artifact: valid as long as a rollout waits for the device."""
        return issue_grant(self.key, sha256, device, time.time() + max(MIN_GRANT_S, 2 * (device_timeout_s or 0)))

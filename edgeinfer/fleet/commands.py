"""Commands to devices: each one signed with the fleet key for its device only, recorded, spooled, sent by the link.

Agents refuse unsigned state-changing commands, and a signed one cannot be replayed on another device
or later: it expires with its manifest (``deploy``) or :data:`~edgeinfer.updates.signing.COMMAND_TTL_S`
from now. A deploy command carries a short-lived download grant for its artifact (``auth.issue_grant``),
so a device without an enrolled credential can still fetch it.

Every command is recorded before it is spooled (``commands`` table: its device, word, a summary of its
arguments without secrets, who sent it, its expiry), and the device's answer gives it its verdict as ingest
stores it: applied, refused with the device's reason, or expired unanswered (``verdicts.py``). The API reads the
records through :meth:`CommandService.get` and :meth:`CommandService.of_device`.
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
from .verdicts import record, summary_of

#: a download grant lives as long as a rollout waits for its device, and an hour at least
MIN_GRANT_S = 3600.0
#: who sent a command the manager sends of its own accord (a rollout's, the live view's), unless told
MANAGER = "fleet manager"


class CommandService:
    """Signs and queues commands (QoS 1, in ``spool``); the MQTT link drains the spool to the broker."""

    def __init__(self, db: FleetDB, key: SigningKey, spool: Spool) -> None:
        self.db = db
        self.key = key
        self.spool = spool
        #: the link that sends what is spooled: told at once when there is something new (it also polls)
        self.link: MqttLink | None = None

    def send(self, device: str, cmd: Command, args: dict[str, Any], *, command_id: str | None = None,
             sent_by: str = MANAGER, ttl_s: float = COMMAND_TTL_S) -> str:
        """Queue ``cmd`` for ``device``, signed for it, and record it (``sent_by``: a token's name, or the part of
        the manager that sends it); the command's id. It expires with a deploy's manifest, else ``ttl_s`` from now.
        LookupError for an unknown device."""
        found = self.db.get_device(device)
        if found is None:
            raise LookupError(f"no device {device}")
        command_id = command_id or uuid.uuid4().hex
        manifest = args.get("manifest") if cmd == Command.DEPLOY else None
        expires = manifest.get("expires_at") if isinstance(manifest, dict) else None
        if not isinstance(expires, (int, float)) or isinstance(expires, bool):
            expires = time.time() + ttl_s
        if isinstance(manifest, dict) and "grant" not in args and isinstance(manifest.get("sha256"), str):
            args = {**args, "grant": self.grant(manifest["sha256"], device)}
        message = sign_command(self.key, make_command(command_id, Command(cmd).value, args), device_id=device,
                               expires=expires)
        pipeline = args.get("pipeline")
        self.db.commands.record({  # before the spool: the device's answer always finds its command
            "command_id": command_id, "device_id": device, "cmd": Command(cmd).value,
            "pipeline": pipeline[:64] if isinstance(pipeline, str) else None, "summary": summary_of(args),
            "sent_by": sent_by[:128], "expires_at": float(expires)})
        self.spool.append(Topics(found["fleet"], device).cmd, encode(message))
        if self.link is not None:
            self.link.notify()
        return command_id

    # ------------------------------------------------------------------------------------- reads
    def get(self, command_id: str) -> dict | None:
        """A command's record (``verdicts.record``: its state now, a capture's outcome, the verdict in words)."""
        row = self.db.commands.get(command_id)
        return record(row, time.time()) if row is not None else None

    def of_device(self, device: str, *, cmd: str | None = None, pipeline: str | None = None,
                  limit: int = 100) -> list[dict]:
        """A device's command records, newest first (of one word, one pipeline)."""
        now = time.time()
        return [record(row, now) for row in self.db.commands.of_device(device, cmd=cmd, pipeline=pipeline,
                                                                        limit=limit)]

    def grant(self, sha256: str, device: str, device_timeout_s: float | None = None) -> str:
        """A short-lived signed URL grant for one artifact: valid as long as a rollout waits for the device."""
        return issue_grant(self.key, sha256, device, time.time() + max(MIN_GRANT_S, 2 * (device_timeout_s or 0)))

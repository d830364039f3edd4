"""Logs and diagnosis from afar, the fleet's side: a device's recent log lines and its doctor's report, asked for
by an operator, sent by the device, stored so that any manager behind a load balancer serves them.

A request sends the device a signed command — ``logs`` (the lines after the newest one stored of its current
boot) or ``doctor`` — with the URL it POSTs its answer to (``/api/devices/<id>/logs``, ``.../doctor/report``),
with its own credential. Requests are claimed in the database (``db/diagnosis.py``), so however many arrive, from
however many managers, a device gets at most one ``logs`` command every :data:`MIN_RESEND_S` (one every
:data:`RENEW_S` while someone follows) and one ``doctor`` every :data:`DOCTOR_RESEND_S`. A follower's every read
(``follow=true``) keeps the lines coming: the manager renews the command, moving ``until`` :data:`WATCH_S` on,
while someone reads; the device stops by itself that long after the last one. A device the fleet knows to be
offline is not sent anything: the answer says since when it is offline, with the lines received before.

What arrives is redacted again (:func:`~.._redact.redact`: the device's own function) before it is stored.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping
from typing import Any
from urllib.parse import quote

from .._redact import redact, redact_values
from ..link.logs import LEVELS
from ..link.vocabulary import Command, EventKind
from .commands import CommandService
from .db import FleetDB

#: a follower keeps the device sending this long after its last read; the command is renewed this often
WATCH_S = 30.0
RENEW_S = 10.0
#: a device gets at most one logs request this often (one doctor request)
MIN_RESEND_S = 2.0
DOCTOR_RESEND_S = 5.0
LEVEL_NAMES = {number: name for name, number in LEVELS.items()}


def printable(text: str) -> str:
    """Text any database keeps: no NUL (PostgreSQL refuses it), no lone surrogate (not UTF-8)."""
    return text.replace("\x00", "\ufffd").encode("utf-8", "replace").decode("utf-8")


class DiagnosisService:
    """Asks devices for their logs and their doctor's report, stores what they send, reads it back."""

    def __init__(self, db: FleetDB, commands: CommandService, public_url: Callable[[], str]) -> None:
        self.db = db
        self.rows = db.diagnosis
        self.commands = commands
        self.public_url = public_url

    def _device(self, device_id: str) -> dict:
        device = self.db.get_device(device_id)
        if device is None:
            raise LookupError(f"no device {device_id}")
        return device

    def _url(self, device_id: str, tail: str) -> str:
        return f"{self.public_url().rstrip('/')}/api/devices/{quote(device_id, safe='')}/{tail}"

    def _refusal(self, device_id: str, command_id: str | None) -> str | None:
        """What the device said when it refused ``command_id`` (an agent that does not know the command, a bad
        signature…), if it did."""
        if not command_id:
            return None
        for event in self.db.list_events(device_id=device_id, kind=EventKind.CMD_REJECTED.value, limit=20):
            if event.get("cmd_id") == command_id:
                data = event.get("data") or {}
                return str(data.get("reason") or "refused") + (f": {data['error']}" if data.get("error") else "")
        return None

    # -- logs ---------------------------------------------------------------------------------------
    def request_logs(self, device_id: str, *, follow: bool = False, now: float | None = None) -> dict[str, Any]:
        """Ask the device for its lines (``follow``: and for new ones while someone reads), unless one was asked
        very lately; where the request stands. LookupError: no such device."""
        device, now = self._device(device_id), time.time() if now is None else now
        sent = False
        if device["online"]:
            state = self.rows.state(device_id) or {}
            following = (state.get("follow_until") or 0.0) > now
            gap = (RENEW_S if following else 0.0) if follow else MIN_RESEND_S
            if self.rows.claim(device_id, "logs", now, gap):
                boot_id = str((device.get("state") or {}).get("boot_id") or "")
                args: dict[str, Any] = {"url": self._url(device_id, "logs")}
                if boot_id:
                    args.update(boot_id=boot_id, after=self.rows.newest_seq(device_id, boot_id))
                until = round(now + WATCH_S, 3) if follow else None
                if until is not None:
                    args["until"] = until
                command_id = self.commands.send(device_id, Command.LOGS, args)
                self.rows.sent(device_id, "logs", command_id, follow_until=until)
                sent = True
        return {**self._presence(device), **self._logs_state(device_id), "sent": sent}

    def receive_logs(self, device_id: str, upload: Mapping[str, Any]) -> int:
        """A device's upload (validated: boot_id, lines, dropped, complete): its lines stored, redacted; how many
        were new. LookupError: no such device."""
        self._device(device_id)
        lines = [{"seq": line["seq"], "ts": line["ts"], "level": LEVELS[line["level"]],
                  "logger": printable(redact(line["logger"])), "message": printable(redact(line["message"]))}
                 for line in upload["lines"]]
        return self.rows.add(device_id, upload["boot_id"], lines, dropped=int(upload.get("dropped") or 0),
                             complete=bool(upload.get("complete", True)))

    def logs(self, device_id: str, *, since: float | None = None, after: int | None = None,
             level: str | None = None, limit: int = 1000, follow: bool = False) -> dict[str, Any]:
        """The device's stored lines (oldest first) and where its logs stand; ``follow`` renews the request.
        LookupError: no such device."""
        device = self._device(device_id)
        if follow:
            self.request_logs(device_id, follow=True)
            device = self._device(device_id)
        rows = self.rows.lines(device_id, since=since, after=after, min_level=LEVELS.get(level or "", 0),
                               limit=limit)
        lines = [{**row, "level": LEVEL_NAMES.get(row["level"], "info")} for row in rows]
        return {**self._presence(device), **self._logs_state(device_id), "lines": lines,
                "next": lines[-1]["id"] if lines else (after or 0)}

    def _logs_state(self, device_id: str) -> dict[str, Any]:
        state = self.rows.state(device_id) or {}
        return {"requested_at": state.get("logs_requested_at"), "command_id": state.get("logs_command_id"),
                "received_at": state.get("logs_received_at"), "complete": state.get("logs_complete"),
                "dropped": state.get("logs_dropped") or 0, "follow_until": state.get("follow_until"),
                "refused": self._refusal(device_id, state.get("logs_command_id"))}

    # -- doctor -------------------------------------------------------------------------------------
    def request_doctor(self, device_id: str, *, now: float | None = None) -> dict[str, Any]:
        """Ask the device to run its doctor, unless it was asked very lately; where the request stands."""
        device, now = self._device(device_id), time.time() if now is None else now
        sent = False
        if device["online"] and self.rows.claim(device_id, "doctor", now, DOCTOR_RESEND_S):
            command_id = self.commands.send(device_id, Command.DOCTOR, {"url": self._url(device_id, "doctor/report")})
            self.rows.sent(device_id, "doctor", command_id)
            sent = True
        return {**self.doctor(device_id), "sent": sent}

    def receive_doctor(self, device_id: str, result: Mapping[str, Any]) -> None:
        """A device's doctor result (validated), redacted and kept as its last. LookupError: no such device."""
        self._device(device_id)
        self.rows.put_doctor(device_id, printable(json.dumps(redact_values(dict(result)))), time.time())

    def doctor(self, device_id: str) -> dict[str, Any]:
        """The device's last doctor request and result. LookupError: no such device."""
        device = self._device(device_id)
        state = self.rows.state(device_id) or {}
        result = json.loads(state["doctor_result"]) if state.get("doctor_result") else {}
        return {**self._presence(device), "requested_at": state.get("doctor_requested_at"),
                "command_id": state.get("doctor_command_id"), "received_at": state.get("doctor_received_at"),
                "refused": self._refusal(device_id, state.get("doctor_command_id")),
                "exit_code": result.get("exit_code"), "duration_s": result.get("duration_s"),
                "ran_at": result.get("ran_at"), "report": result.get("report"), "error": result.get("error"),
                "answered_command_id": result.get("command_id")}

    @staticmethod
    def _presence(device: Mapping[str, Any]) -> dict[str, Any]:
        return {"device_id": device["device_id"], "online": bool(device["online"]), "last_seen": device["last_seen"]}

    def prune(self, before: float) -> int:
        return self.rows.prune(before)

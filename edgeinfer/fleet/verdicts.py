"""What a device did with a command, in the fleet's words — one mechanism for every command the manager sends.

:class:`~.commands.CommandService` records each command it sends (the ``commands`` table, ``db/commands.py``:
its device, its word, a small summary of its arguments — never a secret —, who sent it, when, until when the
device may run it). The device answers each one on its events topic with ``cmd_result`` (it ran it: **applied**,
with its result) or ``cmd_rejected`` (it did not: **refused**, with its reason code and its words); ingest stores
that answer with the event, in the same transaction. A command the device has not answered reads as **sent**
until its expiry has passed, then as **expired**.

States move forward only, and a device's first answer is its verdict: ``sent`` → ``expired`` (no answer by the
expiry) → ``applied`` | ``refused``. An expired command can still get its verdict: a device that ran it in time
and was offline since sends its answer late, and one that receives it after its expiry refuses it (``expired``).
An answer for a command that has its verdict already (a QoS 1 redelivery, a replay answered ``duplicate``)
changes nothing.

Pure functions of the events and rows: ingest (``db/writes.py``), the API, the live updates, the deployments
and the CLI read a device's answer and say a record in words through these, and nowhere else.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Any

from ..link.vocabulary import Command, EventKind


class CommandState(str, Enum):
    """Where a command stands (``commands.state``; ``expired`` is read from ``expires_at``, never stored)."""

    #: queued for the device; no answer yet
    SENT = "sent"
    #: the device ran it (``cmd_result``; its result says what came of it)
    APPLIED = "applied"
    #: the device did not run it (``cmd_rejected``: its reason code and its words)
    REFUSED = "refused"
    #: past its expiry with no answer: the device will not run it any more
    EXPIRED = "expired"

    def __str__(self) -> str:
        return str(self.value)


#: the longest reason code and message kept of a device's answer
MAX_REASON = 64
MAX_MESSAGE = 1000
#: what an argument's name must not contain to be kept in a command's summary: credentials never are
SECRET_WORDS = ("grant", "signature", "password", "secret", "token", "credential")
#: the longest text argument kept in a summary, and the most names of a mapping (a pipeline's lines: their names)
MAX_SUMMARY_TEXT = 256
MAX_SUMMARY_NAMES = 64
#: how a device's message starts before its words: "command <id> (<cmd>) failed: ", "command rejected (<reason>): "
_PREFIXES = re.compile(r"\A(?:command \S+ \([^)]*\)(?: failed)?: )?(?:(?:command|update) rejected \([^)]*\)(?:: )?)?")


@dataclass(frozen=True)
class Answer:
    """A device's answer to one command: applied (with its result) or refused (with its reason and words)."""

    command_id: str
    state: CommandState
    reason: str | None = None
    message: str | None = None
    result: Any = None


def _clean(text: Any, limit: int) -> str | None:
    """A device's text as a column keeps it: a string without NUL (PostgreSQL keeps none), at most ``limit``."""
    if text is None:
        return None
    return str(text).replace("\x00", "")[:limit] or None


def device_words(reason: Any, *texts: Any) -> str | None:
    """What the device said of a refusal, in its words: the first of ``texts`` given, without the prefix that
    repeats the command's id or the reason code (``command rejected (outside_frame): ``)."""
    for text in texts:
        if isinstance(text, str) and text.strip():
            words = _PREFIXES.sub("", text.strip(), count=1).strip()
            if words and words != reason:
                return _clean(words, MAX_MESSAGE)
    return None


def reason_with_words(reason: str | None, words: str | None) -> str:
    """``REASON — words`` (either alone when the other is missing): how a refusal is said everywhere."""
    parts = [part for part in (reason, words) if part]
    return " — ".join(parts) if parts else "no reason given"


def refusal_of(event: Mapping[str, Any]) -> tuple[str | None, str | None]:
    """(reason code, the device's words) of a ``cmd_rejected`` event or a failed ``update``."""
    data = event.get("data") if isinstance(event.get("data"), Mapping) else {}
    reason = _clean(data.get("reason"), MAX_REASON)
    return reason, device_words(reason, data.get("detail"), data.get("error"), event.get("message"))


def answer_of(event: Mapping[str, Any]) -> Answer | None:
    """The answer a ``cmd_result`` or ``cmd_rejected`` event gives (None: not an answer, or one that says nothing
    yet — a repeat of a command still running answers ``duplicate`` without an outcome)."""
    command_id = event.get("cmd_id")
    if not isinstance(command_id, str) or not command_id:
        return None
    data = event.get("data") if isinstance(event.get("data"), Mapping) else {}
    kind = event.get("event")
    if kind == EventKind.CMD_REJECTED:
        reason, words = refusal_of(event)
        return Answer(command_id, CommandState.REFUSED, reason, words)
    if kind != EventKind.CMD_RESULT:
        return None
    outcome = data.get("outcome") if data.get("duplicate") else data
    if not isinstance(outcome, Mapping):
        return None
    if outcome.get("ok") is False:
        reason = _clean(outcome.get("reason"), MAX_REASON)
        return Answer(command_id, CommandState.REFUSED, reason, device_words(reason, outcome.get("error")))
    return Answer(command_id, CommandState.APPLIED, result=outcome.get("result"))


def summary_of(args: Mapping[str, Any]) -> dict[str, Any]:
    """A command's arguments as its record keeps them: small, and never a secret — plain values (text cut short),
    a mapping's names, a list's length, a manifest's deployment, model and version; no argument whose name says
    it is a credential (a download grant, a signature, a password)."""
    summary: dict[str, Any] = {}
    for key, value in args.items():
        if any(word in key.lower() for word in SECRET_WORDS):
            continue
        if key == "manifest" and isinstance(value, Mapping):
            summary[key] = {k: value[k] for k in ("deployment_id", "model_name", "version") if k in value}
        elif isinstance(value, str):
            summary[key] = value[:MAX_SUMMARY_TEXT]
        elif value is None or isinstance(value, (bool, int, float)):
            summary[key] = value
        elif isinstance(value, Mapping):
            summary[key] = sorted(str(name) for name in value)[:MAX_SUMMARY_NAMES]
        elif isinstance(value, (list, tuple)):
            summary[key] = len(value)
    return summary


def state_of(row: Mapping[str, Any], now: float) -> CommandState:
    """A stored command's state now: ``sent`` past its expiry reads ``expired``."""
    state = CommandState(row["state"])
    if state == CommandState.SENT and row.get("expires_at") is not None and row["expires_at"] < now:
        return CommandState.EXPIRED
    return state


def _plural(count: int, word: str) -> str:
    return f"{count} {word}{'' if count == 1 else 's'}"


def capture_outcome(row: Mapping[str, Any]) -> dict[str, int] | None:
    """A capture's outcome: the frames the device took it on to keep (``requested``: frames × its streams), and of
    those uploaded the ones the manager ``stored`` and the ``duplicates`` it dropped as near-duplicates of stored
    samples. None for another command."""
    if row.get("cmd") != Command.CAPTURE:
        return None
    summary, result = row.get("summary") or {}, row.get("result")
    frames = result.get("frames") if isinstance(result, Mapping) else None
    streams = result.get("streams") if isinstance(result, Mapping) else None
    if not isinstance(frames, int) or isinstance(frames, bool):
        frames = summary.get("frames") if isinstance(summary.get("frames"), int) else 0
    count = len(streams) if isinstance(streams, list) and streams else 1
    return {"requested": int(frames) * count, "stored": int(row.get("samples_stored") or 0),
            "duplicates": int(row.get("samples_duplicates") or 0)}


def capture_text(samples: Mapping[str, int]) -> str:
    """``5 frames captured: 0 stored, 5 near-duplicates of stored samples`` (so far, while frames are missing)."""
    requested, stored, duplicates = samples["requested"], samples["stored"], samples["duplicates"]
    received = stored + duplicates
    counts = f"{stored} stored, {_plural(duplicates, 'near-duplicate')} of stored samples"
    if received >= requested:
        return f"{_plural(received, 'frame')} captured: {counts}"
    return f"{received} of {_plural(requested, 'frame')} captured so far: {counts}"


def settled(state: CommandState, samples: Mapping[str, int] | None) -> bool:
    """Nothing more is to come: refused or expired, or applied with every frame of a capture uploaded."""
    if state in (CommandState.REFUSED, CommandState.EXPIRED):
        return True
    if state == CommandState.APPLIED:
        return samples is None or samples["stored"] + samples["duplicates"] >= samples["requested"]
    return False


def verdict_text(state: CommandState, row: Mapping[str, Any], samples: Mapping[str, int] | None) -> str:
    """The record in words, the same in the CLI and the dashboard: ``waiting for the device``, ``applied (revision
    3)``, ``applied: failed (sha256_mismatch)`` (what a deploy came to), ``refused by the device: outside_frame —
    …``, ``expired …``, a capture's counts."""
    if state == CommandState.SENT:
        return "waiting for the device"
    if state == CommandState.EXPIRED:
        return "expired: the device did not answer before the command expired"
    if state == CommandState.REFUSED:
        return f"refused by the device: {reason_with_words(row.get('reason'), row.get('message'))}"
    if samples is not None:
        return capture_text(samples)
    result, revision = row.get("result"), (row.get("summary") or {}).get("revision")
    if isinstance(result, Mapping) and isinstance(result.get("state"), str):  # a deploy's or rollback's outcome
        reason = result.get("reason")
        return f"applied: {result['state']}" + (f" ({reason})" if isinstance(reason, str) else "")
    return f"applied (revision {revision})" if isinstance(revision, int) else "applied"


def record(row: Mapping[str, Any], now: float) -> dict[str, Any]:
    """A stored command as the API answers it: its row, its state now, a capture's outcome, the verdict in words,
    and whether it has settled."""
    state = state_of(row, now)
    samples = capture_outcome(row)
    found = {key: value for key, value in row.items() if key not in ("samples_stored", "samples_duplicates")}
    return {**found, "state": state.value, "samples": samples, "text": verdict_text(state, row, samples),
            "settled": settled(state, samples)}

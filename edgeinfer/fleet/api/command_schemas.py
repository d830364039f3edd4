"""The answers that say what a device did with a command (``fleet/verdicts.py``): a command's record, a capture's
outcome, and a pipeline's lines and zones as last sent, as the device applied them, and its last refusal. Beside
the routers that answer them (``api/commands.py``, ``api/live.py``); like every answer of ``schemas.py``, a model
names the fields a client can rely on."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field

from ..schemas import JsonObject, Row
from ..verdicts import CommandState


class CaptureSamples(BaseModel):
    """What came of a capture: the frames the device took on to keep (frames × streams), and of those uploaded,
    how many the manager stored and how many it dropped as near-duplicates of stored samples."""

    requested: int
    stored: int
    duplicates: int


class CommandRecord(Row):
    """A command the manager sent and where it stands: ``sent`` (no answer yet), ``applied`` (the device ran it:
    ``result``), ``refused`` (the device did not: ``reason`` and its words in ``message``), ``expired`` (no answer
    before its expiry). States move forward only; the device's first answer is its verdict."""

    command_id: str
    device_id: str
    cmd: str = Field(description="the command's word (docs/protocol.md, Commands)")
    pipeline: str | None = None
    summary: JsonObject = Field(description="its arguments, small and without secrets: plain values, a mapping's "
                                            "names, a list's length")
    sent_by: str = Field(description="the API token's name, or the part of the manager that sent it")
    sent_at: float
    expires_at: float
    state: CommandState
    reason: str | None = Field(None, description="the device's reason code for a refusal")
    message: str | None = Field(None, description="the device's own words for a refusal")
    result: Any = Field(None, description="what the device answered when it ran the command")
    answered_at: float | None = None
    updated_at: float
    samples: CaptureSamples | None = Field(None, description="a capture's outcome (null for other commands)")
    text: str = Field(description="the verdict in words, as the CLI prints it and the dashboard shows it")
    settled: bool = Field(description="nothing more is to come: refused, expired, or applied (a capture: with "
                                      "every frame uploaded)")


class AnalyticsRevision(BaseModel):
    """A pipeline's lines and zones of one revision (0, and none: never), in the PUT's form, and the command that
    carried them."""

    revision: int
    lines: dict[str, list[list[float]]]
    zones: dict[str, list[list[float]]]
    command_id: str | None = None
    at: float | None = Field(None, description="when it was sent, or when the device's report of it arrived")


class AnalyticsRefusal(BaseModel):
    """The device refused a revision: its reason code and its words."""

    revision: int | None
    command_id: str
    reason: str | None
    message: str | None
    at: float | None


class Analytics(BaseModel):
    """A pipeline's lines and zones: as last ``sent`` (and that command's ``state``), as the device last
    ``applied`` them (what it counts with), and its last refusal (``refused``; null: none). Only ``applied`` is
    what the device does."""

    sent: AnalyticsRevision
    state: CommandState | None = Field(description="where the last sent revision stands (null: none sent)")
    applied: AnalyticsRevision
    refused: AnalyticsRefusal | None

"""The fleet's configuration revisions on the device: the one it runs, the one before, the one on trial, the last
refused — in one file, ``<data_dir>/configuration/state.json``, replaced whole at each step (``_fs.atomic_write_text``:
a temporary file fsynced, renamed over the old one, the folder fsynced). A reader sees the state before a step or
after it, never between.

A revision's steps (agent/configuration.py)::

    refused before anything changes:  refused = R                          (applied unchanged)
    begin_trial(R):                    trial = R                           (applied, the last good one, unchanged)
    commit():                          applied = R, previous = the one before, trial = none
    abandon(reason):                   trial = none, refused = R with the reason

A device killed in the middle of applying R finds ``trial = R`` at its next start: it comes up on ``applied`` — the
last revision judged healthy, whole (or agent.yaml alone, when none was) — and R is marked refused
(``interrupted``), because R was never judged healthy and may be what killed it; :meth:`recover` does that before
any pipeline starts, so no pipeline ever runs half of R and half of the revision before it.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from .._fs import atomic_write_text

log = logging.getLogger(__name__)

STATE_FILE = "state.json"


@dataclass(frozen=True)
class Revision:
    """One configuration revision as the fleet sent it: its number, the sha256 of the document's bytes, the
    deployment that brought it, and the document (normal form: link/config_document.py)."""

    revision: int
    sha256: str
    document: dict[str, Any] = field(repr=False)
    deployment_id: str | None = None
    at: float = 0.0

    def summary(self) -> dict[str, Any]:
        """What the state message says of it (not the document: the fleet holds it)."""
        return {"revision": self.revision, "sha256": self.sha256, "deployment_id": self.deployment_id}

    @classmethod
    def from_dict(cls, data: dict[str, Any] | None) -> Revision | None:
        if not data:
            return None
        return cls(int(data["revision"]), str(data["sha256"]), dict(data["document"]), data.get("deployment_id"),
                   float(data.get("at", 0.0)))


class ConfigurationState:
    """The revisions in ``<data_dir>/configuration/state.json`` (see the module). Not thread-safe: the configuration
    service holds it under its lock."""

    def __init__(self, data_dir: str | Path) -> None:
        self.folder = Path(data_dir) / "configuration"
        self.path = self.folder / STATE_FILE
        self.applied: Revision | None = None
        self.previous: Revision | None = None
        self.trial: Revision | None = None
        #: the last revision refused or rolled back: summary + state, reason, detail, at
        self.refused: dict[str, Any] | None = None
        self._load()

    def _load(self) -> None:
        try:
            data = json.loads(self.path.read_text())
        except FileNotFoundError:
            return
        except (OSError, ValueError) as exc:  # never a half-written file (atomic); a disk error: agent.yaml holds
            log.error("configuration state %s unreadable (%s): running agent.yaml's configuration", self.path, exc)
            return
        try:
            self.applied = Revision.from_dict(data.get("applied"))
            self.previous = Revision.from_dict(data.get("previous"))
            self.trial = Revision.from_dict(data.get("trial"))
            self.refused = data.get("refused")
        except (KeyError, TypeError, ValueError) as exc:
            log.error("configuration state %s malformed (%s): running agent.yaml's configuration", self.path, exc)
            self.applied = self.previous = self.trial = None

    def _save(self) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        data = {"applied": _dict(self.applied), "previous": _dict(self.previous), "trial": _dict(self.trial),
                "refused": self.refused}
        atomic_write_text(self.path, json.dumps(data, sort_keys=True))

    # -- the steps -------------------------------------------------------------------------------------
    def recover(self) -> Revision | None:
        """At start, before any pipeline: a revision left on trial by an agent that did not finish applying it is
        refused (``interrupted``), and the device comes up on :attr:`applied`. The revision recovered from, or None."""
        trial = self.trial
        if trial is None:
            return None
        self.trial = None
        self.refused = _refusal(trial, "rolled_back", "interrupted",
                                "the agent stopped while applying it; it came back on the last good revision")
        self._save()
        return trial

    def refuse(self, revision: Revision, reason: str, detail: str) -> None:
        """``revision`` was refused before anything changed."""
        self.refused = _refusal(revision, "failed", reason, detail)
        self._save()

    def begin_trial(self, revision: Revision) -> None:
        self.trial = revision
        self._save()

    def commit(self) -> None:
        """The trial is healthy: it is the revision the device runs, the one before it what a rollback goes to."""
        assert self.trial is not None
        self.previous, self.applied, self.trial = self.applied, self.trial, None
        self._save()

    def abandon(self, reason: str, detail: str) -> None:
        """The trial failed its health gate: the device is back on :attr:`applied`."""
        assert self.trial is not None
        self.refused = _refusal(self.trial, "rolled_back", reason, detail)
        self.trial = None
        self._save()

    def step_back(self) -> None:
        """A rollback the fleet asked for: :attr:`previous` is the revision the device runs (None: agent.yaml)."""
        self.applied, self.previous = self.previous, self.applied
        self._save()


def _dict(revision: Revision | None) -> dict[str, Any] | None:
    return asdict(revision) if revision is not None else None


def _refusal(revision: Revision, state: str, reason: str, detail: str) -> dict[str, Any]:
    return {**revision.summary(), "state": state, "reason": reason, "detail": detail[:2000],
            "at": round(time.time(), 3)}

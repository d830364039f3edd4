"""The device's two model slots and the record of which model is live.

The on-disk state (``<data_dir>/models/slots.json``, replaced atomically) always names exactly one
committed model. An update is written to the inactive slot and recorded as a *trial*; only after
the health gate passes is it committed. A crash at any point leaves either the old model committed
(trial discarded at the next start) or the new one — never a mix.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import asdict, dataclass
from pathlib import Path

from ..errors import UpdateRejected
from ..util.fs import atomic_write_text, copy_atomically

log = logging.getLogger(__name__)

SLOTS = ("a", "b")
STATE_FILE = "slots.json"
SEEN_LIMIT = 500


@dataclass(frozen=True)
class InstalledModel:
    """A model in a slot."""

    slot: str
    path: str
    name: str
    version: int
    sha256: str
    deployment_id: str | None = None


class ModelSlots:
    """Two model slots under ``<data_dir>/models`` with an atomic record of which is live."""

    def __init__(self, data_dir: str | os.PathLike) -> None:
        self.root = Path(data_dir) / "models"
        self.root.mkdir(parents=True, exist_ok=True)
        self._state_path = self.root / STATE_FILE
        self._state = self._load()
        if self._state.get("trial"):  # a crash during an update: the committed model stands
            log.warning("discarding unfinished update trial %s", self._state["trial"])
            self._state["trial"] = None
            self._save()

    def _load(self) -> dict:
        try:
            return json.loads(self._state_path.read_text())
        except FileNotFoundError:
            return {"active": None, "previous": None, "trial": None, "seen": []}
        except (OSError, ValueError) as exc:
            # The file is only ever replaced atomically, so this is disk damage: say so loudly.
            raise UpdateRejected("state_corrupt", f"{self._state_path} is unreadable ({exc})") from None

    def _save(self) -> None:
        atomic_write_text(self._state_path, json.dumps(self._state, indent=1))

    @staticmethod
    def _model(data: dict | None) -> InstalledModel | None:
        return InstalledModel(**data) if data else None

    @property
    def active(self) -> InstalledModel | None:
        return self._model(self._state.get("active"))

    @property
    def previous(self) -> InstalledModel | None:
        return self._model(self._state.get("previous"))

    @property
    def trial(self) -> InstalledModel | None:
        return self._model(self._state.get("trial"))

    @property
    def configured(self) -> dict | None:
        """The model the agent's config named when the slots were last reset (name, version, sha256)."""
        return self._state.get("configured")

    def reset_to(self, source: str | os.PathLike, *, name: str, version: int, sha256: str) -> InstalledModel:
        """Make the configured model the committed baseline (first start, or the config changed)."""
        self._state.update(active=None, previous=None, trial=None,
                           configured={"path": str(source), "name": name, "version": version, "sha256": sha256})
        self._save()
        return self.install_initial(source, name=name, version=version, sha256=sha256)

    def seen(self, deployment_id: str) -> bool:
        return deployment_id in self._state.get("seen", [])

    def remember(self, deployment_id: str) -> None:
        seen = [d for d in self._state.get("seen", []) if d != deployment_id] + [deployment_id]
        self._state["seen"] = seen[-SEEN_LIMIT:]
        self._save()

    def inactive_slot(self) -> str:
        active = self.active
        return "b" if active is not None and active.slot == "a" else "a"

    def slot_dir(self, slot: str) -> Path:
        path = self.root / slot
        path.mkdir(parents=True, exist_ok=True)
        return path

    def install_initial(self, source: str | os.PathLike, *, name: str, version: int, sha256: str) -> InstalledModel:
        """Record the model the device starts with (copied into slot a) when no state exists yet."""
        if self.active is not None:
            return self.active
        target = self.slot_dir("a") / Path(source).name
        if Path(source).resolve() != target.resolve():
            copy_atomically(source, target)
        self._state["active"] = asdict(InstalledModel("a", str(target), name, version, sha256))
        self._save()
        return self.active

    def begin_trial(self, model: InstalledModel) -> None:
        self._state["trial"] = asdict(model)
        self._save()

    def commit(self) -> InstalledModel:
        """The trial becomes active; the old active becomes the rollback target."""
        trial = self._state.get("trial")
        if not trial:
            raise UpdateRejected("no_trial", "nothing to commit")
        self._state.update(previous=self._state.get("active"), active=trial, trial=None)
        self._save()
        return self.active

    def abandon_trial(self) -> None:
        self._state["trial"] = None
        self._save()

    def roll_back(self) -> InstalledModel:
        """Make the previous model active again (an explicit rollback command)."""
        previous = self._state.get("previous")
        if not previous:
            raise UpdateRejected("no_previous", "there is no previous model to roll back to")
        self._state.update(active=previous, previous=self._state.get("active"), trial=None)
        self._save()
        return self.active

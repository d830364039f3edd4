"""Applying a model update on the device: verify, download, validate in a subprocess, A/B slots.

The on-disk state (``<data_dir>/models/slots.json``, replaced atomically) always names exactly one
committed model. An update is written to the inactive slot and recorded as a *trial*; only after
the health gate passes is it committed. A crash at any point leaves either the old model committed
(trial discarded at the next start) or the new one — never a mix.

    verify signature + expiry ─► refuse replay / downgrade ─► download (resume, sha256) into the
    inactive slot ─► validate in a subprocess (timeout) ─► begin_trial ─► [agent swaps the engine,
    runs the health gate] ─► commit  |  rollback
"""

from __future__ import annotations

import json
import logging
import math
import os
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from .._fs import atomic_write_text, copy_atomically
from ..errors import UpdateRejected
from .download import download
from .signing import Manifest, VerifyKey

log = logging.getLogger(__name__)

SLOTS = ("a", "b")
STATE_FILE = "slots.json"
SEEN_LIMIT = 500
DEFAULT_VALIDATE_TIMEOUT_S = 60.0


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


class HealthGate:
    """Decides after ``frames`` results whether a new model is healthy: finite outputs, sane latency."""

    def __init__(self, *, frames: int = 20, baseline_infer_ms: float | None = None, max_factor: float = 3.0) -> None:
        self.frames = frames
        self.baseline = baseline_infer_ms
        self.max_factor = max_factor
        self._latencies: list[float] = []
        self.reason: str | None = None

    def observe(self, infer_ms: float, finite: bool) -> bool | None:
        """Feed one frame; None while undecided, then True (healthy) or False (see ``reason``)."""
        if not finite:
            self.reason = "non_finite_output"
            return False
        self._latencies.append(infer_ms)
        if len(self._latencies) < self.frames:
            return None
        median = sorted(self._latencies)[len(self._latencies) // 2]
        if self.baseline and median > self.baseline * self.max_factor:
            self.reason = f"latency_regression: median {median:.1f} ms > {self.max_factor}x {self.baseline:.1f} ms"
            return False
        return True


def result_is_finite(value) -> bool:
    """True when no float inside a task result (scores, boxes, keypoints) is NaN or infinite."""
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, dict):
        return all(result_is_finite(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return all(result_is_finite(v) for v in value)
    to_dict = getattr(value, "to_dict", None)
    if callable(to_dict):
        return result_is_finite(to_dict())
    return True


def validate_in_subprocess(model: str | os.PathLike, *, delegate: str | None = None,
                           timeout_s: float = DEFAULT_VALIDATE_TIMEOUT_S, interpreter: str | None = None) -> dict:
    """Load ``model`` and run one input in a separate Python process; UpdateRejected unless it works.

    A model that crashes the runtime (segfault) or hangs it only takes the child down.
    ``interpreter`` defaults to this Python (another venv's python may be given).
    """
    command = [interpreter or sys.executable, "-m", "edgeinfer.validate_model", str(model)]
    if delegate:
        command += ["--delegate", delegate]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        raise UpdateRejected("validation_timeout", f"the model did not load and run within {timeout_s:.0f} s") from None
    lines = done.stdout.strip().splitlines()
    try:
        report = json.loads(lines[-1]) if lines else {}
    except ValueError:
        report = {}
    if done.returncode != 0 or not report.get("ok"):
        detail = report.get("error") or (done.stderr.strip().splitlines() or [f"exit code {done.returncode}"])[-1]
        if done.returncode < 0:
            detail = f"the runtime crashed (signal {-done.returncode})"
        raise UpdateRejected("validation_failed", detail)
    return report


class Updater:
    """The agent's update steps up to the trial; the agent swaps the engine and runs the gate."""

    def __init__(self, slots: ModelSlots, verify_key: VerifyKey, *, delegate: str | None = None,
                 validate_timeout_s: float = DEFAULT_VALIDATE_TIMEOUT_S) -> None:
        self.slots = slots
        self.verify_key = verify_key
        self.delegate = delegate
        self.validate_timeout_s = validate_timeout_s

    def check(self, manifest_data: dict, signature: str) -> Manifest:
        """Signature, expiry, replay and downgrade checks; raises UpdateRejected with its reason."""
        manifest = self.verify_key.verify(manifest_data, signature)
        if self.slots.seen(manifest.deployment_id):
            raise UpdateRejected("replay", f"deployment {manifest.deployment_id} was already handled")
        active = self.slots.active
        if active is not None and not manifest.rollback and manifest.version <= active.version:
            raise UpdateRejected("downgrade", f"version {manifest.version} is not newer than the running "
                                              f"{active.version} (send a rollback to go back)")
        return manifest

    def stage(self, manifest: Manifest, progress: Callable[[int], None] | None = None) -> InstalledModel:
        """Download into the inactive slot and validate there; returns the staged model."""
        staged = self.download(manifest, progress)
        self.validate(staged)
        return staged

    def validate(self, staged: InstalledModel) -> None:
        """Load and run the staged model in a subprocess (UpdateRejected if it fails, crashes or hangs)."""
        started = time.perf_counter()
        validate_in_subprocess(staged.path, delegate=self.delegate, timeout_s=self.validate_timeout_s)
        log.info("validated %s in %.1f s", staged.path, time.perf_counter() - started)

    def download(self, manifest: Manifest, progress: Callable[[int], None] | None = None) -> InstalledModel:
        """Fetch the artifact into the inactive slot (resuming a partial file) and verify it."""
        slot = self.slots.inactive_slot()
        folder = self.slots.slot_dir(slot)
        target = folder / _file_name(manifest)
        partial = target.with_name(target.name + ".part")
        for stale in folder.iterdir():  # the inactive slot holds only the model being staged
            if stale != partial:
                stale.unlink()
        download(manifest.url, target, sha256=manifest.sha256, size=manifest.size, progress=progress)
        return InstalledModel(slot, str(target), manifest.model_name, manifest.version, manifest.sha256,
                              manifest.deployment_id)


def _file_name(manifest: Manifest) -> str:
    """The artifact's name in its slot: the manifest's model name when it is a plain file name.

    The name is only a label (the sha256 is what is trusted); runtimes such as OpenVINO pick a
    reader by suffix, so it is kept.
    """
    name = Path(manifest.model_name).name
    if name and name == manifest.model_name and not name.startswith(".") and len(name) <= 200:
        return name
    return manifest.sha256

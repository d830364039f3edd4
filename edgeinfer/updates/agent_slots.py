"""The agent's two environment slots, as the agent sees them: an agent bundle installed into the slot it does
not run from, handed to the launcher as a trial, committed once healthy; what the launcher decided, read back.

The slots' state and its rules are edgeinfer/updates/launcher.py's (the launcher must run without edgeinfer);
this module is the agent's side of them. An install, in the order a failure stops it::

    unpack the verified bundle (bad_bundle) ─► a venv in <root>/slots/<other> from this interpreter's base, with
    --system-site-packages when this slot has it, and this slot's edgeinfer-*.pth files (the system TensorRT or
    OpenVINO bindings the setup scripts linked) ─► pip install --no-index of every wheel of the bundle, with the
    bundle's pip if it has one, else this slot's pip (install_failed, no_pip) ─► ``python -m edgeinfer --version``
    in the new slot names the bundle's version (validation_failed)

Nothing in the running slot changes; the launcher starts the new one only once the agent asks for it.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import shutil
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..errors import UpdateRejected
from . import launcher
from .bundle import Bundle, unpack, version_number

log = logging.getLogger(__name__)

#: the folder of the slots' environments and of downloads, under the launcher's root
SLOTS_DIR = "slots"
INCOMING_DIR = "incoming"
#: path files a provisioning script put in a slot's site-packages (the system TensorRT, OpenVINO): a new slot
#: gets them too
CARRIED_PTH = "edgeinfer-*.pth"
#: bounds on the install's steps (a Pi installs numpy and OpenCV from wheels in a minute or two)
VENV_TIMEOUT_S = 300.0
INSTALL_TIMEOUT_S = 1800.0
CHECK_TIMEOUT_S = 120.0


class AgentSlots:
    """The launcher's slots from inside the agent of slot ``slot`` (on trial ``trial_id``, if it is one)."""

    def __init__(self, root: str | os.PathLike, slot: str, trial_id: str | None = None) -> None:
        self.root = Path(root)
        self.slot = slot
        self.trial_id = trial_id

    @classmethod
    def from_environment(cls, environ: Mapping[str, str] | None = None) -> AgentSlots | None:
        """The slots of the launcher that started this agent; None when no launcher did (then the agent cannot
        update itself)."""
        env = os.environ if environ is None else environ
        root, slot = env.get(launcher.ROOT_ENV), env.get(launcher.SLOT_ENV)
        if not root or slot not in launcher.SLOT_NAMES:
            return None
        return cls(root, slot, env.get(launcher.TRIAL_ENV) or None)

    # -- what runs ---------------------------------------------------------------------------------------
    def state(self) -> dict[str, Any]:
        return launcher.read_state(self.root)

    def record(self, slot: str | None = None) -> dict[str, Any] | None:
        return self.state()["slots"].get(slot or self.slot)

    def on_trial(self) -> bool:
        """This agent is a trial its launcher has not seen committed."""
        trial = self.state().get("trial")
        return bool(self.trial_id) and bool(trial) and trial.get("id") == self.trial_id

    def running_version(self, installed: str) -> int | None:
        """This slot's version number: the deployment's that installed it, else the installed edgeinfer's."""
        record = self.record() or {}
        if isinstance(record.get("number"), int):
            return record["number"]
        try:
            return version_number(installed)
        except ValueError:
            return None

    def previous(self) -> tuple[str, dict[str, Any]] | None:
        """The other slot, when it holds an environment to go back to."""
        other = launcher.other_slot(self.slot)
        record = self.record(other)
        if record and launcher.slot_python(record).exists():
            return other, record
        return None

    def note_version(self, version: str) -> None:
        launcher.note_version(self.root, self.slot, version)

    # -- an install --------------------------------------------------------------------------------------
    def incoming(self, sha256: str) -> Path:
        """Where a bundle of ``sha256`` is downloaded (resumed there after a restart)."""
        folder = self.root / INCOMING_DIR
        folder.mkdir(parents=True, exist_ok=True)
        for stale in folder.iterdir():  # another bundle's leftovers
            if not stale.name.startswith(sha256):
                shutil.rmtree(stale) if stale.is_dir() else stale.unlink()
        return folder / f"{sha256}.tar"

    def install(self, bundle_file: Path, *, sha256: str, deployment_id: str, number: int) -> tuple[str, dict, Bundle]:
        """Install the verified bundle into the other slot: (slot, its record, the bundle). UpdateRejected with
        bad_bundle, no_pip, install_failed or validation_failed; the running slot is never touched."""
        unpacked = bundle_file.with_suffix("")
        shutil.rmtree(unpacked, ignore_errors=True)
        try:
            bundle = unpack(bundle_file, unpacked)
            if bundle.number != number:
                raise UpdateRejected("bad_bundle", f"the bundle holds edgeinfer {bundle.version} (version "
                                                   f"{bundle.number}), the manifest says version {number}")
            slot = launcher.other_slot(self.slot)
            try:
                launcher.forget_slot(self.root, slot)
            except ValueError as exc:
                raise UpdateRejected("busy", str(exc)) from None
            target = self.root / SLOTS_DIR / slot
            shutil.rmtree(target, ignore_errors=True)  # under our root only: the provisioned venv is never removed
            python = self._make_venv(target)
            self._install_wheels(python, bundle)
            self._check(python, bundle.version)
        finally:
            shutil.rmtree(unpacked, ignore_errors=True)
            bundle_file.unlink(missing_ok=True)
        record = {"path": str(target), "version": bundle.version, "number": number, "sha256": sha256,
                  "deployment_id": deployment_id}
        return slot, record, bundle

    def _make_venv(self, target: Path) -> Path:
        base = getattr(sys, "_base_executable", None) or sys.executable
        command = [base, "-m", "venv", "--without-pip", str(target)]
        if _system_site_packages(Path(sys.prefix)):
            command.insert(-1, "--system-site-packages")
        _run(command, VENV_TIMEOUT_S, "install_failed", "making the new slot's venv")
        python = target / "bin" / "python"
        site = _run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                    CHECK_TIMEOUT_S, "install_failed", "finding the new slot's site-packages").strip()
        for carried in _site_packages().glob(CARRIED_PTH):
            shutil.copyfile(carried, Path(site) / carried.name)
        return python

    def _install_wheels(self, python: Path, bundle: Bundle) -> None:
        pip_wheel = bundle.pip_wheel()
        if pip_wheel is not None:  # pip runs from its own wheel, in the new slot's interpreter
            pip = [str(python), str(pip_wheel / "pip")]
        elif importlib.util.find_spec("pip") is not None:
            pip = [sys.executable, "-m", "pip", "--python", str(python)]
        else:
            raise UpdateRejected("no_pip", "this slot has no pip and the bundle holds none: put pip's wheel in "
                                           "the bundle (edgeinfer deploy --agent WHEEL --wheels DIR)")
        wheels = bundle.wheels[0].parent
        _run([*pip, "--isolated", "--disable-pip-version-check", "--no-input", "install", "--no-index",
              "--find-links", str(wheels), "--no-cache-dir", "--no-warn-script-location",
              *(str(w) for w in bundle.wheels)], INSTALL_TIMEOUT_S, "install_failed", "pip install")

    @staticmethod
    def _check(python: Path, version: str) -> None:
        out = _run([str(python), "-m", "edgeinfer", "--version"], CHECK_TIMEOUT_S, "validation_failed",
                   "the new slot's `python -m edgeinfer --version`")
        if version not in out.split():
            raise UpdateRejected("validation_failed", f"the new slot runs {out.strip()!r}, not edgeinfer {version}")

    # -- the switch --------------------------------------------------------------------------------------
    def begin_trial(self, slot: str, record: dict[str, Any] | None, **about: Any) -> str:
        """Hand ``slot`` to the launcher as the next to try (it starts it once this agent exits with
        SWITCH_EXIT_STATUS)."""
        try:
            return launcher.begin_trial(self.root, slot, record, **about)
        except ValueError as exc:
            raise UpdateRejected("busy", str(exc)) from None

    def commit(self) -> dict[str, Any] | None:
        """This agent is healthy: its slot becomes the active one (the outcome to report), unless the launcher
        ended the trial meanwhile (None)."""
        return launcher.commit_trial(self.root, self.trial_id) if self.trial_id else None

    def unreported(self) -> dict[str, Any] | None:
        outcome = self.state().get("outcome")
        return outcome if outcome and not outcome.get("reported") else None

    def mark_reported(self, outcome: dict[str, Any]) -> None:
        launcher.mark_reported(self.root, outcome["trial"])


def _site_packages() -> Path:
    import sysconfig

    return Path(sysconfig.get_paths()["purelib"])


def _system_site_packages(prefix: Path) -> bool:
    """Whether the venv at ``prefix`` sees the system's site-packages (a Pi's apt-installed picamera2)."""
    try:
        lines = (prefix / "pyvenv.cfg").read_text().splitlines()
    except OSError:
        return False
    return any(line.replace(" ", "").lower() == "include-system-site-packages=true" for line in lines)


def _run(command: list[str], timeout_s: float, reason: str, what: str) -> str:
    """Run a step of the install; its stdout, or UpdateRejected(reason) with the step and its last words."""
    log.info("agent update: %s", " ".join(command))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "PIP_"))}
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s, env=env, cwd="/")
    except subprocess.TimeoutExpired:
        raise UpdateRejected(reason, f"{what} did not finish within {timeout_s:.0f} s") from None
    except OSError as exc:
        raise UpdateRejected(reason, f"{what} did not start: {exc}") from None
    if done.returncode != 0:
        lines = [line for line in (done.stderr or done.stdout).splitlines() if line.strip()]
        raise UpdateRejected(reason, f"{what} failed (exit {done.returncode}): {lines[-1] if lines else 'no output'}")
    return done.stdout

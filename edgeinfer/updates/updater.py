"""Applying a model update on the device, up to the trial: verify, download, validate in a subprocess.

    verify signature + expiry ─► refuse replay / downgrade ─► download (resume, sha256) into the
    inactive slot ─► validate in a subprocess (timeout) ─► begin_trial ─► [agent swaps the engine,
    runs the health gate] ─► commit  |  rollback
"""

from __future__ import annotations

import logging
import time
import urllib.parse
from collections.abc import Callable
from pathlib import Path

from ..errors import UpdateRejected
from .download import basic_auth, download, https_context
from .signing import Manifest, VerifyKey
from .slots import InstalledModel, ModelSlots
from .validate import DEFAULT_VALIDATE_TIMEOUT_S, validate_in_subprocess

log = logging.getLogger(__name__)


def admit(manifest: Manifest, *, seen: bool, running_version: int | None) -> None:
    """The replay and downgrade rules, the same for every kind of deployment: a deployment id handled before is
    refused (``replay``); a version not newer than the one running of the manifest's kind (None: nothing of it
    runs) is refused (``downgrade``) unless the manifest is a rollback."""
    if seen:
        raise UpdateRejected("replay", f"deployment {manifest.deployment_id} was already handled")
    if running_version is not None and not manifest.rollback and manifest.version <= running_version:
        raise UpdateRejected("downgrade", f"version {manifest.version} is not newer than the running "
                                          f"{running_version} (send a rollback to go back)")


class Downloads:
    """How a device downloads a deployment's artifact, whatever its kind: with its credential (the device's MQTT
    user name and password, shown to the fleet manager as HTTP Basic), the fleet's CA (an https manager) and the
    command's download grant (``?grant=``)."""

    def __init__(self, *, credentials: tuple[str, str] | None = None, cafile: str | None = None,
                 grant: str | None = None, client_cert: tuple[str, str] | None = None) -> None:
        self.headers = basic_auth(*credentials) if credentials else {}
        self.context = https_context(cafile, client_cert) if cafile or client_cert else None
        self.grant = grant

    def fetch(self, manifest: Manifest, target: Path, progress: Callable[[int], None] | None = None) -> Path:
        """Download the manifest's artifact to ``target`` (resuming ``target.part``), its size and sha256 verified."""
        url = manifest.url
        if self.grant:
            url += ("&" if "?" in url else "?") + urllib.parse.urlencode({"grant": self.grant})
        return download(url, target, sha256=manifest.sha256, size=manifest.size, progress=progress,
                        headers=self.headers, context=self.context)


class Updater:
    """The agent's update steps up to the trial; the agent swaps the engine and runs the gate."""

    def __init__(self, slots: ModelSlots, verify_key: VerifyKey, *, delegate: str | None = None,
                 validate_timeout_s: float = DEFAULT_VALIDATE_TIMEOUT_S,
                 credentials: tuple[str, str] | None = None, cafile: str | None = None,
                 grant: str | None = None, client_cert: tuple[str, str] | None = None) -> None:
        """``credentials``: the device's MQTT user name and password, shown to the fleet manager (Basic)
        when downloading; ``grant``: a download grant from the deploy command (``?grant=``);
        ``cafile``: the CA that signed an https fleet manager (the fleet's CA); ``client_cert``: the device's
        certificate and key files (a device whose identity is its certificate)."""
        self.slots = slots
        self.verify_key = verify_key
        self.delegate = delegate
        self.validate_timeout_s = validate_timeout_s
        self.downloads = Downloads(credentials=credentials, cafile=cafile, grant=grant, client_cert=client_cert)

    def check(self, manifest_data: dict, signature: str) -> Manifest:
        """Signature, expiry, replay and downgrade checks; raises UpdateRejected with its reason."""
        manifest = self.verify_key.verify(manifest_data, signature)
        active = self.slots.active
        admit(manifest, seen=self.slots.seen(manifest.deployment_id),
              running_version=active.version if active is not None else None)
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
        self.downloads.fetch(manifest, target, progress)
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

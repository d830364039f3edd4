"""The fleet's own data and the model the fleet runs now, fetched from the fleet manager for an evaluation.

The manager runs no model (numpy and the runtimes are not its dependencies), so scoring runs where the CLI
runs: the manager serves the labelled samples as a COCO export (``GET /api/samples/export?labelled=true``) and
the current model as the artifact of the newest deployment that succeeded — or, where no deployment put one
there, the model the devices report running (their agent.yaml's), found in the artifact store by the sha256 they
report; both land in a folder of the caller's (a temporary one) and are evaluated there like any local dataset
and model. docs/datasets.md.
"""

from __future__ import annotations

import zipfile
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from ...errors import DatasetError, EdgeInferError
from ...fleet.rollout import DeploymentStatus
from ...link.vocabulary import TargetState
from .datasets import Dataset, read_dataset

#: the newest labelled samples an evaluation takes unless told otherwise (the export's own default)
DEFAULT_LIMIT = 1000


@dataclass(frozen=True)
class SampleSelection:
    """Which of the fleet's labelled samples (``GET /api/samples/export``'s filters; None: any)."""

    device: str | None = None
    pipeline: str | None = None
    stream: str | None = None
    model_version: str | None = None
    rule: str | None = None
    label: str | None = None
    limit: int = DEFAULT_LIMIT

    def describe(self) -> str:
        chosen = [f"{name}={value}" for name, value in asdict(self).items() if value is not None and name != "limit"]
        return ", ".join(chosen) or "all devices and pipelines"


@dataclass(frozen=True)
class ReportedModel:
    """A model devices report running in a pipeline (their ``state``'s ``pipelines[].model``): where no deployment
    that succeeded put one there, the model their agent.yaml names."""

    name: str
    sha256: str
    version: str | None
    devices: tuple[str, ...]
    #: the pipeline it runs in (the first device's name for it)
    pipeline: str = ""

    def describe(self) -> str:
        version = f" v{self.version}" if self.version else ""
        who = self.devices[0] if len(self.devices) == 1 else f"{len(self.devices)} devices"
        return f"{self.name}{version} (reported by {who}, no deployment; sha256 {self.sha256[:12]})"


@dataclass(frozen=True)
class CurrentModel:
    """The model the fleet runs now, downloaded and verified into ``path``: the artifact of ``deployment``, or the
    stored artifact of the model the devices report running (``reported``)."""

    path: Path
    deployment: dict[str, Any] | None = None
    reported: ReportedModel | None = None

    def describe(self) -> str:
        d = self.deployment
        if d is None:
            assert self.reported is not None
            return self.reported.describe()
        return f"{d['model_name']} v{d['version']} (deployment {d['deployment_id'][:12]}, sha256 {d['sha256'][:12]})"

    def summary(self) -> dict[str, Any]:
        if self.deployment is None:
            assert self.reported is not None
            reported = self.reported
            return {"source": "devices", "model_name": reported.name, "version": reported.version,
                    "sha256": reported.sha256, "devices": list(reported.devices)}
        keys = ("deployment_id", "model_name", "version", "sha256", "target", "created_at")
        return {"source": "fleet", **{key: self.deployment.get(key) for key in keys}}


def fetch_labelled(client: Any, folder: Path, selection: SampleSelection = SampleSelection()) -> Dataset:
    """The fleet's labelled samples of ``selection`` as a COCO dataset in ``folder`` (created): the ground truth is
    each sample's corrected labels, or the detections of one a person reviewed without correcting. DatasetError
    when there is none."""
    folder.mkdir(parents=True, exist_ok=True)
    archive = folder / "export.zip"
    filters = {k: v for k, v in asdict(selection).items() if v is not None}
    client.save_export("coco", archive, labelled=True, **filters)
    with zipfile.ZipFile(archive) as zipped:
        names = zipped.namelist()
        for name in names:  # the manager's own names; refuse any that would leave the folder all the same
            if PurePosixPath(name).is_absolute() or ".." in PurePosixPath(name).parts:
                raise DatasetError(f"the fleet's export names {name!r}: outside its folder")
        zipped.extractall(folder / "data")
    archive.unlink()
    if not any(name.startswith("images/") for name in names):
        raise DatasetError(f"the fleet manager at {client.url} has no labelled samples ({selection.describe()}): "
                           "import corrected labels (edgeinfer fleet dataset import) or mark samples reviewed first")
    dataset = read_dataset(folder / "data", "coco")
    dataset.source = f"the fleet's labelled samples ({selection.describe()})"
    return dataset


def current_deployment(client: Any, *, pipeline: str | None = None,
                       devices: Iterable[str] | None = None) -> dict[str, Any] | None:
    """The newest deployment that succeeded for ``pipeline`` (a deployment that named no pipeline, or a caller
    that names none, matches any: both mean the agent's first) with a device of ``devices`` active on it (None:
    any device); None when there is none."""
    wanted = None if devices is None else set(devices)
    candidates = [d for d in client.deployments() if d["status"] == DeploymentStatus.SUCCEEDED
                  and (pipeline is None or (d.get("options") or {}).get("pipeline") in (None, pipeline))]
    for deployment in sorted(candidates, key=lambda d: d["created_at"], reverse=True):
        if wanted is None:
            return deployment
        detail = client.deployment(deployment["deployment_id"]) or {}
        if any(t["device_id"] in wanted and t["state"] == TargetState.ACTIVE for t in detail.get("devices") or []):
            return deployment
    return None


def reported_models(client: Any, *, pipeline: str | None = None,
                    devices: Iterable[str] | None = None) -> list[ReportedModel]:
    """The models ``devices`` (None: every device) report running in ``pipeline`` (None: each one's first, the
    agent's updatable pipeline), one per sha256, the one the most devices run first."""
    wanted = None if devices is None else set(devices)
    found: dict[str, tuple[str, str | None, str, list[str]]] = {}
    for device in client.devices():
        if wanted is not None and device["device_id"] not in wanted:
            continue
        entries = [p for p in (device.get("state") or {}).get("pipelines") or [] if isinstance(p, dict)]
        entry = next((p for p in entries if p.get("name") == pipeline), None) if pipeline else next(iter(entries), None)
        model = (entry or {}).get("model") or {}
        sha256 = model.get("sha256")
        if entry is None or not isinstance(sha256, str) or not sha256:  # not running (yet): no model to name
            continue
        name = PurePosixPath(str(model.get("path") or sha256).replace("\\", "/")).name
        version = model.get("version")
        found.setdefault(sha256, (name, None if version is None else str(version), str(entry.get("name") or ""),
                                  []))[3].append(device["device_id"])
    models = [ReportedModel(name, sha256, version, tuple(ids), where)
              for sha256, (name, version, where, ids) in found.items()]
    return sorted(models, key=lambda m: (-len(m.devices), m.name))


def fetch_current_model(client: Any, folder: Path, *, pipeline: str | None = None,
                        devices: Iterable[str] | None = None) -> CurrentModel | None:
    """The model the fleet runs now, its artifact downloaded into ``folder`` and checked against its sha256: the
    newest deployment that succeeded there (:func:`current_deployment`), else the model the devices report running
    (:func:`reported_models`: their agent.yaml's), found in the artifact store by its sha256. None when neither
    names a model; EdgeInferError when the devices run several, or one the store does not hold (pass a file)."""
    devices = None if devices is None else list(devices)
    deployment = current_deployment(client, pipeline=pipeline, devices=devices)
    if deployment is not None:
        return CurrentModel(_download(client, folder, deployment["model_name"], deployment["sha256"]), deployment)
    reported = reported_models(client, pipeline=pipeline, devices=devices)
    if len(reported) > 1:
        where = f"pipeline {pipeline}" if pipeline else "their first pipelines"
        listed = "; ".join(m.describe() for m in reported)
        raise EdgeInferError(f"no deployment succeeded there, and the devices run {len(reported)} different models in "
                             f"{where} ({listed}): choose the devices (--device) or pass --baseline FILE")
    if not reported:
        return None
    model = reported[0]
    if not client.has_artifact(model.sha256):
        where = f"pipeline {pipeline or model.pipeline}"
        who = f"{model.devices[0]} runs" if len(model.devices) == 1 else f"{len(model.devices)} devices run"
        raise EdgeInferError(
            f"{who} {model.name} (sha256 {model.sha256}) in {where}, from agent.yaml (no deployment that succeeded "
            f"put it there), and the fleet manager at {client.url} has no artifact of it to compare with: pass "
            f"--baseline FILE, that model's file")
    return CurrentModel(_download(client, folder, model.name, model.sha256), reported=model)


def _download(client: Any, folder: Path, model_name: Any, sha256: str) -> Path:
    """The artifact ``sha256`` into ``folder`` under its model's file name (a name that is no file name: the sha)."""
    folder.mkdir(parents=True, exist_ok=True)
    name = PurePosixPath(str(model_name).replace("\\", "/")).name
    if name in ("", ".", ".."):
        name = sha256
    return client.download_artifact(sha256, folder / name)

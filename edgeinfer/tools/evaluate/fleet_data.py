"""The fleet's own data and the model the fleet runs now, fetched from the fleet manager for an evaluation.

The manager runs no model (numpy and the runtimes are not its dependencies), so scoring runs where the CLI
runs: the manager serves the labelled samples as a COCO export (``GET /api/samples/export?labelled=true``) and
the current model as the artifact of the newest deployment that succeeded; both land in a folder of the
caller's (a temporary one) and are evaluated there like any local dataset and model. docs/datasets.md.
"""

from __future__ import annotations

import zipfile
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from ...errors import DatasetError
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
class CurrentModel:
    """The model the fleet runs now: the artifact of ``deployment``, downloaded and verified into ``path``."""

    path: Path
    deployment: dict[str, Any]

    def describe(self) -> str:
        d = self.deployment
        return f"{d['model_name']} v{d['version']} (deployment {d['deployment_id'][:12]}, sha256 {d['sha256'][:12]})"

    def summary(self) -> dict[str, Any]:
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


def fetch_current_model(client: Any, folder: Path, *, pipeline: str | None = None,
                        devices: Iterable[str] | None = None) -> CurrentModel | None:
    """The model the fleet runs now (:func:`current_deployment`), its artifact downloaded into ``folder`` and
    checked against its sha256; None when no deployment succeeded there."""
    deployment = current_deployment(client, pipeline=pipeline, devices=devices)
    if deployment is None:
        return None
    folder.mkdir(parents=True, exist_ok=True)
    name = PurePosixPath(str(deployment["model_name"]).replace("\\", "/")).name
    if name in ("", ".", ".."):
        name = deployment["sha256"]
    path = client.download_artifact(deployment["sha256"], folder / name)
    return CurrentModel(path, deployment)

"""``edgeinfer fleet dataset export|import``: samples as a labelling tool's dataset, and the corrected
labels back (docs/datasets.md)."""

from __future__ import annotations

import copy
import io
import zipfile
from pathlib import Path
from typing import Any

import click

from ..errors import DatasetError
from .fleet_access import client_options, follow_command
from .output import print_json

FILTERS = ("device", "pipeline", "stream", "model_version", "rule", "label")


def _filter_options(func: Any) -> Any:
    for name in reversed(FILTERS):
        func = click.option(f"--{name.replace('_', '-')}", name, help=f"only samples of this {name.replace('_', ' ')}")(
            func)
    func = click.option("--labelled/--unlabelled", default=None,
                        help="only samples with a ground truth: corrected labels, or reviewed (or the others)")(func)
    return click.option("--reviewed/--unreviewed", default=None, help="only samples reviewed (or not)")(func)


@click.group("dataset")
def dataset() -> None:
    """Samples as datasets for labelling tools (COCO, YOLO, Label Studio), and corrected labels back."""


@dataset.command("export")
@click.option("--format", "fmt", type=click.Choice(["coco", "yolo", "label-studio"]), required=True)
@click.option("-o", "--output", type=click.Path(file_okay=False, path_type=Path), required=True,
              help="the folder to write images/ and the labels into")
@click.option("--limit", default=1000, show_default=True, type=click.IntRange(1, 20_000))
@_filter_options
@click.option("--json", "as_json", is_flag=True)
@client_options
def dataset_export(client: Any, fmt: str, output: Path, limit: int, reviewed: bool | None, as_json: bool,
                   **filters: Any) -> None:
    """Write the samples (newest first, filtered) as a FORMAT dataset into a folder."""
    data = client.export_samples(fmt, limit=limit, reviewed=reviewed, **filters)
    with zipfile.ZipFile(io.BytesIO(data)) as archive:
        names = archive.namelist()
        for name in names:  # the manager's own names; refuse any that would leave the folder all the same
            if name.startswith("/") or ".." in Path(name).parts:
                raise DatasetError(f"the export names {name!r}: outside the folder")
        archive.extractall(output)
    images = sum(name.startswith("images/") for name in names)
    if as_json:
        print_json({"format": fmt, "output": str(output), "images": images, "files": len(names)})
    else:
        click.echo(f"{images} sample(s) as {fmt} in {output}")


@dataset.command("sample")
@click.argument("device_id")
@click.option("--pipeline", required=True, help="The pipeline whose frames to keep.")
@click.option("--frames", default=10, show_default=True, type=click.IntRange(1, 1000), help="How many frames.")
@click.option("--stream", default="", help="One stream of a multi-stream pipeline (default: each).")
@click.option("--wait/--no-wait", default=True, show_default=True,
              help="Wait for the device's answer and for what the manager did with each frame.")
@click.option("--timeout", default=120.0, show_default=True, type=click.FloatRange(min=0),
              help="Seconds to wait at most.")
@click.option("--json", "as_json", is_flag=True, help="Print the command's record (--no-wait: what was sent).")
@client_options
def dataset_sample(client: Any, device_id: str, pipeline: str, frames: int, stream: str, wait: bool,
                    timeout: float, as_json: bool) -> None:
    """Ask DEVICE_ID to keep its pipeline's next frames as samples, whatever its sampling rules say (operator; the
    pipeline must have sampling rules, `request` alone will do), and say what came of it: "5 frames sampled: 2
    stored, 3 near-duplicates of stored samples", or the device's refusal. Exit 1 when the device refused, the
    command expired, or the frames did not all arrive within --timeout."""
    sent = client.sample(device_id, pipeline, frames, stream)
    follow_command(client, sent, f"sampling of {frames} frame(s) of {pipeline} sent to {device_id} (command "
                                 f"{sent['command_id']})", wait=wait, timeout=timeout, as_json=as_json)


def _old_name(command: click.Command, name: str) -> click.Command:
    """``command`` under its old ``name``: the same options and behaviour, not listed in --help."""
    alias = copy.copy(command)
    alias.name, alias.hidden = name, True
    alias.help = f"The old name of `{command.name}` (an alias)."
    return alias


dataset.add_command(_old_name(dataset_sample, "capture"))  # sample's old name, an alias


@dataset.command("import")
@click.option("--format", "fmt", type=click.Choice(["coco", "yolo"]), required=True)
@click.argument("source", type=click.Path(exists=True, path_type=Path))
@click.option("--json", "as_json", is_flag=True)
@client_options
def dataset_import(client: Any, fmt: str, source: Path, as_json: bool) -> None:
    """Set the samples' labels from corrected ones: SOURCE is a COCO annotations.json (or the export's folder),
    or for yolo the export's folder (data.yaml and labels/) or a zip of it. Nothing changes if a file is
    malformed."""
    answer = client.import_labels(fmt, _body(fmt, source))
    if as_json:
        print_json(answer)
    else:
        click.echo(f"labels of {answer['samples']} sample(s) imported")


def _body(fmt: str, source: Path) -> bytes:
    if fmt == "coco":
        return (source / "annotations.json" if source.is_dir() else source).read_bytes()
    if not source.is_dir():
        return source.read_bytes()
    if not (source / "data.yaml").is_file():
        raise DatasetError(f"{source} has no data.yaml: give the folder `dataset export --format yolo` wrote")
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as archive:
        archive.write(source / "data.yaml", "data.yaml")
        for path in sorted((source / "labels").rglob("*.txt")):
            archive.write(path, path.relative_to(source).as_posix())
    return out.getvalue()

"""Evaluations on the fleet's own data: ``evaluate --fleet`` and ``deploy --require-eval`` (docs/datasets.md).

The scoring runs here, where the CLI runs: the fleet manager runs no model. It serves the labelled samples
(a COCO export) and the model its devices run now (the artifact of the newest deployment that succeeded, else the
stored artifact of the model the devices report running: their agent.yaml's); both are fetched into a temporary
folder, removed when the evaluation ends.
"""

from __future__ import annotations

import contextlib
import tempfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click

from ..errors import EdgeInferError, EvaluationRejected

#: the sample filters ``evaluate --fleet`` takes (``fleet dataset export``'s, less ``--label``: beside
#: ``--labels``, the model's class names, it would be mistaken for it)
SAMPLE_FILTERS = ("device", "pipeline", "stream", "model_version", "rule")


@dataclass(frozen=True)
class Inputs:
    """What an evaluation runs on: the dataset, and the baseline's file with where it came from."""

    dataset: Any
    baseline: Path | None
    current: Any = None  # a CurrentModel when the baseline is the fleet's

    def baseline_line(self) -> str:
        if self.current is not None:
            return f"baseline: the fleet's current model {self.current.describe()}"
        return f"baseline: {self.baseline}" if self.baseline else "baseline: none"

    def baseline_name(self) -> str:
        if self.current is not None:
            return f"the fleet's current model {self.current.describe()}"
        return Path(str(self.baseline)).name

    def name_baseline(self, scores: dict[str, Any]) -> dict[str, Any]:
        """The baseline's scores, the fleet's model named as the fleet names it (its file was temporary)."""
        return {**scores, "model": self.current.describe()} if self.current is not None else scores

    def baseline_summary(self) -> dict[str, Any] | None:
        if self.current is not None:
            return self.current.summary()
        return {"source": "file", "path": str(self.baseline)} if self.baseline else None


def sample_filter_options(func: Any) -> Any:
    """``--fleet`` and the filters choosing the fleet's labelled samples (with ``--limit``)."""
    from ..tools.evaluate.fleet_data import DEFAULT_LIMIT

    options = [click.option("--fleet", "from_fleet", is_flag=True,
                            help="Score on the fleet's labelled samples (fetched from the fleet manager) instead of "
                                 "--dataset; without --baseline, compare with the model the fleet runs now.")]
    options += [click.option(f"--{name.replace('_', '-')}", name,
                             help=f"With --fleet: only samples of this {name.replace('_', ' ')}.")
                for name in SAMPLE_FILTERS]
    options.append(click.option("--limit", default=DEFAULT_LIMIT, show_default=True, type=click.IntRange(1, 20_000),
                                help="With --fleet: the newest this many labelled samples."))
    for option in reversed(options):
        func = option(func)
    return func


@contextlib.contextmanager
def evaluation_inputs(client: Any, *, folder: str | None, fmt: str | None, selection: Any,
                      baseline: str | None, current_for: dict[str, Any] | None) -> Iterator[Inputs]:
    """The dataset — ``folder`` read, or the fleet's labelled samples of ``selection`` fetched — and the baseline:
    ``baseline`` given, else (when ``current_for`` names the pipeline and devices) the fleet's current model, or
    None. Fetched files live in a temporary folder for the ``with`` block only."""
    from ..tools.evaluate import read_dataset
    from ..tools.evaluate.fleet_data import fetch_current_model, fetch_labelled

    with tempfile.TemporaryDirectory(prefix="edgeinfer-evaluate-") as tmp:
        # the samples first: no labelled sample is the refusal, before any model is downloaded
        dataset = read_dataset(folder, fmt) if folder else fetch_labelled(client, Path(tmp) / "samples", selection)
        if baseline is not None or current_for is None:
            yield Inputs(dataset, Path(baseline) if baseline else None)
            return
        current = fetch_current_model(client, Path(tmp) / "current", **current_for)
        yield Inputs(dataset, current.path if current else None, current)


def target_devices(client: Any, devices: Iterable[str], group: str | None) -> set[str] | None:
    """The devices a deployment will target, as far as the baseline is concerned (None: every device)."""
    if devices:
        return set(devices)
    if group:
        return {d["device_id"] for d in client.devices() if group in (d.get("groups") or [])}
    return None


def require_eval(client: Any, model: Path, *, folder: str | None, baseline: str | None, pipeline: str | None,
                 devices: set[str] | None, tolerance: float, options: Any, quiet: bool) -> None:
    """``deploy --require-eval``: refuse ``model`` (EvaluationRejected, exit 1) when it scores worse than the model
    the fleet runs now (or ``baseline``) on the fleet's labelled samples of ``pipeline`` (or ``folder``)."""
    from ..tools.evaluate import compare_models
    from ..tools.evaluate.fleet_data import SampleSelection
    from .progress import StderrProgress

    current_for = {"pipeline": pipeline, "devices": devices}
    with evaluation_inputs(client, folder=folder, fmt=options.format, selection=SampleSelection(pipeline=pipeline),
                           baseline=baseline, current_for=current_for) as inputs:
        if inputs.baseline is None:
            raise EdgeInferError(
                f"--require-eval: no deployment succeeded on the fleet at {client.url} for these targets"
                f"{f' and pipeline {pipeline}' if pipeline else ''}, and none of them reports a model: nothing to "
                f"compare {model.name} with — pass --baseline CURRENT_MODEL, the model the devices run now")
        if not quiet:
            click.echo(f"evaluating {model.name} on {inputs.dataset.source or inputs.dataset.root} "
                       f"({len(inputs.dataset.samples)} images); {inputs.baseline_line()}", err=True)
        result = compare_models(model, inputs.baseline, inputs.dataset, options, tolerance,
                                StderrProgress(enabled=not quiet))
        figures = ", ".join(f"{name} {result['candidate'][name]:.3f} vs {result['baseline'][name]:.3f}"
                            for name in result["deltas"])
        where = inputs.dataset.source or folder
        if result["worse"]:
            judged = ", ".join(result["judged"])
            raise EvaluationRejected(f"{model.name} scores worse than {inputs.baseline_name()} on {where} "
                                     f"({figures}; tolerance {tolerance:g} on {judged}): not deployed")
    if not quiet:
        click.echo(f"evaluation passed: {figures}", err=True)


def dataset_options(func: Any) -> Any:
    """The options every evaluation takes (``evaluate`` and ``deploy --require-eval``)."""
    from ..tools.evaluate import FORMATS

    for option in reversed([
        click.option("--format", "dataset_format", type=click.Choice(FORMATS),
                     help="The dataset's format (default: data.yaml → yolo, a .json → coco, else class folders)."),
        click.option("--labels", type=click.Path(exists=True, dir_okay=False),
                     help="The model's class names, one a line (default: packed in the model or its metadata)."),
        click.option("--ignore-unknown-classes", "ignore_unknown", is_flag=True,
                     help="Leave out the dataset's classes the model does not know, instead of refusing."),
        click.option("--eval-delegate", "eval_delegate", help="Run the evaluation on this delegate."),
    ]):
        func = option(func)
    return func


def eval_options(dataset_format: str | None, labels: str | None, ignore_unknown: bool,
                 eval_delegate: str | None) -> Any:
    from ..tools.evaluate import EvaluateOptions

    return EvaluateOptions(format=dataset_format, labels=labels, ignore_unknown=ignore_unknown,
                           delegate=eval_delegate)

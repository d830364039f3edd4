"""``edgeinfer evaluate MODEL --dataset DIR|--fleet [--baseline OTHER]``: scores on labelled field data
(docs/datasets.md)."""

from __future__ import annotations

import dataclasses
from typing import Any

import click

from .fleet_access import client_options
from .fleet_eval import dataset_options, eval_options, evaluation_inputs, sample_filter_options
from .output import print_json
from .pipeline_flags import decoder_flag
from .progress import StderrProgress


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f}%"


def _delta(value: float) -> str:
    return f"{100 * value:+.1f} pts"


def print_scores(scores: dict[str, Any]) -> None:
    """One model's scores: the headline figures, then one row per class."""
    click.echo(f"{scores['model']} on {scores['dataset']} ({scores['format']}, {scores['images']} images; "
               f"task {scores['task']}, outputs read as {scores['layout']})")
    if scores["kind"] == "classify":
        click.echo(f"  accuracy {_pct(scores['accuracy'])}   top-5 {_pct(scores['top5'])}")
        rows = [(name, f"{c['images']}", _pct(c["accuracy"])) for name, c in scores["per_class"].items()]
        headers = ("class", "images", "accuracy")
    else:
        click.echo(f"  mAP50-95 {_pct(scores['map50_95'])}   mAP50 {_pct(scores['map50'])}   "
                   f"({scores['boxes']} labelled boxes, {scores['detections']} detections ranked)")
        rows = [(name, "-" if c["boxes"] is None else str(c["boxes"]), _pct(c["ap50"]), _pct(c["recall"]))
                for name, c in scores["per_class"].items()]
        headers = ("class", "boxes", "AP50", "recall@0.5")
    widths = [max(len(str(x)) for x in column) for column in zip(headers, *rows)]
    for row in (headers, *rows):
        click.echo("  " + "  ".join(str(cell).ljust(width) for cell, width in zip(row, widths)).rstrip())
    if scores.get("keypoints"):
        click.echo("  " + _keypoint_line(scores["keypoints"]))
    if scores["ignored_classes"]:
        click.echo(f"  ignored (not the model's classes): {', '.join(scores['ignored_classes'])}")


def _keypoint_line(keypoints: dict[str, Any]) -> str:
    """The keypoints' figures (OKS), or why they were not scored."""
    if not keypoints["scored"]:
        return f"keypoints: not scored: {keypoints['why']}"
    sigmas = "COCO's sigmas" if keypoints["sigmas"] == "coco" else f"sigmas 1/{keypoints['count']} each"
    return (f"keypoints (OKS) mAP50-95 {_pct(keypoints['map50_95'])}   mAP50 {_pct(keypoints['map50'])}   "
            f"({keypoints['instances']} labelled instances, {keypoints['count']} keypoints, {sigmas})")


def print_comparison(result: dict[str, Any]) -> None:
    """Both models' scores, then the deltas and the verdict."""
    print_scores(result["candidate"])
    print_scores(result["baseline"])
    deltas = ", ".join(f"{name} {_delta(value)}" for name, value in result["deltas"].items())
    verdict = "worse" if result["worse"] else "not worse"
    click.echo(f"candidate - baseline: {deltas} → {verdict} (tolerance {_pct(result['tolerance'])} "
               f"on {', '.join(result['judged'])})")


@click.command()
@click.argument("model", type=click.Path(exists=True, dir_okay=False))
@click.option("--dataset", type=click.Path(exists=True, file_okay=False),
              help="A labelled folder: COCO JSON + images, YOLO (data.yaml, images/, labels/), or class folders.")
@sample_filter_options
@click.option("--baseline", type=click.Path(exists=True, dir_okay=False),
              help="The model the fleet runs now: scored on the same frames, the deltas printed (with --fleet, by "
                   "default the artifact of the newest deployment that succeeded for --device / --pipeline, else "
                   "the stored artifact of the model those devices report running).")
@click.option("--tolerance", type=click.FloatRange(0, 1), default=0.01, show_default=True,
              help="With a baseline: how much lower (absolute) the headline figure may be and still not be worse.")
@dataset_options
@decoder_flag("How both models' outputs are read: a built-in decoder or an installed plug-in's. Default: chosen "
              "from each model's outputs and metadata.")
@click.option("--json", "as_json", is_flag=True, help="Print the scores as JSON.")
@click.option("-q", "--quiet", is_flag=True, help="No progress on stderr.")
@client_options
def evaluate(client: Any, model: str, dataset: str | None, from_fleet: bool, limit: int, baseline: str | None,
             tolerance: float, dataset_format: str | None, labels: str | None, ignore_unknown: bool,
             eval_delegate: str | None, decoder: str | None, as_json: bool, quiet: bool,
             **filters: str | None) -> None:
    """Score MODEL on a labelled dataset: accuracy and top-5 (classifiers), mAP50-95, mAP50 and per-class
    AP50 / recall (detectors, pycocotools' COCOeval), and a pose model's keypoints (OKS mAP50-95, mAP50) on keypoint
    labels. With a baseline, exit 1 when MODEL is worse.

    --dataset DIR scores on a local folder; --fleet on the fleet's labelled samples, fetched from the fleet
    manager (--fleet-url, --token-file: a viewer token), and compares with the model the fleet runs now."""
    from ..tools.evaluate import compare_models, evaluate_model
    from ..tools.evaluate.fleet_data import SampleSelection

    if bool(dataset) == from_fleet:
        raise click.UsageError("give --dataset DIR or --fleet")
    if not from_fleet and any(filters.values()):
        raise click.UsageError("--device, --pipeline, --stream, --model-version and --rule choose the fleet's "
                               "samples: use them with --fleet")
    options = dataclasses.replace(eval_options(dataset_format, labels, ignore_unknown, eval_delegate), decoder=decoder)
    say = StderrProgress(enabled=not quiet)
    current_for = {"pipeline": filters["pipeline"], "devices": [filters["device"]] if filters["device"] else None}
    with evaluation_inputs(client, folder=dataset, fmt=dataset_format, selection=SampleSelection(**filters,
                           limit=limit), baseline=baseline, current_for=current_for if from_fleet else None) as inputs:
        fleet_keys = {"baseline_model": inputs.baseline_summary()} if from_fleet else {}
        if inputs.baseline is None:
            if from_fleet:
                click.echo(f"edgeinfer: no deployment succeeded on the fleet at {client.url} for these samples' "
                           "devices and pipeline, and none of them reports a model: scored without a comparison "
                           "(--baseline FILE compares)", err=True)
            scores = evaluate_model(model, inputs.dataset, options, say)
            print_json({**scores, **fleet_keys}) if as_json else print_scores(scores)
            return
        if from_fleet and not as_json:
            click.echo(inputs.baseline_line())
        result = compare_models(model, inputs.baseline, inputs.dataset, options, tolerance, say)
        result["baseline"] = inputs.name_baseline(result["baseline"])
    print_json({**result, **fleet_keys}) if as_json else print_comparison(result)
    raise SystemExit(1 if result["worse"] else 0)

"""``edgeinfer optimize``: INT8 / FP16 a model, export OpenVINO IR, prove the accuracy held."""

from __future__ import annotations

from typing import TYPE_CHECKING

import click

from ..pipeline.preprocess import RESIZE_MODES
from ..tools.optimize.options import DEFAULT_NMS_IOU
from .output import handle_errors, parse_values, print_json
from .pipeline_flags import decoder_flag, option_type

if TYPE_CHECKING:
    from ..pipeline.labels import Labels
    from ..tools.optimize import Artifact, Latency, OptimizeReport


def _mb(size: int) -> str:
    return f"{size / 1e6:.2f} MB"


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:.1%}"


def print_report(report: OptimizeReport, labels: Labels | None = None) -> None:
    """The table for people: one row per artifact, then the images where the top-1 moved."""
    click.echo(f"model      {report.model}  ({_mb(report.original_bytes)})")
    click.echo(f"mode       {report.mode.upper()}   calibration images {report.calibration_images}   "
               f"validation images {report.validation_images}")
    pre = report.preprocessing
    click.echo(f"preprocess resize={pre['resize']} {pre.get('channels', 'rgb')} mean={pre['mean']} std={pre['std']}")
    if report.artifacts[0].accuracy.boxes is not None:
        _print_detector(report)
    else:
        _print_classifier(report, labels)
    for note in report.notes:
        click.echo(f"note: {note}")
    click.echo("")
    if report.written:
        extra = f" and {report.artifacts[1].path} (+ .bin)" if len(report.artifacts) > 1 else ""
        forced = " (forced past the accuracy check)" if report.forced else ""
        click.echo(f"wrote {report.output}{extra}{forced}")


def _print_classifier(report: OptimizeReport, labels: Labels | None) -> None:
    """Top-1 agreement per artifact, then the images where the top-1 moved."""
    header = (f"{'artifact':<13} {'delegate':<12} {'size':>10} {'smaller':>8}  {'top-1 agree':>16} "
              f"{'all images':>11} {'top-5':>6} {'mean|Δ|':>9}  "
              f"{'original ms':>11} {'optimised ms':>12} {'speedup':>8}")
    click.echo("")
    click.echo(header)
    click.echo("-" * len(header))
    for art in report.artifacts:
        click.echo(_artifact_row(art, report.mode))
    _print_latency_note(report)
    _print_moved(report, labels)


def _print_latency_note(report: OptimizeReport) -> None:
    lat = report.onnx.latency
    if lat:
        click.echo(f"(latency: medians of {lat.samples[0]}+{lat.samples[1]} invokes in {lat.rounds} interleaved "
                   f"rounds, {lat.threads} threads, same process)")


def _timing(lat: Latency | None) -> str:
    return (f"{lat.original_ms:>11.3f} {lat.optimized_ms:>12.3f} {lat.speedup:>7.2f}x" if lat
            else f"{'-':>11} {'-':>12} {'-':>8}")


def _print_detector(report: OptimizeReport) -> None:
    """Box agreement per artifact, the thresholds, the images whose boxes moved, the nodes kept float."""
    from ..pipeline.agreement import FIGURES, value_text

    header = (f"{'artifact':<13} {'delegate':<12} {'size':>10} {'smaller':>8}  {'recall':>7} {'precision':>9} "
              f"{'mAP50':>6} {'mean IoU':>8} {'boxes o/q/m':>12}  {'original ms':>11} {'optimised ms':>12} "
              f"{'speedup':>8}")
    click.echo(f"task       {report.task}: boxes at score >= {report.score_threshold:g} after NMS at IoU "
               f"{report.iou_threshold:g}, matched by class at IoU >= 0.5 (o/q/m: the original's boxes, the "
               "optimised model's, matched)")
    click.echo("")
    click.echo(header)
    click.echo("-" * len(header))
    moved = []
    for art in report.artifacts:
        boxes = art.accuracy.boxes
        if boxes is None:
            continue
        kind = f"{art.kind} {report.mode}" if art.kind == "onnx" else art.kind
        counts = f"{boxes.reference_boxes}/{boxes.candidate_boxes}/{boxes.matched}"
        click.echo(f"{kind:<13} {art.delegate:<12} {_mb(art.size_bytes):>10} {art.size_ratio:>7.2f}x  "
                   f"{value_text('recall', boxes.recall):>7} {value_text('precision', boxes.precision):>9} "
                   f"{value_text('map50', boxes.map50):>6} {value_text('mean_iou', boxes.mean_iou):>8} "
                   f"{counts:>12}  {_timing(art.latency)}")
        moved += [(art.kind, row) for row in boxes.per_image if not row.agrees]
    _print_latency_note(report)
    click.echo("thresholds " + ", ".join(f"{FIGURES[name]} >= {value_text(name, value)}"
                                         for name, value in report.box_minimums.items()))
    for kind, row in moved:
        click.echo(f"boxes moved [{kind}]: {row.image}: {row.matched} of {row.reference} found, {row.extra} extra")
    if report.mode == "int8":
        click.echo(f"kept float {_float_summary(report.float_nodes)}")


def _float_summary(nodes: dict[str, str]) -> str:
    """``24 nodes under /model.22 (Concat x6, Reshape x5, …)``: how many, where, which ops (--json names them)."""
    if not nodes:
        return "no node: every node quantised"
    parts = [name.split("/")[:-1] for name in nodes]
    shared = next((i for i, level in enumerate(zip(*parts)) if len(set(level)) > 1), min(map(len, parts)))
    where = "/".join(parts[0][:shared])
    ops: dict[str, int] = {}
    for op in nodes.values():
        ops[op] = ops.get(op, 0) + 1
    listed = ", ".join(f"{op} x{count}" if count > 1 else op for op, count in sorted(ops.items(), key=lambda i: -i[1]))
    return f"{len(nodes)} node{'s' if len(nodes) > 1 else ''}{f' under {where}' if where else ''} ({listed})"


def _artifact_row(art: Artifact, mode: str) -> str:
    """One artifact's line of the table: size, agreement, score difference, timing."""
    acc, lat = art.accuracy, art.latency
    agreeing = sum(r.agrees for r in acc.per_image if not r.ambiguous)
    agree = f"{agreeing}/{acc.decisive} {_pct(acc.top1_agreement)}" if acc.top1_agreement is not None else "-"
    kind = f"{art.kind} {mode}" if art.kind == "onnx" else art.kind
    timing = _timing(lat)
    return (f"{kind:<13} {art.delegate:<12} {_mb(art.size_bytes):>10} {art.size_ratio:>7.2f}x  {agree:>16} "
            f"{_pct(acc.top1_agreement_all):>11} {_pct(acc.top5_agreement):>6} "
            f"{acc.mean_abs_diff:>9.2g}  {timing}")


def _print_moved(report: OptimizeReport, labels: Labels | None) -> None:
    """The images the original finds ambiguous, then every image whose top-1 moved."""
    def name(index: int) -> str:
        if index < 0:
            return "a tie"
        return f"{index} {labels[index]}" if labels else str(index)

    moved = [(art, row) for art in report.artifacts for row in art.accuracy.per_image if not row.agrees]
    ambiguous = [row for row in report.onnx.accuracy.per_image if row.ambiguous]
    if ambiguous:
        click.echo(f"ambiguous for the original (top-1 beats top-2 by < {report.ambiguous_margin:g}; "
                   "not counted in top-1 agree): " + ", ".join(f"{r.image} ({r.margin:.3f})" for r in ambiguous))
    for art, row in moved:
        click.echo(f"top-1 moved [{art.kind}]: {row.image}: {name(row.original_top1)} ({row.original_score:.3f}) -> "
                   f"{name(row.optimized_top1)} ({row.optimized_score:.3f})"
                   + ("  [ambiguous]" if row.ambiguous else ""))


@click.command()
@click.argument("model", type=click.Path(dir_okay=False, path_type=str))
@click.option("--int8", "mode", flag_value="int8", help="Static INT8 quantisation (QDQ, per-channel weights).")
@click.option("--fp16", "mode", flag_value="fp16", help="FP16 weights and activations (float32 inputs/outputs kept).")
@click.option("--calibration", type=click.Path(path_type=str),
              help="Folder of representative images for INT8 calibration.")
@click.option("-o", "--output", required=True, type=click.Path(path_type=str), help="Where to write the model (.onnx).")
@click.option("--validation", type=click.Path(path_type=str),
              help="Folder of images to compare original and optimised on (default: the calibration images).")
@click.option("--min-agreement", default=0.95, show_default=True, type=click.FloatRange(0.0, 1.0),
              help="Refuse a model whose top-1 agrees with the original on fewer decisive images than this.")
@click.option("--ambiguous-margin", default=0.05, show_default=True, type=click.FloatRange(0.0, 1.0, max_open=True),
              help="Images where the original's top-1 beats its top-2 by less are reported, not counted.")
@click.option("--force", is_flag=True, help="Write the model even if it fails the accuracy check.")
@click.option("--export-ir", is_flag=True, help="Also write OpenVINO IR (OUT.xml + OUT.bin) and check it.")
@click.option("--mean", help="Input normalisation: (pixel - mean) / std; one value or R,G,B. "
              "Default: what inference uses for a float model (127.5).")
@click.option("--std", help="See --mean. Default 127.5. MobileNet (TF) uses --mean 128 --std 128.")
@click.option("--resize", type=click.Choice(RESIZE_MODES),
              help="How images are fitted to the input. Default: as inference reads the model "
              "(its metadata; letterbox for a detector, stretch for a classifier).")
@decoder_flag("How a detector's outputs are read (both models): a built-in decoder or an installed plug-in's. "
              "Default: chosen from the outputs and the metadata.")
@click.option("--per-tensor", is_flag=True, help="Per-tensor weight scales (default per-channel; see docs).")
@click.option("--activations", type=click.Choice(["uint8", "int8"]), default="uint8", show_default=True,
              help="INT8 activation type (uint8 is ONNX Runtime's fast path on x86).")
@click.option("--reduce-range", is_flag=True,
              help="7-bit weights: exact on the fast INT8 kernels of x86 CPUs without VNNI (OpenVINO's there), "
              "coarser everywhere (see docs).")
@click.option("--quantize-outputs", is_flag=True,
              help="Quantise the last layer's output too (faster; 8-bit logits make close classes tie).")
@click.option("--quantize-all", is_flag=True,
              help="Quantise every node: no Softmax, detector decode tail or output kept float (to compare).")
@click.option("--min-recall", default=0.8, show_default=True, type=click.FloatRange(0.0, 1.0),
              help="Detectors: refuse below this share of the original's boxes found (same class, IoU >= 0.5).")
@click.option("--min-precision", default=0.8, show_default=True, type=click.FloatRange(0.0, 1.0),
              help="Detectors: refuse below this share of the optimised model's boxes that the original has.")
@click.option("--min-map50", default=0.8, show_default=True, type=click.FloatRange(0.0, 1.0),
              help="Detectors: refuse below this mAP50 against the original's boxes.")
@click.option("--min-mean-iou", default=0.8, show_default=True, type=click.FloatRange(0.0, 1.0),
              help="Detectors: refuse below this mean IoU of the matched boxes.")
@click.option("--score-threshold", default=0.25, show_default=True,
              type=click.FloatRange(0.0, 1.0, min_open=True, max_open=True),
              help="Detectors: the score at which both models' boxes are compared.")
@click.option("--iou", "iou_threshold", type=option_type("iou_threshold"), default=DEFAULT_NMS_IOU,
              show_default=True,
              help="Detectors: the non-maximum suppression IoU both models' boxes are kept at (Ultralytics' iou; "
                   "give the one the model runs with: edgeinfer run --iou).")
@click.option("--delegate", default="onnxruntime", show_default=True, help="Delegate that validates and times.")
@click.option("--threads", type=click.IntRange(min=1), help="Threads for both models (default: all cores).")
@click.option("--bench-seconds", default=4.0, show_default=True, type=click.FloatRange(min=0.0),
              help="Interleaved timing budget per comparison; 0 skips timing.")
@click.option("--labels", type=click.Path(dir_okay=False, path_type=str), help="Labels file, to name classes.")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@click.option("-q", "--quiet", is_flag=True, help="No progress on stderr.")
@handle_errors
def optimize(model: str, mode: str | None, calibration: str | None, output: str, validation: str | None,
             min_agreement: float, ambiguous_margin: float, force: bool, export_ir: bool, mean: str | None,
             std: str | None, resize: str | None, decoder: str | None, per_tensor: bool, activations: str,
             reduce_range: bool,
             quantize_outputs: bool,
             quantize_all: bool, min_recall: float, min_precision: float, min_map50: float, min_mean_iou: float,
             score_threshold: float, iou_threshold: float, delegate: str, threads: int | None, bench_seconds: float,
             labels: str | None,
             as_json: bool, quiet: bool) -> None:
    """Quantise (--int8) or convert (--fp16) MODEL into -o OUT, after proving it agrees with MODEL.

    Sizes, agreement and the speedup (measured here, in this run) are printed as one table. A
    classifier is judged by top-1 agreement (--min-agreement), a detector by its boxes against the
    original's (--min-recall, --min-precision, --min-map50, --min-mean-iou); below, the model is not
    written unless --force.
    """
    from ..errors import AccuracyRejected
    from ..tools.optimize import OptimizeOptions, optimize_model
    from .progress import StderrProgress

    if mode is None:
        raise click.UsageError("choose what to do: --int8 (with --calibration DIR) or --fp16")
    if mode == "int8" and not calibration:
        raise click.UsageError("--int8 needs --calibration DIR (representative images)")
    names = None
    if labels:
        from ..pipeline.labels import Labels

        names = Labels.load(labels)
    options = OptimizeOptions(
        mode=mode, calibration=calibration, validation=validation, min_agreement=min_agreement,
        ambiguous_margin=ambiguous_margin, force=force, export_ir=export_ir,
        mean=parse_values(mean), std=parse_values(std, nonzero=True), resize=resize, decoder=decoder,
        per_channel=not per_tensor,
        activations=activations, reduce_range=reduce_range, float_outputs=not quantize_outputs,
        quantize_all=quantize_all,
        min_recall=min_recall, min_precision=min_precision, min_map50=min_map50, min_mean_iou=min_mean_iou,
        score_threshold=score_threshold, iou_threshold=iou_threshold, threads=threads, delegate=delegate,
        bench_seconds=bench_seconds,
    )
    progress = StderrProgress(enabled=not quiet)
    try:
        report = optimize_model(model, output, options, progress=progress)
    except AccuracyRejected as exc:
        progress.done()
        if exc.report is not None:
            if as_json:
                print_json(exc.report.to_dict())
            else:
                print_report(exc.report, names)
        raise
    progress.done()
    if as_json:
        print_json(report.to_dict())
    else:
        print_report(report, names)

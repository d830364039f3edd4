"""``edgeinfer optimize``: INT8 / FP16 a model, export OpenVINO IR, prove the accuracy held."""

from __future__ import annotations

from typing import TYPE_CHECKING

import click

from ..pipeline.preprocess import RESIZE_MODES
from .output import handle_errors, print_json

if TYPE_CHECKING:
    from ..pipeline.labels import Labels
    from ..tools.optimize import Artifact, OptimizeReport


def parse_values(text: str | None) -> float | tuple[float, ...] | None:
    """``"128"`` -> 128.0; ``"123.7,116.3,103.5"`` -> a per-channel (R, G, B) tuple."""
    if text is None:
        return None
    try:
        values = tuple(float(part) for part in text.split(","))
    except ValueError:
        raise click.BadParameter(f"{text!r} is not a number or a comma-separated list of 3 numbers") from None
    if len(values) not in (1, 3):
        raise click.BadParameter(f"{text!r}: give one value or three (R,G,B)")
    return values[0] if len(values) == 1 else values


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
    click.echo(f"preprocess resize={pre['resize']} rgb mean={pre['mean']} std={pre['std']}")
    header = (f"{'artifact':<13} {'delegate':<12} {'size':>10} {'smaller':>8}  {'top-1 agree':>16} "
              f"{'all images':>11} {'top-5':>6} {'mean|Δ|':>9}  "
              f"{'original ms':>11} {'optimised ms':>12} {'speedup':>8}")
    click.echo("")
    click.echo(header)
    click.echo("-" * len(header))
    for art in report.artifacts:
        click.echo(_artifact_row(art, report.mode))
    onnx = report.onnx
    if onnx.latency:
        lat = onnx.latency
        click.echo(f"(latency: medians of {lat.samples[0]}+{lat.samples[1]} invokes in {lat.rounds} interleaved "
                   f"rounds, {lat.threads} threads, same process)")
    _print_moved(report, labels)
    for note in report.notes:
        click.echo(f"note: {note}")
    click.echo("")
    if report.written:
        extra = f" and {report.artifacts[1].path} (+ .bin)" if len(report.artifacts) > 1 else ""
        forced = " (forced past the accuracy check)" if report.forced else ""
        click.echo(f"wrote {report.output}{extra}{forced}")


def _artifact_row(art: Artifact, mode: str) -> str:
    """One artifact's line of the table: size, agreement, score difference, timing."""
    acc, lat = art.accuracy, art.latency
    agreeing = sum(r.agrees for r in acc.per_image if not r.ambiguous)
    agree = f"{agreeing}/{acc.decisive} {_pct(acc.top1_agreement)}" if acc.top1_agreement is not None else "-"
    kind = f"{art.kind} {mode}" if art.kind == "onnx" else art.kind
    timing = (f"{lat.original_ms:>11.3f} {lat.optimized_ms:>12.3f} {lat.speedup:>7.2f}x" if lat
              else f"{'-':>11} {'-':>12} {'-':>8}")
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
@click.option("--resize", type=click.Choice(RESIZE_MODES), default="stretch", show_default=True,
              help="How images are fitted to the input, as at inference time.")
@click.option("--per-tensor", is_flag=True, help="Per-tensor weight scales (default per-channel; see docs).")
@click.option("--activations", type=click.Choice(["uint8", "int8"]), default="uint8", show_default=True,
              help="INT8 activation type (uint8 is ONNX Runtime's fast path on x86).")
@click.option("--quantize-outputs", is_flag=True,
              help="Quantise the last layer's output too (faster; 8-bit logits make close classes tie).")
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
             std: str | None, resize: str, per_tensor: bool, activations: str, quantize_outputs: bool, delegate: str,
             threads: int | None, bench_seconds: float, labels: str | None, as_json: bool, quiet: bool) -> None:
    """Quantise (--int8) or convert (--fp16) MODEL into -o OUT, after proving it agrees with MODEL.

    Sizes, top-1 agreement, score differences and the speedup (measured here, in this run) are
    printed as one table. A model below --min-agreement is not written unless --force.
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
        mean=parse_values(mean), std=parse_values(std), resize=resize, per_channel=not per_tensor,
        activations=activations, float_outputs=not quantize_outputs, threads=threads, delegate=delegate,
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

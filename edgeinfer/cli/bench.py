"""``edgeinfer bench``: cold start, latency percentiles, throughput, RSS and CPU per delegate, side by side."""

from __future__ import annotations

import click

from ..pipeline.tasks import TASK_NAMES
from .output import handle_errors, print_json
from .pipeline_flags import decoder_flag


@click.command()
@click.argument("models", nargs=-1, required=True, type=click.Path(dir_okay=False, path_type=str))
@click.option("--delegate", "delegates", multiple=True,
              help="Delegate to measure (repeatable; name or name:device). Default: every delegate that can "
                   "read the model here.")
@click.option("--all", "all_delegates", is_flag=True, help="Every registered delegate (the default).")
@click.option("--source", help="Also measure the whole pipeline per stage on this source (camera index, video or "
              "image folder, URL, synthetic:WxH[@FPS]); file sources loop.")
@click.option("--task", type=click.Choice(TASK_NAMES),
              help="What the pipeline decodes (with --source). Default: the task each model is read for.")
@decoder_flag("How the pipeline reads the outputs (with --source): a built-in decoder or an installed plug-in's. "
              "Default: chosen from the outputs and the metadata.")
@click.option("--seconds", default=5.0, show_default=True, type=click.FloatRange(min=0.0, min_open=True),
              help="Measured time per target, split over the interleaved rounds.")
@click.option("--rounds", default=5, show_default=True, type=click.IntRange(min=1),
              help="Interleaved rounds (every target runs once per round, order rotating).")
@click.option("--threads", type=click.IntRange(min=1), help="Threads for every delegate (default: all cores).")
@click.option("--plot", "plot", type=click.Path(path_type=str), help="Also write a PNG chart here (needs matplotlib).")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@click.option("-q", "--quiet", is_flag=True, help="No progress on stderr.")
@handle_errors
def bench(models: tuple[str, ...], delegates: tuple[str, ...], all_delegates: bool, source: str | None,
          task: str | None, decoder: str | None, seconds: float, rounds: int, threads: int | None, plot: str | None,
          as_json: bool, quiet: bool) -> None:
    """Benchmark MODELS on every delegate that can run them, side by side in one run.

    Give a model's twins (mobilenet.tflite mobilenet.onnx) to compare delegates that read
    different formats. Each target runs in its own process: cold start is real, peak RSS is its own.
    """
    from ..tools.bench.plot import check_plot_path, plot_report
    from ..tools.bench.runner import run_benchmark
    from ..tools.bench.table import format_pipeline_table, format_table
    from .progress import StderrProgress

    if delegates and all_delegates:
        raise click.UsageError("give --delegate NAME ... or --all, not both")
    if decoder is not None and source is None:
        raise click.UsageError("--decoder reads the pipeline's outputs: give it with --source")
    if plot:
        check_plot_path(plot)  # before minutes of measuring
    progress = StderrProgress(enabled=not quiet)
    report = run_benchmark(models, list(delegates) or None, seconds=seconds, threads=threads, rounds=rounds,
                           progress=progress, source=int(source) if source and source.isdigit() else source,
                           task=task, decoder=decoder)
    progress.done()
    if plot:
        progress("writing the chart")
        plot_report(report, plot)
    if as_json:
        print_json(report.to_dict())
    else:
        click.echo(format_table(report))
        if report.pipeline:
            click.echo("")
            click.echo(format_pipeline_table(report))
        if plot:
            click.echo(f"chart: {plot}")


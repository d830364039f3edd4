"""``edgeinfer demo``: the end-to-end demo on the shared sample assets."""

from __future__ import annotations

from pathlib import Path

import click

from .output import handle_errors, print_json


@click.command()
@click.option("--assets", type=click.Path(file_okay=False, path_type=Path),
              help="The shared assets folder (default: $EDGEINFER_ASSETS or ../shared/assets).")
@click.option("--workdir", type=click.Path(file_okay=False, path_type=Path), default=Path(".edgeinfer-demo"),
              show_default=True, help="Where generated files go.")
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON at the end.")
@handle_errors
def demo(assets: Path | None, workdir: Path, as_json: bool) -> None:
    """Run the demo: photos on every CPU delegate, a clip through the pipeline, an agent reporting
    to a fleet manager, and a signed deploy of version 2 to it."""
    from ..tools.demo import default_assets, run_demo

    summary = run_demo(assets or default_assets(), workdir, echo=click.echo)
    if as_json:
        print_json(summary)

"""The ``edgeinfer`` command line. Thin: parse, call the library, print a table or ``--json``."""

from __future__ import annotations

import functools
import json
import logging
import os
import sys
from collections.abc import Callable
from typing import Any

import click

from . import __version__
from .errors import EdgeInferError

DEBUG_ENV = "EDGEINFER_DEBUG"


def _fail(message: str) -> None:
    click.echo(f"edgeinfer: error: {message}", err=True)
    sys.exit(1)


def handle_errors(func: Callable[..., Any]) -> Callable[..., Any]:
    """Every EdgeInferError becomes one line on stderr and exit code 1 (tracebacks with EDGEINFER_DEBUG=1)."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return func(*args, **kwargs)
        except EdgeInferError as exc:
            if os.environ.get(DEBUG_ENV):
                raise
            _fail(" ".join(str(exc).split()))
        except ValueError as exc:  # a wrong argument that only the library could judge
            click.echo(f"edgeinfer: usage error: {' '.join(str(exc).split())}", err=True)
            sys.exit(2)
        except KeyboardInterrupt:
            sys.exit(130)

    return wrapper


def print_json(data: Any) -> None:
    click.echo(json.dumps(data, indent=2, default=str))


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="edgeinfer")
@click.option("-v", "--verbose", count=True, help="More logging (-vv for debug).")
def main(verbose: int) -> None:
    """edgeinfer: run models on edge devices, report to a fleet, roll out updates."""
    level = logging.WARNING - 10 * min(verbose, 2)
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")


# ------------------------------------------------------------------------------------------ info

def _format_spec(spec) -> str:
    quant = f"  scale={spec.scale:.6g} zero_point={spec.zero_point}" if spec.quantized else ""
    shape = "x".join(str(d) for d in spec.shape) or "scalar"
    return f"{spec.name or '(unnamed)'}  {spec.dtype}[{shape}]  {spec.layout or '-'}{quant}"


@main.command()
@click.argument("model", type=click.Path(dir_okay=False, path_type=str))
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@handle_errors
def info(model: str, as_json: bool) -> None:
    """Describe MODEL: format (from its content), tensors, quantisation, custom ops, sha256."""
    from .model import inspect_model

    details = inspect_model(model)
    if as_json:
        print_json(details.to_dict())
        return
    click.echo(f"model    {details.path}")
    click.echo(f"format   {details.format.value}")
    click.echo(f"size     {details.size_bytes:,} bytes")
    click.echo(f"sha256   {details.sha256}")
    for title, specs in (("inputs", details.inputs), ("outputs", details.outputs)):
        click.echo(f"{title}:")
        for spec in specs:
            click.echo(f"  {_format_spec(spec)}")
    if details.associated_files:
        click.echo(f"packed files: {', '.join(details.associated_files)}")
    if details.custom_ops:
        click.echo(f"custom ops: {', '.join(details.custom_ops)}")
    for note in details.notes:
        click.echo(f"note: {note}")


# -------------------------------------------------------------------------------------- classify

@main.command()
@click.argument("model", type=click.Path(dir_okay=False, path_type=str))
@click.argument("images", nargs=-1, required=True, type=click.Path(path_type=str))
@click.option("--labels", type=click.Path(dir_okay=False, path_type=str),
              help="Labels file (one per line). Default: the labels packed in the model, if any.")
@click.option("--top-k", "top_k", default=5, show_default=True, type=click.IntRange(min=1), help="Classes per image.")
@click.option("--delegate", help="Delegate name, optionally with a device (openvino:CPU). Default: the best available.")
@click.option("--threads", type=click.IntRange(min=1), help="Delegate thread count (default: the runtime's).")
@click.option("--resize", type=click.Choice(["stretch", "letterbox", "crop"]), default="stretch", show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print a JSON list, one object per image.")
@handle_errors
def classify(model: str, images: tuple[str, ...], labels: str | None, top_k: int, delegate: str | None,
             threads: int | None, resize: str, as_json: bool) -> None:
    """Classify IMAGES with MODEL and print the top-k classes of each."""
    from ._native import captured_native_stderr
    from .classify import ImageClassifier
    from .delegates import load
    from .labels import Labels

    names = Labels.load(labels) if labels else None
    results = []
    with load(model, delegate, threads=threads) as engine:
        names = names or Labels.embedded(engine.model)
        if engine.fallback_reason and not as_json:
            click.echo(f"note: using {engine.description} ({engine.fallback_reason})", err=True)
        classifier = ImageClassifier(engine, names, top_k=top_k, resize=resize)
        for image in images:
            # libjpeg reports a damaged JPEG on stderr itself; the error below says it in one line
            with captured_native_stderr("OpenCV"):
                top = classifier.classify_file(image)
            results.append({"image": image, "delegate": engine.description,
                            "top": [c.to_dict() for c in top]})
            if not as_json:
                best = ", ".join(f"{c.label} ({c.score:.2f})" for c in top)
                click.echo(f"{image}  [{engine.description}]  {best}")
    if as_json:
        print_json(results)


def _register_command_modules() -> None:
    """Import every module of :mod:`edgeinfer.commands`; each adds its commands to ``main``."""
    import importlib
    import pkgutil

    from . import commands

    for module in sorted(m.name for m in pkgutil.iter_modules(commands.__path__)):
        importlib.import_module(f"{commands.__name__}.{module}")


_register_command_modules()

if __name__ == "__main__":  # pragma: no cover
    # Run as `python -m edgeinfer.cli`: use the importable module's group, on which the command
    # modules registered themselves (this file's own copy, __main__, has only the core commands).
    from edgeinfer.cli import main as registered_main

    registered_main()

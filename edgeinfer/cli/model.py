"""``edgeinfer info`` and ``edgeinfer classify``: a model file, and still images through it."""

from __future__ import annotations

import click

from ..pipeline.preprocess import RESIZE_MODES
from .output import handle_errors, print_json

# ------------------------------------------------------------------------------------------ info

def _format_spec(spec) -> str:
    quant = f"  scale={spec.scale:.6g} zero_point={spec.zero_point}" if spec.quantized else ""
    shape = "x".join(str(d) if d >= 0 else "?" for d in spec.shape) or "scalar"  # ?: a dynamic dimension
    return f"{spec.name or '(unnamed)'}  {spec.dtype}[{shape}]  {spec.layout or '-'}{quant}"


#: class names shown before the rest are counted
SHOWN_NAMES = 8


def _class_names(names) -> str:
    shown = [f"{k}={v}" if k != i else v for i, (k, v) in enumerate(sorted(names.items()))][:SHOWN_NAMES]
    more = f", … (+{len(names) - SHOWN_NAMES} more)" if len(names) > SHOWN_NAMES else ""
    return f"{len(names)}: {', '.join(shown)}{more}"


def _numbers(values: tuple[float, ...]) -> str:
    """``0`` when every channel is the same, else ``[123.7, 116.3, 103.5]``."""
    if len(set(values)) == 1:
        return f"{values[0]:g}"
    return "[" + ", ".join(f"{v:g}" for v in values) + "]"


def _metadata_lines(meta) -> list[tuple[str, str]]:
    """What the model says about itself, one (key, value) per stated field."""
    yes_no = {True: "yes", False: "no"}
    lines = [("task", meta.task), ("classes", _class_names(meta.names) if meta.names else None),
             ("imgsz", f"{meta.imgsz[0]}x{meta.imgsz[1]} (height x width)" if meta.imgsz else None),
             ("stride", meta.stride),
             ("kpt_shape", f"{meta.kpt_shape[0]} keypoints x {meta.kpt_shape[1]} values" if meta.kpt_shape else None),
             ("end2end", yes_no.get(meta.end2end)),
             ("normalise", f"(pixel - {_numbers(meta.mean)}) / {_numbers(meta.std)}"
              if meta.mean and meta.std else None),
             ("channels", meta.channels.upper() if meta.channels else None),
             ("letterbox", None if meta.letterbox is None else
              yes_no[meta.letterbox] + (f", {meta.pad}" if meta.letterbox and meta.pad else "")
              + (f", padded with {meta.pad_value}" if meta.letterbox and meta.pad_value is not None else ""))]
    return [(key, str(value)) for key, value in lines if value is not None]


def _feed(details) -> dict:
    """What a run feeds the model, with no option given: its output layout's family and its metadata decide
    (``tasks.read_model_file``); the effective normalisation and the input's tensor layout with it."""
    from ..pipeline.preprocess import DEFAULT_FLOAT_MEAN, DEFAULT_FLOAT_STD
    from ..pipeline.tasks import read_model_file

    layout, task, feed = read_model_file(details, refuse=False)
    spec = details.inputs[0] if details.inputs else None
    mean, std = feed["mean"], feed["std"]
    if mean is None and std is None and spec is not None and spec.dtype != "uint8":
        # the Preprocessor's own default: [-1, 1] for a float input, (pixel - 128) / 128 quantised for an int8 one
        mean, std = (DEFAULT_FLOAT_MEAN, DEFAULT_FLOAT_STD) if spec.dtype.startswith("float") else (128.0, 128.0)
    scale = {"scale": spec.scale, "zero_point": spec.zero_point} if spec is not None and spec.quantized else None
    return {"decoder": layout.name if layout else None, "task": task, **feed, "mean": mean, "std": std,
            "quantized": scale, "input_layout": spec.layout if spec is not None else None,
            "refused": dict(details.metadata.refused)}


def _feed_line(feed: dict) -> str:
    values = "pixels as they are (uint8)" if feed["mean"] is None else \
        f"(pixel - {_numbers(_tuple(feed['mean']))}) / {_numbers(_tuple(feed['std']))}"
    if feed["quantized"] and feed["mean"] is not None:
        values += f", quantised (scale {feed['quantized']['scale']:.6g}, zero point {feed['quantized']['zero_point']})"
    resize = feed["resize"]
    if resize == "letterbox":
        border = "centred" if feed["pad"] == "centre" else "the image top-left, the border bottom-right"
        resize = f"letterbox ({border}, grey {feed['pad_value']})"
    family = f" ({feed['decoder']}'s)" if feed["decoder"] else \
        " (the output layout is not told from the file alone: its metadata's and the defaults; a run says)"
    return f"{resize}, {feed['channels'].upper()}, {values}, {feed['input_layout'] or '-'}{family}"


def _tuple(value) -> tuple[float, ...]:
    return tuple(value) if isinstance(value, (list, tuple)) else (float(value),)


def _echo_metadata(meta) -> None:
    if meta.empty:
        click.echo("metadata: none (the model states no task, classes or input size)")
        return
    producer = f", {meta.producer}" if meta.producer else ""
    click.echo(f"metadata ({meta.source}{producer}):")
    for key, value in _metadata_lines(meta):
        click.echo(f"  {key:<10} {value}")


@click.command()
@click.argument("model", type=click.Path(dir_okay=False, path_type=str))
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@handle_errors
def info(model: str, as_json: bool) -> None:
    """Describe MODEL: format (from its content), tensors, quantisation, custom ops, sha256, what the
    model says about itself (task, class names, input size, normalisation: its metadata), and what a run feeds it
    (resize, letterbox border, channel order, normalisation: its metadata, else its output layout's family)."""
    from ..runtime.model import inspect_model

    details = inspect_model(model)
    feed = _feed(details)
    if as_json:
        print_json({**details.to_dict(), "feed": feed})
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
    _echo_metadata(details.metadata)
    click.echo(f"fed      {_feed_line(feed)}")
    for problem in feed["refused"].values():
        click.echo(f"refused: {problem} (a run needs it fixed, or --channels / --pad)")
    for note in details.notes:
        click.echo(f"note: {note}")


# -------------------------------------------------------------------------------------- classify

@click.command()
@click.argument("model", type=click.Path(dir_okay=False, path_type=str))
@click.argument("images", nargs=-1, required=True, type=click.Path(path_type=str))
@click.option("--labels", type=click.Path(dir_okay=False, path_type=str),
              help="Labels file (one per line). Default: the labels packed in the model, if any.")
@click.option("--top-k", "top_k", default=5, show_default=True, type=click.IntRange(min=1), help="Classes per image.")
@click.option("--delegate", help="Delegate name, optionally with a device (openvino:CPU). Default: the best available.")
@click.option("--threads", type=click.IntRange(min=1),
              help="Delegate thread count (default: the profile's, else every core this process may use; "
                   "`edgeinfer device` says how many).")
@click.option("--resize", type=click.Choice(RESIZE_MODES), default="stretch", show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print a JSON list, one object per image.")
@handle_errors
def classify(model: str, images: tuple[str, ...], labels: str | None, top_k: int, delegate: str | None,
             threads: int | None, resize: str, as_json: bool) -> None:
    """Classify IMAGES with MODEL and print the top-k classes of each."""
    from ..pipeline.classify import ImageClassifier
    from ..pipeline.labels import Labels
    from ..runtime.selection import load
    from ..util.native import captured_native_stderr

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

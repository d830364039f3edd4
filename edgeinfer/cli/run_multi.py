"""``edgeinfer run`` with several ``--source``: one engine serving every stream (MultiPipeline)."""

from __future__ import annotations

import json
import sys
import time
from typing import Any

import click

#: seconds between status lines
STATUS_PERIOD_S = 2.0


def stream_names(sources: tuple[str, ...]) -> dict[str, str]:
    """``NAME=SOURCE`` names a stream; others are stream0, stream1, ... (a ValueError for a repeated name)."""
    named: dict[str, str] = {}
    for index, text in enumerate(sources):
        name, sep, rest = text.partition("=")
        if sep and name.isidentifier() and "://" not in name:
            key, value = name, rest
        else:
            key, value = f"stream{index}", text
        if key in named:
            raise click.BadParameter(f"two streams are named {key!r}", param_hint="--source")
        named[key] = value
    return named


def run_streams(model: str, sources: tuple[str, ...], *, batch: int | None, as_json: bool,
                preview: tuple[str, int] | None = None, **options: Any) -> None:
    """Run every stream until each ends (files), ``max_frames`` results in all, or Ctrl-C; then a summary;
    ``preview``: the first stream as MJPEG at that address."""
    from ..pipeline.multi import MultiPipeline
    from .delegate_choice import delegate_choice, say_delegate_choice
    from .preview import previewing

    named = stream_names(sources)

    def on_result(result: Any) -> None:
        if as_json:
            sys.stdout.write(json.dumps({"type": "result", **result.to_dict()}) + "\n")

    interrupted = False
    with MultiPipeline(model, named, batch=batch, **options) as multi, previewing(multi, preview, next(iter(named))):
        choice = delegate_choice(multi.engine)
        say_delegate_choice(choice)
        if options.get("events"):
            from .run_events import event_printer

            multi.add_event_listener(event_printer(as_json, False))
        multi.start(on_result)
        next_status = time.monotonic() + STATUS_PERIOD_S
        try:
            while not multi.wait(0.2):
                if not as_json and time.monotonic() >= next_status:
                    next_status = time.monotonic() + STATUS_PERIOD_S
                    window = multi.take_window()
                    click.echo("  ".join(f"{name} {s.fps:5.1f} fps" for name, s in window.items()))
        except KeyboardInterrupt:
            interrupted = True
        multi.stop()
        stats = multi.stats()
        fairness = multi.fairness()
        invokes = multi.invokes
    total = sum(s.frames for s in stats.values())
    if as_json:
        summary = {"type": "summary", "streams": {name: s.to_dict() for name, s in stats.items()},
                   "frames": total, "fps": round(sum(s.fps for s in stats.values()), 3),
                   "fairness": round(fairness, 3), "invokes": invokes,
                   "delegate_choice": choice.to_dict() if choice else None}
        sys.stdout.write(json.dumps(summary) + "\n")
    else:
        for name, s in stats.items():
            click.echo(f"{name}: {s.frames} frames, {s.fps:.1f} fps, dropped {s.dropped}, on {s.delegate}")
        click.echo(f"{len(stats)} streams: {total} frames in {invokes} invokes, "
                   f"{sum(s.fps for s in stats.values()):.1f} fps in all, fairness {fairness:.2f} (slowest / fastest)")
    if interrupted:
        sys.exit(130)

"""What every command shares: one error line and an exit code, JSON output."""

from __future__ import annotations

import functools
import json
import os
import sys
from collections.abc import Callable
from typing import Any

import click

from ..errors import EdgeInferError

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


def parse_values(text: str | None, *, nonzero: bool = False) -> float | tuple[float, ...] | None:
    """``--mean`` / ``--std``: ``"128"`` -> 128.0; ``"123.7,116.3,103.5"`` -> a per-channel (R, G, B) tuple.
    ``nonzero``: a value of 0 is refused too (a standard deviation divides)."""
    if text is None:
        return None
    try:
        values = tuple(float(part) for part in text.split(","))
    except ValueError:
        raise click.BadParameter(f"{text!r} is not a number or a comma-separated list of 3 numbers") from None
    if len(values) not in (1, 3):
        raise click.BadParameter(f"{text!r}: give one value or three (R,G,B)")
    if nonzero and any(v == 0 for v in values):
        raise click.BadParameter(f"{text!r}: none zero (it divides)")
    return values[0] if len(values) == 1 else values

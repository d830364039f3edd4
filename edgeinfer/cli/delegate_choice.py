"""How ``run`` says the delegate probe's choice: the runtime chosen by measurement, each one's figures, the cache."""

from __future__ import annotations

from typing import TYPE_CHECKING

import click

if TYPE_CHECKING:
    from ..runtime.choice import ProbeResult


def delegate_choice(engine: object) -> ProbeResult | None:
    """What the delegate probe measured and chose for ``engine`` (None: a delegate was named, or no probe ran)."""
    return getattr(getattr(engine, "selection", None), "probe", None)


def say_delegate_choice(choice: ProbeResult | None) -> None:
    """The probe's choice and figures on stderr (``--json`` keeps stdout to JSON lines: its summary has them)."""
    if choice is None:
        return
    for note in choice.notes:
        click.echo(f"warning: {note}", err=True)
    click.echo(f"note: {choice.summary()}", err=True)

"""The ``edgeinfer`` command line. Thin: parse, call the library, print a table or ``--json``.

One module per command (or command group); each defines plain click commands and this module
names them in :data:`COMMANDS`, explicitly; a command's module is imported when that command runs.
Command modules import nothing heavy at top level either: the CLI must start fast and stay small.
"""

from __future__ import annotations

import importlib
import logging

import click

from .._version import __version__
from .output import handle_errors, print_json

#: every command: its name -> (module of this package, the click command in it). Imported when it runs
#: (or when --help lists it): ``edgeinfer agent`` on a device never loads the fleet's, the optimiser's or
#: the benchmarks' imports (10 MiB resident when every command module was imported up front).
COMMANDS = {
    "info": ("model", "info"), "classify": ("model", "classify"), "run": ("run", "run"),
    "device": ("device", "device"), "doctor": ("device", "doctor"), "bench": ("bench", "bench"),
    "optimize": ("optimize", "optimize"), "agent": ("agent", "agent"), "fleet": ("fleet", "fleet"),
    "deploy": ("fleet", "deploy"), "keys": ("keys", "keys"), "demo": ("demo", "demo"),
    "evaluate": ("evaluate", "evaluate"),
}


class LazyGroup(click.Group):
    """A click group whose commands are imported on first use (click's documented lazy-loading pattern)."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        spec = COMMANDS.get(cmd_name)
        if spec is None:
            return None
        module = importlib.import_module(f"{__name__}.{spec[0]}")
        return getattr(module, spec[1])


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="edgeinfer")
@click.option("-v", "--verbose", count=True, help="More logging (-vv for debug).")
def main(verbose: int) -> None:
    """edgeinfer: run models on edge devices, report to a fleet, roll out updates."""
    level = logging.WARNING - 10 * min(verbose, 2)
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")


__all__ = ["COMMANDS", "handle_errors", "main", "print_json"]

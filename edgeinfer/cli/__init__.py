"""The ``edgeinfer`` command line. Thin: parse, call the library, print a table or ``--json``.

One module per command (or command group); each defines plain click commands and this module
registers them on :func:`main`, explicitly. Command modules import nothing heavy at top level:
the CLI must start fast.
"""

from __future__ import annotations

import logging

import click

from .._version import __version__
from .agent import agent
from .bench import bench
from .demo import demo
from .device import device, doctor
from .fleet import deploy, fleet
from .keys import keys
from .model import classify, info
from .optimize import optimize
from .output import handle_errors, print_json
from .run import run


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="edgeinfer")
@click.option("-v", "--verbose", count=True, help="More logging (-vv for debug).")
def main(verbose: int) -> None:
    """edgeinfer: run models on edge devices, report to a fleet, roll out updates."""
    level = logging.WARNING - 10 * min(verbose, 2)
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")


for _command in (info, classify, run, device, doctor, bench, optimize, agent, fleet, deploy, keys, demo):
    main.add_command(_command)

__all__ = ["handle_errors", "main", "print_json"]

"""CLI commands that live in their own modules.

Every module in this package is imported by :mod:`edgeinfer.cli` and registers its commands on
``edgeinfer.cli.main``. Modules import nothing heavy at top level: the CLI must start fast.
"""

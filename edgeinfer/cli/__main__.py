"""``python -m edgeinfer.cli`` runs the CLI."""

from . import main

main()

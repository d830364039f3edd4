"""``python -m edgeinfer`` runs the CLI."""

from .cli import main

main()

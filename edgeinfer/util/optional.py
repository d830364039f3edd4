"""Optional packages, imported on first use: a missing one is a MissingDependency naming its pip extra."""

from __future__ import annotations

import importlib
from types import ModuleType

from ..errors import MissingDependency


def import_optional(module: str, extra: str, purpose: str) -> ModuleType:
    """Import ``module``; MissingDependency saying what needs it and which pip extra provides it."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise MissingDependency(
            f"{purpose} needs the python module {module!r} ({exc}) — pip install 'edgeinfer[{extra}]'"
        ) from exc

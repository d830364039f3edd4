"""What a delegate is: a named way to turn a model file into an :class:`~edgeinfer.runtime.engine.Engine`."""

from __future__ import annotations

import importlib
from abc import ABC, abstractmethod
from types import ModuleType
from typing import TYPE_CHECKING, ClassVar

from ...errors import DelegateUnavailable
from ..engine import Engine
from ..model import ModelFormat, ModelInfo

if TYPE_CHECKING:
    from ...device.host import Host


class Delegate(ABC):
    """A runtime backend. Subclasses set ``name`` / ``formats`` and implement ``load``.

    ``unavailable_reason()`` returns None when the delegate can run here, else a sentence a person
    can act on. It must be cheap-ish and never raise. ``host`` is what device detection read from a
    root filesystem: hardware and system-library checks read it (so a fake root in a test, or
    ``edgeinfer device --root``, sees the device it describes); Python-module checks are always
    about this interpreter. Delegates written before ``host`` existed may omit the parameter.
    """

    name: ClassVar[str]
    formats: ClassVar[frozenset[ModelFormat]]
    #: the pip extra that installs this delegate's runtime
    extra: ClassVar[str] = ""
    #: the distributions its runtime comes from: the delegate probe's cached choice is kept per their versions
    #: (a new version is measured again; docs/profiles.md)
    packages: ClassVar[tuple[str, ...]] = ()

    def unavailable_reason(self, device: str | None = None, host: Host | None = None) -> str | None:
        """None if this delegate can run here (on ``device``), else why not."""
        return None

    def unsupported_reason(self, model: ModelInfo) -> str | None:
        """None if this delegate can run ``model``'s format, else why not."""
        if model.format in self.formats:
            return None
        accepted = ", ".join(sorted(f.value for f in self.formats))
        return f"cannot read {model.format.value} models (reads {accepted})"

    @abstractmethod
    def load(self, model: ModelInfo, *, threads: int | None = None, device: str | None = None) -> Engine:
        """Load ``model`` and return a ready engine (inputs allocated, views bound)."""

    def check(self, model: ModelInfo, device: str | None = None) -> None:
        """Raise DelegateUnavailable if this delegate cannot run ``model`` here."""
        reason = self.unavailable_reason(device) or self.unsupported_reason(model)
        if reason:
            raise DelegateUnavailable(self.name, reason)


def import_runtime(module: str, delegate: str, extra: str) -> ModuleType:
    """Import a vendor runtime on first use; DelegateUnavailable with the install hint if missing."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise DelegateUnavailable(
            delegate, f"python module {module!r} is not installed ({exc}) — pip install 'edgeinfer[{extra}]'"
        ) from exc


def runtime_missing_reason(module: str, extra: str) -> str | None:
    """Reason text if ``module`` cannot be found, without importing it."""
    import importlib.util

    try:
        found = importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        found = False
    return None if found else f"python module {module!r} is not installed — pip install 'edgeinfer[{extra}]'"

"""What ``edgeinfer bench`` measures: every model paired with every delegate that can read it here."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass

from ...runtime.model import ModelInfo, inspect_model


@dataclass(frozen=True)
class Target:
    """One model on one delegate (``name`` or ``name:device``)."""

    model: ModelInfo
    delegate: str


def plan_targets(models: Sequence[str | os.PathLike], delegates: Sequence[str] | None = None
                 ) -> tuple[list[Target], list[dict[str, str]]]:
    """Pair every model with every delegate that can read it here; the rest are skipped with a reason.

    ``delegates`` None means every registered delegate. A delegate name that is not registered is
    a ValueError (a typo, not a machine property).
    """
    from ...runtime.delegates.registry import delegate_names, get_delegate, split_delegate

    infos = [inspect_model(m) for m in models]
    names = list(delegates) if delegates else delegate_names()
    targets: list[Target] = []
    skipped: list[dict[str, str]] = []
    for spec in names:
        name, device = split_delegate(spec)
        delegate = get_delegate(name)  # ValueError for an unknown name
        unavailable: list[str | None] = []  # asked once per delegate, only if some model fits it
        for info in infos:
            reason = delegate.unsupported_reason(info)
            if reason is None:
                if not unavailable:
                    unavailable.append(delegate.unavailable_reason(device))
                reason = unavailable[0]
            if reason:
                skipped.append({"model": info.path, "delegate": spec, "reason": reason})
            else:
                targets.append(Target(info, spec))
    return targets, skipped

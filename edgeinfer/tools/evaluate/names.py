"""A dataset's class names matched to a model's by name, never by position: field data is labelled by people
whose class list rarely has the model's order."""

from __future__ import annotations

from collections.abc import Iterable

from ...errors import DatasetError

#: model names listed in full in a mismatch error up to this many; beyond it, the count and the first ones
MAX_LISTED = 40


def _forms(name: str) -> set[str]:
    """The spellings a name matches as: case, ``_``/``-`` for spaces, and each comma-separated synonym
    (ImageNet's "tench, Tinca tinca")."""
    def fold(text: str) -> str:
        return " ".join(text.replace("_", " ").replace("-", " ").lower().split())

    return {fold(name)} | {fold(part) for part in name.split(",") if part.strip()}


def match_names(dataset: Iterable[str], model: dict[int, str], *, ignore_unknown: bool = False,
                model_path: str = "the model") -> dict[str, int]:
    """Each dataset class name → the model's class id of that name. A name the model does not know is an
    DatasetError listing both sides, unless ``ignore_unknown`` (it is then left out of the mapping)."""
    exact = {name: cid for cid, name in model.items()}
    folded: dict[str, int] = {}
    for cid, name in sorted(model.items()):
        for form in _forms(name):
            folded.setdefault(form, cid)
    mapping, unknown = {}, []
    for name in dataset:
        cid = exact.get(name)
        if cid is None:
            cid = next((folded[f] for f in sorted(_forms(name)) if f in folded), None)
        if cid is None:
            unknown.append(name)
        else:
            mapping[name] = cid
    if unknown and not ignore_unknown:
        raise DatasetError(_mismatch(unknown, model, model_path))
    return mapping


def _mismatch(unknown: list[str], model: dict[int, str], model_path: str) -> str:
    names = [model[i] for i in sorted(model)]
    listed = ", ".join(names[:MAX_LISTED]) + (f", … ({len(names)} in all)" if len(names) > MAX_LISTED else "")
    return (f"the dataset's classes {', '.join(map(repr, unknown))} are not among {model_path}'s class names "
            f"({listed or 'none: pass --labels FILE'}); rename them in the dataset, pass the model's --labels, "
            "or --ignore-unknown-classes to leave them out")

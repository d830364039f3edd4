"""The fleet's configuration layers, pure: what a layer may hold, how layers merge into a device's document, where
each key of it comes from, the diff between two documents, and secrets kept out of every answer.

A **layer** is a partial configuration document (``link/config_document.py``: ``pipelines`` and the agent keys
beside them) set for the whole fleet (a fleet name, the topic level), for a group, or for one device. A device's
**effective document** is its layers merged in this order, each over the ones before it:

    the fleet's layer → its groups' layers, in the order the device lists its groups (agent.yaml) → its own layer

The merge, key by key (:func:`merge`):

- a key a layer sets replaces what the layers before it set; objects (``probe_backoff``, ``backoff``) merge key by
  key the same way, recursively; anything else — numbers, text, lists (``lines``, ``zones``, ``events``,
  ``capture``, ``sources``) — is replaced whole;
- ``pipelines`` merge **by name**: a layer's pipeline merges key by key into the pipeline of that name the layers
  before it made (or adds one, after theirs); a pipeline without ``name`` is named by its place in its own layer as
  the device names it (``main``, ``pipeline1``, ...);
- ``null`` removes: a key set to null is as if no layer before had set it (the device's agent.yaml or the option's
  default applies); ``{"name": P, "$patch": "delete"}`` in ``pipelines`` removes pipeline P (Kubernetes' strategic
  merge patch spells deletion the same way).

The device's own ``agent.yaml`` is under all of them: what the effective document leaves out, agent.yaml says (its
top-level keys; a document that sets ``pipelines`` sets every pipeline the device runs). The layer each key of the
effective document came from is :attr:`Effective.origins`.

A layer is checked alone with the schema the device checks its document with (:func:`layer_problems`: the same
words, the same validator, without the keys only a whole document must have). A secret in a document — a password
in a source URL, a ``password=`` in a GStreamer pipeline — is stored as given and shown only masked (``util.redact``'s
``***``); a document sent back with the masked text where the secret was keeps the stored secret
(:func:`restore_secrets`).
"""

from __future__ import annotations

import copy
import hashlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ..link.config_document import CONFIG_SCHEMA, default_pipeline_name, document_problems, encode_document, normalised
from ..link.config_schema import BOOTSTRAP_KEYS
from ..link.schema_check import schema_errors
from ..link.vocabulary import Word
from ..util.redact import MASK, redact, redact_values

#: the marker that removes a pipeline of the layers before: {"name": P, "$patch": "delete"}
PATCH = "$patch"
DELETE = "delete"


class Scope(Word):
    """Which devices a layer is for, from the widest to the narrowest (the order the layers merge in)."""

    #: every device of a fleet (the topic level a device publishes in: `fleet` in agent.yaml, `default` unless told)
    FLEET = "fleet"
    #: every device that lists the group in its agent.yaml's `groups`
    GROUP = "group"
    #: one device
    DEVICE = "device"


@dataclass(frozen=True, order=True)
class LayerKey:
    """A layer's identity: its scope and the fleet's, the group's or the device's name."""

    scope: Scope
    name: str

    @property
    def label(self) -> str:
        """``group:lobby``: how answers, the audit log and the CLI name a layer."""
        return f"{Scope(self.scope).value}:{self.name}"

    @classmethod
    def parse(cls, label: str) -> LayerKey:
        scope, _, name = label.partition(":")
        return cls(Scope(scope), name)


def layers_of(fleet: str, groups: Iterable[str], device_id: str) -> list[LayerKey]:
    """The layers a device's document is made of, in the order they merge (the later wins)."""
    seen: list[str] = []
    for group in groups:
        if group not in seen:
            seen.append(group)
    return [LayerKey(Scope.FLEET, fleet), *(LayerKey(Scope.GROUP, g) for g in seen), LayerKey(Scope.DEVICE, device_id)]


# ----------------------------------------------------------------------------------------------- checking a layer

def _partial(schema: Mapping[str, Any]) -> dict[str, Any]:
    """``schema`` as a layer's: objects that merge key by key require no key (a whole document must have ``model``;
    a layer may set only a threshold). Lists are replaced whole, so what their items require stays required."""
    out = {key: value for key, value in schema.items() if key != "required"}
    if isinstance(schema.get("properties"), Mapping):
        out["properties"] = {key: _partial(value) if value.get("type") == "object" else value
                             for key, value in schema["properties"].items()}
        pipelines = schema["properties"].get("pipelines")
        if isinstance(pipelines, Mapping) and isinstance(pipelines.get("items"), Mapping):
            out["properties"]["pipelines"] = {**pipelines, "items": _partial(pipelines["items"])}
    return out


#: the JSON Schema of a layer: the document's, with nothing required where keys merge one by one
LAYER_SCHEMA: dict[str, Any] = {**_partial(CONFIG_SCHEMA), "title": "configuration layer",
                                "description": "A layer of a device's configuration (fleet, group or device): the "
                                               "keys it sets of the document. docs/fleet.md, Configuration."}


def _key(path: str) -> str:
    """A schema_check path as the document's key (``$.pipelines[0].max_fps`` → ``pipelines[0].max_fps``), as
    ``agent --check`` names it."""
    return path[2:] if path.startswith("$.") else "(top level)" + path[1:]


def _deletions(pipelines: list[Any]) -> tuple[list[Any], list[str]]:
    """The layer's pipelines without its deletion markers (each of them a null: left out by the check), and what
    is wrong with a marker."""
    kept, problems = [], []
    for index, item in enumerate(pipelines):
        if isinstance(item, dict) and PATCH in item:
            if item.get(PATCH) != DELETE or set(item) != {"name", PATCH}:
                problems.append(f"pipelines[{index}].{PATCH}: must be {DELETE!r}, beside the pipeline's name and "
                                "nothing else")
            kept.append(None)
        else:
            kept.append(item)
    return kept, problems


def layer_problems(layer: Any) -> list[str]:
    """Every way ``layer`` is not a layer a device could take, each naming its key in the words ``agent --check``
    uses; empty when it is one. Keys a whole document must have (``model``, a source) may be left to other layers."""
    if not isinstance(layer, dict):
        return [f"(top level): must be an object, got {type(layer).__name__}"]
    bootstrap = {key: value for key, value in layer.items() if key in BOOTSTRAP_KEYS}
    if bootstrap:  # agent.yaml's alone: said as the document's check says it
        return document_problems(bootstrap)
    problems: list[str] = []
    checked = dict(layer)
    if isinstance(layer.get("pipelines"), list):
        pipelines, problems = _deletions(layer["pipelines"])
        checked["pipelines"] = [item for item in pipelines if item is not None]
        positions = [index for index, item in enumerate(pipelines) if item is not None]
    for problem in schema_errors(normalised(checked, LAYER_SCHEMA), LAYER_SCHEMA):
        path, _, words = problem.partition(": ")
        where = _key(path)
        if where.startswith("pipelines[") and isinstance(layer.get("pipelines"), list):
            index, _, rest = where[len("pipelines["):].partition("]")  # its place in the layer as sent
            if index.isdigit() and int(index) < len(positions):
                where = f"pipelines[{positions[int(index)]}]{rest}"
        problems.append(f"{where}: {words}")
    if not problems and isinstance(layer.get("pipelines"), list):
        names = [_name(item, index) for index, item in enumerate(layer["pipelines"])]
        for name in sorted({n for n in names if names.count(n) > 1}):
            problems.append(f"pipelines: two pipelines are named {name!r}; names must be unique")
    return problems


def _name(item: Any, index: int) -> str:
    return str(item.get("name") or default_pipeline_name(index)) if isinstance(item, dict) else \
        default_pipeline_name(index)


# ----------------------------------------------------------------------------------------------- merging

@dataclass
class Effective:
    """A device's effective document, what each of its keys came from, and the layers that made it."""

    document: dict[str, Any]
    #: a key's path (:func:`paths`) → the label of the layer that set it (``group:lobby``)
    origins: dict[str, str] = field(default_factory=dict)
    #: the layers that set anything, in merge order, with their revisions
    layers: list[tuple[LayerKey, int]] = field(default_factory=list)

    @property
    def empty(self) -> bool:
        """No layer sets anything: the device runs its agent.yaml as it is."""
        return not self.document

    def sha256(self) -> str:
        return hashlib.sha256(encode_document(self.document)).hexdigest()


def _merge_value(below: Any, above: Any) -> Any:
    """``above`` over ``below``: objects key by key (a null removes), anything else replaced whole."""
    if isinstance(below, dict) and isinstance(above, dict):
        merged = dict(below)
        for key, value in above.items():
            if value is None:
                merged.pop(key, None)
            else:
                merged[key] = _merge_value(merged.get(key), value)
        return merged
    return copy.deepcopy(above)


def merge(layers: Iterable[tuple[LayerKey, int, Mapping[str, Any]]]) -> Effective:
    """The effective document of ``(layer, revision, document)`` in merge order (the later wins), with each key's
    origin. Layers are merged as stored: run :func:`layer_problems` on a layer before storing it."""
    document: dict[str, Any] = {}
    pipelines: dict[str, dict[str, Any]] | None = None
    origins: dict[str, str] = {}
    used: list[tuple[LayerKey, int]] = []
    for key, revision, layer in layers:
        if not layer:
            continue
        used.append((key, revision))
        for name, value in layer.items():
            if name == "pipelines":
                if value is None:
                    pipelines = None
                elif value or pipelines is not None:  # an empty list adds nothing to nothing
                    pipelines = _merge_pipelines(pipelines or {}, value)
                _claim(origins, key.label, "pipelines", None if value is None else _pipeline_view(value))
            elif value is None:
                document.pop(name, None)
                _claim(origins, key.label, name, None)
            else:
                document[name] = _merge_value(document.get(name), value)
                _claim(origins, key.label, name, value)
    if pipelines is not None:
        document["pipelines"] = list(pipelines.values())
    live = set(paths(document))
    return Effective(document, {path: label for path, label in origins.items() if path in live}, used)


def _merge_pipelines(below: dict[str, dict[str, Any]], items: list[Any]) -> dict[str, dict[str, Any]]:
    merged = dict(below)
    for index, item in enumerate(items):
        name = _name(item, index)
        if item.get(PATCH) == DELETE:
            merged.pop(name, None)
            continue
        merged[name] = {"name": name, **_merge_value(merged.get(name, {}), {k: v for k, v in item.items()
                                                                           if k != "name"})}
    return merged


def _pipeline_view(items: list[Any]) -> dict[str, Any]:
    """A layer's pipelines as :func:`paths` walks them: by name (a deletion removes every key of its pipeline)."""
    return {_name(item, index): None if item.get(PATCH) == DELETE else {"name": _name(item, index), **item}
            for index, item in enumerate(items)}


def _claim(origins: dict[str, str], label: str, top: str, value: Any) -> None:
    """The keys under ``top`` that ``value`` sets are ``label``'s now; a null drops the claims beneath it."""
    if value is None:
        for path in [p for p in origins if p == top or p.startswith((f"{top}.", f"{top}["))]:
            del origins[path]
        return
    if top == "pipelines":
        for name, item in value.items():
            introduced = f"pipelines[{name}].name" in origins  # a pipeline's name is the layer's that made it
            _claim(origins, label, f"pipelines[{name}]", item if item is None or not introduced else
                   {key: part for key, part in item.items() if key != "name"})
        return
    if isinstance(value, dict):
        for key, item in value.items():
            _claim(origins, label, f"{top}.{key}", item)
        return
    origins[top] = label


def paths(document: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Every key of ``document`` as a flat path → value: ``telemetry_interval_s``, ``pipelines[main].max_fps``,
    ``pipelines[main].probe_backoff.initial_s``; a list other than ``pipelines`` is one value."""
    flat: dict[str, Any] = {}
    for key, value in document.items():
        path = f"{prefix}.{key}" if prefix else key
        if key == "pipelines" and not prefix and isinstance(value, list):
            for index, item in enumerate(value):
                if isinstance(item, dict):
                    flat |= paths(item, f"pipelines[{_name(item, index)}]")
        elif isinstance(value, dict):
            flat |= paths(value, path)
        else:
            flat[path] = value
    return flat


# ----------------------------------------------------------------------------------------------- diffs and secrets

def diff(before: Mapping[str, Any], after: Mapping[str, Any]) -> list[dict[str, Any]]:
    """What changed from ``before`` to ``after``, key by key (:func:`paths`): ``{"path", "op": add | remove |
    change, "before", "after"}``, values masked; ``"secret": true`` when only a secret in it changed."""
    old, new = paths(before), paths(after)
    changes = []
    for path in sorted(old.keys() | new.keys()):
        if path in old and path in new and old[path] == new[path]:
            continue
        entry: dict[str, Any] = {"path": path, "op": "change" if path in old and path in new else
                                 "add" if path in new else "remove"}
        if path in old:
            entry["before"] = redact_values(old[path])
        if path in new:
            entry["after"] = redact_values(new[path])
        if entry.get("before") == entry.get("after") and entry["op"] == "change":
            entry["secret"] = True
        changes.append(entry)
    return changes


def redacted(document: Any) -> Any:
    """``document`` with every secret masked (``rtsp://user:***@host``): what any answer, log or diff shows."""
    return redact_values(document)


def _strings(value: Any, path: str = "") -> Iterable[tuple[str, str]]:
    if isinstance(value, str):
        yield path, value
    elif isinstance(value, dict):
        for key, item in value.items():
            yield from _strings(item, f"{path}.{key}" if path else str(key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from _strings(item, f"{path}[{index}]")


def restore_secrets(document: Any, stored: Any) -> Any:
    """``document`` with each masked text (as an answer showed it: ``rtsp://user:***@host``) replaced by the stored
    text it masks, so an operator who sends back what they read keeps the secret. The same key's stored text is
    preferred; else any stored text of the layer that masks to it. ValueError naming the key when a masked text
    masks nothing stored (give the secret itself)."""
    originals: dict[str, dict[str, str]] = {}  # masked text -> {path: original}
    for path, text in _strings(stored):
        masked = redact(text)
        if masked != text:
            originals.setdefault(masked, {})[path] = text

    def restore(value: Any, path: str) -> Any:
        if isinstance(value, dict):
            return {key: restore(item, f"{path}.{key}" if path else str(key)) for key, item in value.items()}
        if isinstance(value, list):
            return [restore(item, f"{path}[{index}]") for index, item in enumerate(value)]
        if not isinstance(value, str) or MASK not in value:
            return value
        found = originals.get(value, {})
        if path in found:
            return found[path]
        if len(set(found.values())) == 1:
            return next(iter(found.values()))
        problem = "matches several stored secrets" if found else "matches no secret stored in this layer"
        raise ValueError(f"{path}: holds a masked secret ({MASK}) that {problem}; give the secret itself")

    return restore(document, "")

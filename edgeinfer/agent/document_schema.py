"""The JSON Schema of a device's configuration document, derived from the one definition and written into ``link/``.

A document (``edgeinfer/link/config_document.py``) holds the keys of ``agent.yaml`` the fleet may set: ``pipelines``
(each entry a :class:`~.pipeline_config.PipelineConfig`: every ``PipelineOptions`` field and the agent's own) and
:data:`FLEET_AGENT_KEYS`. :func:`document_schema` reads each pipeline key's type annotation, its ``choices`` and its
bounds (``minimum``, ``exclusiveMinimum``, ... — the field metadata ``PipelineOptions.__post_init__`` checks) and its
default; nothing here lists an option. The fleet manager may not import the pipeline or the agent, so the schema is
committed as data (``edgeinfer/link/config_schema.py``), regenerated with::

    python -m edgeinfer.agent.document_schema > edgeinfer/link/config_schema.py

and ``tests/link/test_config_schema.py`` fails when the committed one is stale.
"""

from __future__ import annotations

import dataclasses
import json
import os
import typing
from collections.abc import Mapping
from typing import Any

from ..link.config_document import MAX_LIST_ITEMS, MAX_PIPELINES, MAX_TEXT_CHARS, SOURCE_FORMS
from ..link.protocol import ID_PATTERN, MAX_STREAMS
from ..pipeline.labels import Labels
from ..pipeline.options import RENAMED_OPTIONS
from ..util.config import BOUND_WORDS
from .config import MAX_TELEMETRY_INTERVAL_S, MIN_TELEMETRY_INTERVAL_S, TOP_KEYS
from .pipeline_config import PipelineConfig, members_of

#: the agent's own top-level keys the fleet may set besides ``pipelines`` (each read by config.py with these bounds)
FLEET_AGENT_KEYS = {
    "telemetry_interval_s": {"type": "number", "minimum": MIN_TELEMETRY_INTERVAL_S,
                             "maximum": MAX_TELEMETRY_INTERVAL_S, "default": 1.0},
}
#: how a WIDTHxHEIGHT text looks (``size: 640x480``; the reader also takes ``[640, 480]``)
PAIR_PATTERN = r"^\s*\d+\s*[xX×]\s*\d+\s*$"
_TEXT = {"type": "string", "minLength": 1, "maxLength": MAX_TEXT_CHARS}
# errorMessage: the value's form in words, which link/schema_check.py says instead of the keywords it broke
_ID = {"type": "string", "pattern": ID_PATTERN,
       "errorMessage": "must be 1-64 of A-Z a-z 0-9 . _ - (starting with a letter or digit)"}
_SOURCE = {"type": ["string", "integer"], "minLength": 1, "maxLength": MAX_TEXT_CHARS, "minimum": 0,
           "errorMessage": f"must be a source ({SOURCE_FORMS})"}
#: the agent's own keys of a pipeline entry (the options' are derived)
_AGENT_PIPELINE_KEYS: dict[str, dict[str, Any]] = {
    "name": _ID,
    "model": _TEXT,
    "source": _SOURCE,
    "sources": {"type": "array", "minItems": 1, "maxItems": MAX_STREAMS,
                "errorMessage": f"must be a list of 1 to {MAX_STREAMS} sources, each a source or {{name: NAME, "
                                f"source: SOURCE}}",
                "items": {"type": ["string", "integer", "object"], "minLength": 1, "maxLength": MAX_TEXT_CHARS,
                          "minimum": 0, "required": ["source"], "additionalProperties": False,
                          "errorMessage": f"must be a source ({SOURCE_FORMS}) or {{name: NAME, source: SOURCE}}",
                          "properties": {"name": _ID, "source": _SOURCE}}},
    "batch": {"type": "integer", "minimum": 1},
    "version": {"type": "string", "minLength": 1, "maxLength": 64},
}


def _default(value: Any) -> Any:
    """A field's default as JSON (a tuple as a list, a dataclass as its mapping); None: not stated."""
    if dataclasses.is_dataclass(value):
        return {key: _default(item) for key, item in dataclasses.asdict(value).items() if item is not None}
    return list(value) if isinstance(value, tuple) else value


def _bounds(option: dataclasses.Field) -> dict[str, Any]:
    return {word: option.metadata[word] for word in BOUND_WORDS if word in option.metadata}


def _texts_schema(metadata: Mapping[str, Any]) -> dict[str, Any]:
    """A list of texts; its field's metadata may state the most items, an item's ``pattern`` and its ``form`` in
    words (``lines`` / ``zones``: ``forms.regions.text_rule``)."""
    most = metadata.get("maxItems", MAX_LIST_ITEMS)
    item = dict(_TEXT)
    if "pattern" in metadata:
        item.update(pattern=metadata["pattern"], errorMessage=f"must be {metadata['form']}")
    return {"type": "array", "maxItems": most, "items": item,
            "errorMessage": f"must be a list of at most {most} {metadata.get('item', 'string')}s (or one "
                            f"{metadata.get('item', 'string')})"}


def field_schema(option: dataclasses.Field, hint: Any) -> dict[str, Any]:
    """The schema of one field, from its type (the forms agent/pipeline_config.py reads), choices and bounds."""
    members, nullable = members_of(hint)
    choices = option.metadata.get("choices")
    if members == (bool,):
        schema: dict[str, Any] = {"type": "boolean"}
    elif members in ((int,), (float,)):
        schema = {"type": "integer" if members == (int,) else "number", **_bounds(option)}
    elif choices:
        schema = {"type": "string", "enum": list(choices)}
    elif members == (str,) or os.PathLike in members:
        schema = dict(_TEXT)
        if "pattern" in option.metadata:  # a name (decoder): its form, checked where it is used
            schema.update(pattern=option.metadata["pattern"], errorMessage=f"must be {option.metadata['form']}")
    elif members == (tuple[int, int],):
        schema = {"type": ["string", "array"], "pattern": PAIR_PATTERN, "minItems": 2, "maxItems": 2,
                  "items": {"type": "integer", "minimum": 1},
                  "errorMessage": "must be WIDTHxHEIGHT such as 640x480, or [640, 480]"}
    elif members == (tuple[str, ...],):
        schema = _texts_schema(option.metadata)
    elif members == (float, tuple[float, ...]):
        schema = {"type": ["number", "array"], "minItems": 1, "maxItems": 4, "items": {"type": "number"},
                  "errorMessage": "must be a number or a list of numbers (one per channel)"}
    elif len(members) == 1 and dataclasses.is_dataclass(members[0]):
        schema = dataclass_schema(members[0])
    else:
        raise TypeError(f"field {option.name!r}: no schema for {hint}; teach agent/document_schema.py one")
    if nullable and option.default is not None:  # null is a value of its own (opencv_threads: null)
        schema["type"] = [*([schema["type"]] if isinstance(schema["type"], str) else schema["type"]), "null"]
    default = option.default if option.default is not dataclasses.MISSING else None
    if default is not None and not isinstance(default, os.PathLike):
        schema["default"] = _default(default)
    return schema


def dataclass_schema(cls: type) -> dict[str, Any]:
    """A nested mapping of ``cls``'s fields (``backoff: {initial_s: 1, max_s: 30}``)."""
    hints = typing.get_type_hints(cls)
    return {"type": "object", "additionalProperties": False,
            "properties": {f.name: field_schema(f, hints[f.name]) for f in dataclasses.fields(cls)}}


def pipeline_schema() -> dict[str, Any]:
    """One entry of ``pipelines``: the agent's keys, then every pipeline option, in the order they are defined."""
    hints = typing.get_type_hints(PipelineConfig, localns={"Labels": Labels})
    properties = {}
    for option in dataclasses.fields(PipelineConfig):
        properties[option.name] = (dict(_AGENT_PIPELINE_KEYS[option.name]) if option.name in _AGENT_PIPELINE_KEYS
                                   else field_schema(option, hints[option.name]))
    return {"type": "object", "required": ["model"], "additionalProperties": False, "properties": properties}


def document_schema() -> dict[str, Any]:
    """The JSON Schema (draft 2020-12, the subset ``link/schema_check.py`` checks) of a configuration document."""
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": "configuration",
        "description": "What the fleet sets of a device's agent.yaml (docs/agent.md, 'Configuration from the "
                       "fleet'): its pipelines, each with every option, and the keys beside them. A key the document "
                       "gives replaces agent.yaml's; the device's identity, broker, credentials, data_dir and update "
                       "key are agent.yaml's alone. Read leniently, as agent.yaml is: a null is the key left out, a "
                       "number where text is wanted is its text, one string where a list is wanted a list of one.",
        "type": "object",
        "additionalProperties": False,
        "properties": {"pipelines": {"type": "array", "maxItems": MAX_PIPELINES, "items": pipeline_schema()},
                       **FLEET_AGENT_KEYS},
    }


def bootstrap_keys() -> tuple[str, ...]:
    """The keys of agent.yaml that only agent.yaml sets (a document naming one is refused)."""
    fleet = set(document_schema()["properties"])
    return tuple(sorted(TOP_KEYS - fleet))


def schema_module() -> str:
    """The text of ``edgeinfer/link/config_schema.py``: the schema as JSON text (read once at import)."""
    schema = _compact(document_schema())
    keys = ",\n    ".join(repr(key) for key in bootstrap_keys())
    renamed = json.dumps(RENAMED_OPTIONS)
    return f'''# ruff: noqa: E501
"""The JSON Schema of a device's configuration document (docs/agent.md, *Configuration from the fleet*).

Generated by ``python -m edgeinfer.agent.document_schema`` from ``PipelineOptions`` and the agent's keys: do not edit
(tests/link/test_config_schema.py fails when it is stale). Data only, so that the fleet manager, which imports neither
the pipeline nor the agent, checks a document with the schema the device checks it with (link/config_document.py).
"""

from __future__ import annotations

import json
from typing import Any

CONFIG_SCHEMA: dict[str, Any] = json.loads(r"""
{schema}
""")

#: the keys of agent.yaml that only agent.yaml sets: the device's bootstrap
BOOTSTRAP_KEYS: tuple[str, ...] = (
    {keys},
)

#: a pipeline's keys under their old names (old name → name: ``PipelineOptions``' ``RENAMED_OPTIONS``), each read as
#: its name before the check; the schema and a checked document carry the names only
RENAMED_KEYS: dict[str, str] = {renamed}
'''


def _compact(value: Any, indent: str = "") -> str:
    """JSON text with each short value (a key's whole schema, mostly) on one line: a readable module of few lines."""
    flat = json.dumps(value, ensure_ascii=False)
    if not isinstance(value, (dict, list)) or len(flat) + len(indent) <= 110:
        return flat
    inner = indent + " "
    items = ([f"{inner}{json.dumps(key)}: {_compact(item, inner)}" for key, item in value.items()]
             if isinstance(value, dict) else [f"{inner}{_compact(item, inner)}" for item in value])
    opening, closing = "{}" if isinstance(value, dict) else "[]"
    return f"{opening}\n" + ",\n".join(items) + f"\n{indent}{closing}"


if __name__ == "__main__":  # pragma: no cover - regenerates edgeinfer/link/config_schema.py
    print(schema_module(), end="")

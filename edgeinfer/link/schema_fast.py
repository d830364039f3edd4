"""A message schema as a msgspec type: a C decoder that accepts a valid payload in one pass.

msgspec (in the ``fleet`` extra) parses and type-checks JSON in C: a telemetry message in ~5 µs
where our compiled check alone takes ~15 µs (fastjsonschema, measured too, ~16 µs). It is used
only to *accept*: :func:`decoder` builds a type that is exactly the schema or stricter, and a
payload it refuses goes on to the exact checks in :mod:`.protocol`, which accept it or say what
is wrong. So a rule msgspec reads more strictly (``{"const": 1}`` refuses ``1.0``, integers past
64 bits) costs only time, never a wrong verdict. A schema with a keyword or shape that cannot be
expressed that way gets no decoder.
"""

from __future__ import annotations

import keyword
import re
from collections.abc import Mapping
from typing import Annotated, Any, Literal, Union

#: the msgspec module once :func:`_load` has imported it (on the first decoder built, not at import time:
#: an agent that imports the protocol does not pay for it)
msgspec: Any = None


def _load() -> bool:
    """Import msgspec on first use; False when it is not installed (the agent's installs do without it)."""
    global msgspec
    if msgspec is None:
        try:
            import msgspec as module
        except ImportError:
            return False
        msgspec = module
    return True

#: keywords that only document
_NOTES = frozenset({"$schema", "title", "description"})
_KEYWORDS = _NOTES | {"type", "const", "enum", "minimum", "maximum", "exclusiveMinimum", "minLength", "maxLength",
                      "pattern", "items", "minItems", "maxItems", "properties", "required", "additionalProperties"}


def _inexpressible(where: str) -> ValueError:
    return ValueError(f"{where}: not expressed as a msgspec type exactly")


def accepts(kind: str, schema: Mapping[str, Any], text: str | bytes) -> bool:
    """True when the ``kind`` message ``text`` is valid under ``schema`` (checked once per kind that it can
    be expressed); False when it may not be, or msgspec is not there to say."""
    fast = _decoder_of_kind(kind, schema)
    if fast is None:
        return False
    try:
        fast.decode(text)
    except (msgspec.MsgspecError, RecursionError):  # imported: a decoder was built; deep nesting: not here
        return False
    return True


_DECODERS: dict[str, Any] = {}  # kind -> its decoder or None, built on first use (two threads may both build it)


def _decoder_of_kind(kind: str, schema: Mapping[str, Any]) -> Any | None:
    if kind not in _DECODERS:
        _DECODERS[kind] = decoder(schema)
    return _DECODERS[kind]


def decoder(schema: Mapping[str, Any]) -> Any | None:
    """A ``msgspec.json.Decoder`` that accepts exactly the payloads valid under ``schema`` or fewer; None
    when msgspec is not installed or the schema cannot be expressed."""
    if not _load():
        return None
    try:
        return msgspec.json.Decoder(_type(schema, "Message"))
    except (TypeError, ValueError):  # ValueError: _inexpressible()
        return None


def _type(schema: Any, name: str) -> Any:
    if schema is True or schema == {}:
        return Any
    if not isinstance(schema, Mapping) or set(schema) - _KEYWORDS:
        raise _inexpressible(name)
    if "const" in schema or "enum" in schema:
        return _choice(schema, name)
    names = schema.get("type")
    if names is None:
        raise _inexpressible(f"{name}: constraints without a type")
    branches = [_branch(schema, kind, name) for kind in (names if isinstance(names, list) else [names])]
    return branches[0] if len(branches) == 1 else Union[tuple(branches)]  # noqa: UP007 - built at run time


def _choice(schema: Mapping[str, Any], name: str) -> Any:
    values = [schema["const"]] if "const" in schema else list(schema["enum"])
    if ("const" in schema and "enum" in schema) or set(schema) - _NOTES - {"const", "enum", "type"}:
        raise _inexpressible(name)
    # str and int only (a bool is not an int here, and 1 == 1.0 == True in Python: msgspec is stricter)
    if not values or any(type(v) not in (str, int) for v in values):
        raise _inexpressible(name)
    kinds = schema.get("type")
    allowed = {"string": str, "integer": int}
    if kinds is not None and any(type(v) is not allowed.get(k) for v in values
                                 for k in (kinds if isinstance(kinds, list) else [kinds])):
        raise _inexpressible(name)
    return Literal[tuple(values)]


def _branch(schema: Mapping[str, Any], kind: str, name: str) -> Any:
    meta: dict[str, Any] = {}
    if kind in ("number", "integer"):
        meta = {"ge": schema.get("minimum"), "le": schema.get("maximum"), "gt": schema.get("exclusiveMinimum")}
        base: Any = int if kind == "integer" else float  # a float field takes JSON integers, as "number" does
    elif kind == "string":
        meta = {"min_length": schema.get("minLength"), "max_length": schema.get("maxLength"),
                "pattern": pattern(schema["pattern"]).pattern if "pattern" in schema else None}
        base = str
    elif kind == "array":
        meta = {"min_length": schema.get("minItems"), "max_length": schema.get("maxItems")}
        base = list[_type(schema.get("items", True), name + "Item")]
    elif kind == "object":
        base = _object(schema, name)
    elif kind == "boolean":
        base = bool
    elif kind == "null":
        base = None
    else:
        raise _inexpressible(f"{name}: type {kind!r}")
    meta = {key: value for key, value in meta.items() if value is not None}
    return Annotated[base, msgspec.Meta(**meta)] if meta else base


def _object(schema: Mapping[str, Any], name: str) -> Any:
    properties = schema.get("properties", {})
    required = list(schema.get("required", ()))
    extra = schema.get("additionalProperties", True)
    if not properties:
        if required:
            raise _inexpressible(name)
        if extra is False:
            return Annotated[dict, msgspec.Meta(max_length=0)]
        return dict[str, _type(extra, name + "Value")]
    if extra not in (True, False) or set(required) - set(properties):
        raise _inexpressible(name)
    fields = []
    renamed: dict[str, str] = {}  # a property named like a Python keyword ("in") is a field "in_" on the wire as "in"
    for key, sub in properties.items():
        if not key.isidentifier() or key.startswith("_"):
            raise _inexpressible(f"{name}.{key}")
        attr = key + "_" if keyword.iskeyword(key) else key
        if attr != key:
            renamed[attr] = key
        field = _type(sub, name + key.title())
        fields.append((attr, field) if key in required else (attr, Union[field, msgspec.UnsetType], msgspec.UNSET))  # noqa: UP007
    fields.sort(key=len)  # required (no default) first, as a Struct needs; stable: the schema's order
    return msgspec.defstruct(name, fields, forbid_unknown_fields=extra is False, rename=renamed or None)


def pattern(text: str) -> re.Pattern[str]:
    """A JSON Schema pattern for Python's ``re.search`` (what msgspec uses too): a final ``$`` becomes ``\\Z``,
    since Python's ``$`` also matches before a trailing newline and ECMA-262's does not (``"cam\\n"`` is no id)."""
    return _PATTERNS.get(text) or _PATTERNS.setdefault(text, re.compile(text[:-1] + r"\Z" if text.endswith("$")
                                                                      and not text.endswith(r"\$") else text))


_PATTERNS: dict[str, re.Pattern[str]] = {}

"""The subset of JSON Schema the link protocol's schemas use, checked exactly: readable errors
(:func:`schema_errors`) and a compiled predicate with the same rules (:func:`compile_schema`, the
fleet manager's path for what msgspec refused), plus a nesting bound checked before either runs.

JSON's meaning, not Python's: ``true`` is not ``1``; a pattern's final ``$`` does not match
before a trailing newline (``schema_fast.pattern``).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping
from typing import Any

from .._config import suggestion
from .schema_fast import pattern

_TYPES: dict[str, tuple[type, ...]] = {
    "object": (dict,), "array": (list,), "string": (str,), "boolean": (bool,),
    "integer": (int,), "number": (int, float), "null": (type(None),),
}


def _is_type(value: Any, name: str) -> bool:
    if name in ("integer", "number") and isinstance(value, bool):
        return False
    if name == "number" and isinstance(value, float) and not math.isfinite(value):
        return False
    return isinstance(value, _TYPES[name])


def _same(value: Any, expected: Any) -> bool:
    """JSON equality: ``true`` is not ``1`` (Python's ``True == 1`` is)."""
    return value == expected and isinstance(value, bool) == isinstance(expected, bool)


#: a JSON type in words, for messages ("must be a number, got 'fast'")
_TYPE_WORDS = {"object": "an object", "array": "an array", "string": "a string", "boolean": "true or false",
               "integer": "an integer", "number": "a number", "null": "null"}


#: the numeric bounds: keyword, its symbol in messages, and when a value is outside it
_BOUNDS: tuple[tuple[str, str, Callable[[Any, Any], bool]], ...] = (
    ("minimum", ">=", lambda v, bound: v < bound), ("maximum", "<=", lambda v, bound: v > bound),
    ("exclusiveMinimum", ">", lambda v, bound: v <= bound), ("exclusiveMaximum", "<", lambda v, bound: v >= bound))


def _shown(value: Any, limit: int = 80) -> str:
    """A value for an error message: short, and never a failure of its own (however deep the value)."""
    if isinstance(value, (dict, list)):
        return f"a JSON {'object' if isinstance(value, dict) else 'array'}"
    if value is None or isinstance(value, bool):
        return json.dumps(value)  # null, true, false: as the document writes them
    return repr(value)[:limit]


def _errors(value: Any, schema: Mapping[str, Any], where: str) -> list[str]:
    """Every way ``value`` breaks ``schema`` (the subset of JSON Schema used in this module). A schema's
    ``errorMessage`` (ajv-errors' keyword: a value's form in words) replaces its own problems, not its children's:
    ``$.size: must be WIDTHxHEIGHT such as 640x480, or [640, 480], got 'big'``."""
    out = _checked(value, schema, where)
    words = schema.get("errorMessage")
    if not words or not out:
        return out
    own = f"{where}: "
    children = [problem for problem in out  # a missing key is said as such: it names the key
                if not problem.startswith(own) or problem.startswith(f"{own}missing required key")]
    return ([f"{where}: {words}, got {_shown(value)}"] if len(children) < len(out) else []) + children


def _checked(value: Any, schema: Mapping[str, Any], where: str) -> list[str]:
    out: list[str] = []
    if "const" in schema and not _same(value, schema["const"]):
        return [f"{where}: must be {schema['const']!r}, got {_shown(value)}"]
    if "enum" in schema and not any(_same(value, option) for option in schema["enum"]):
        options = ", ".join(option if isinstance(option, str) else repr(option) for option in schema["enum"])
        return [f"{where}: must be one of {options}, got {_shown(value)}"]
    if "type" in schema:
        names = schema["type"] if isinstance(schema["type"], list) else [schema["type"]]
        if not any(_is_type(value, n) for n in names):
            return [f"{where}: must be {' or '.join(_TYPE_WORDS[n] for n in names)}, got {_shown(value)}"]
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        kinds = [n for n in (schema["type"] if isinstance(schema.get("type"), list) else [schema.get("type")])
                 if n != "null"]
        kind = f"{_TYPE_WORDS[kinds[0]]} " if kinds in (["integer"], ["number"]) else ""  # "must be a number > 0"
        for word, symbol, outside in _BOUNDS:
            if word in schema and outside(value, schema[word]):
                out.append(f"{where}: must be {kind}{symbol} {schema[word]}, got {value}")
    if isinstance(value, str):
        if "minLength" in schema and len(value) < schema["minLength"]:
            out.append(f"{where}: must have at least {schema['minLength']} characters")
        if "maxLength" in schema and len(value) > schema["maxLength"]:
            out.append(f"{where}: must have at most {schema['maxLength']} characters")
        if "pattern" in schema and not pattern(schema["pattern"]).search(value):
            out.append(f"{where}: {value[:80]!r} does not match {schema['pattern']}")
    if isinstance(value, list):
        if "minItems" in schema and len(value) < schema["minItems"]:
            out.append(f"{where}: needs at least {schema['minItems']} items")
        if "maxItems" in schema and len(value) > schema["maxItems"]:
            out.append(f"{where}: allows at most {schema['maxItems']} items")
        if "items" in schema:
            for index, item in enumerate(value):
                out.extend(_errors(item, schema["items"], f"{where}[{index}]"))
    if isinstance(value, dict):
        for key in schema.get("required", ()):
            if key not in value:
                out.append(f"{where}: missing required key {key!r}")
        props = schema.get("properties", {})
        extra = schema.get("additionalProperties", True)
        for key, item in value.items():
            path = f"{where}.{key}"
            if not isinstance(key, str):
                out.append(f"{where}: keys must be strings")
            elif key in props:
                out.extend(_errors(item, props[key], path))
            elif extra is False:
                out.append(f"{path}: unknown key{suggestion(key, props)}")
            elif isinstance(extra, Mapping):
                out.extend(_errors(item, extra, path))
    return out


Check = Callable[[Any], bool]


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and (not isinstance(v, float) or math.isfinite(v))


_TYPE_CHECKS: dict[str, Check] = {
    "object": lambda v: isinstance(v, dict), "array": lambda v: isinstance(v, list),
    "string": lambda v: isinstance(v, str), "boolean": lambda v: isinstance(v, bool),
    "integer": lambda v: isinstance(v, int) and not isinstance(v, bool), "number": _is_number,
    "null": lambda v: v is None,
}


def _all_of(checks: list[Check]) -> Check:
    if len(checks) == 1:
        return checks[0]

    def check(v: Any) -> bool:
        for one in checks:  # noqa: SIM110 - a plain loop: all() over a generator costs a third more here
            if not one(v):
                return False
        return True

    return check


def compile_schema(schema: Mapping[str, Any]) -> Check:
    """A predicate with exactly :func:`_errors`' rules (``check(v)`` iff ``not _errors(v, ...)``), the schema's
    keywords looked up once: the fleet manager validates thousands of messages a second."""
    if _is_number_leaf(schema):
        return _compile_number(schema)
    if schema.get("type") == "object" and not set(schema) - _OBJECT_KEYWORDS:
        return _compile_object(schema, strict=True)
    checks: list[Check] = []
    if "const" in schema:
        const = schema["const"]
        checks.append(lambda v: _same(v, const))
    if "enum" in schema:
        enum = schema["enum"]
        checks.append(lambda v: any(_same(v, option) for option in enum))
    if "type" in schema:
        names = schema["type"] if isinstance(schema["type"], list) else [schema["type"]]
        kinds = [_TYPE_CHECKS[name] for name in names]
        first, *others = kinds
        checks.append(first if not others else lambda v: first(v) or any(kind(v) for kind in others))
    within = _bounds(schema)
    if within is not None:
        checks.append(lambda v: not isinstance(v, (int, float)) or isinstance(v, bool) or within(v))
    if any(key in schema for key in ("minLength", "maxLength", "pattern")):
        shortest, longest = schema.get("minLength", 0), schema.get("maxLength")
        search = pattern(schema["pattern"]).search if "pattern" in schema else None
        checks.append(lambda v: not isinstance(v, str) or (
            len(v) >= shortest and (longest is None or len(v) <= longest) and (search is None or bool(search(v)))))
    if any(key in schema for key in ("minItems", "maxItems", "items")):
        fewest, most = schema.get("minItems", 0), schema.get("maxItems")
        item = compile_schema(schema["items"]) if "items" in schema else None
        checks.append(lambda v: not isinstance(v, list) or (
            len(v) >= fewest and (most is None or len(v) <= most) and (item is None or all(map(item, v)))))
    if any(key in schema for key in ("required", "properties", "additionalProperties")):
        checks.append(_compile_object(schema))
    return _all_of(checks) if checks else (lambda v: True)


_NUMBER_KEYWORDS = frozenset({"type", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "description"})
_OBJECT_KEYWORDS = frozenset({"type", "required", "properties", "additionalProperties", "description"})


def _bounds(schema: Mapping[str, Any]) -> Check | None:
    """The schema's numeric bounds as one predicate on a number; None when it has none."""
    low, high, above = schema.get("minimum"), schema.get("maximum"), schema.get("exclusiveMinimum")
    below = schema.get("exclusiveMaximum")
    if (low, high, above, below) == (None, None, None, None):
        return None
    return lambda v: ((low is None or v >= low) and (high is None or v <= high) and (above is None or v > above)
                      and (below is None or v < below))


def _is_number_leaf(schema: Mapping[str, Any]) -> bool:
    return schema.get("type") in ("number", "integer") and not set(schema) - _NUMBER_KEYWORDS


def _compile_number(schema: Mapping[str, Any]) -> Check:
    """The commonest leaf, ``{"type": "number"|"integer", bounds}``, as one function (most of a telemetry
    message's values); exact int and float take the short way, anything else the general rules."""
    integer = schema["type"] == "integer"
    within = _bounds(schema) or (lambda v: True)
    is_type = _TYPE_CHECKS[schema["type"]]

    def check(v: Any) -> bool:
        kind = type(v)
        if kind is float:
            if integer or v - v != 0:  # v - v is nan for inf and nan: not a JSON number
                return False
        elif kind is not int and not is_type(v):
            return False
        return within(v)

    return check


def _compile_object(schema: Mapping[str, Any], strict: bool = False) -> Check:
    """The object keywords; ``strict``: the schema's type is object, so anything else fails here too."""
    required = tuple(schema.get("required", ()))
    props = {key: compile_schema(sub) for key, sub in schema.get("properties", {}).items()}
    extra = schema.get("additionalProperties", True)
    extra_check = compile_schema(extra) if isinstance(extra, Mapping) else None

    def check(v: Any) -> bool:
        if not isinstance(v, dict):
            return not strict
        for key in required:
            if key not in v:
                return False
        for key, item in v.items():
            sub = props.get(key)
            if sub is not None:
                if not sub(item):
                    return False
            elif not isinstance(key, str) or extra is False or (extra_check is not None and not extra_check(item)):
                return False
        return True

    return check


def schema_errors(value: Any, schema: Mapping[str, Any]) -> list[str]:
    """All violations of ``schema`` by ``value``, as readable strings (empty when valid)."""
    return _errors(value, schema, "$")


def nesting(value: Any, limit: int) -> int:
    """How deep objects and arrays nest in ``value``, counted up to ``limit + 1`` (iterative: no
    recursion limit to hit, and no further walking once past the limit)."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, (dict, list)):
            deepest = max(deepest, depth)
            if depth <= limit:
                stack.extend((child, depth + 1) for child in (item.values() if isinstance(item, dict) else item))
    return deepest

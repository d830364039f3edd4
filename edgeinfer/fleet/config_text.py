"""A configuration layer as text, for the dashboard's text mode (``POST /api/config/layers/…/check``): YAML or JSON
read into a document, and a document written back as either — read by the manager so that the page needs no parser
of its own and reads YAML as the CLI and agent.yaml's reader do (PyYAML's safe loader).

What a text may not hold is said as a problem naming where, never raised: a YAML or JSON syntax error (its line and
column), anchors and aliases (a few bytes of them expand into a document of gigabytes when walked), nesting past the
document's bound, and values JSON has no word for (a date, binary, a set, a key that is not text, a number that is
not finite) — each at its key, as the schema's problems name theirs (``pipelines[0].version: …``).
"""

from __future__ import annotations

import datetime
import json
import math
from typing import Any, Literal

import yaml

from ..link.config_document import MAX_DOCUMENT_NESTING
from ..link.schema_check import nesting

#: the text forms a layer is read from and written as
TextFormat = Literal["yaml", "json"]
#: the key a problem of the text itself is said at (its syntax, not one of the document's keys)
TEXT_KEY = "(text)"


class _NoAliasLoader(yaml.SafeLoader):
    """PyYAML's safe loader, refusing anchors and aliases (a configuration has no use for them)."""

    def compose_node(self, parent: Any, index: Any) -> Any:
        event = self.peek_event()
        if isinstance(event, yaml.AliasEvent) or getattr(event, "anchor", None) is not None:
            raise yaml.MarkedYAMLError(None, None, "anchors and aliases are not taken in a configuration",
                                       event.start_mark)
        return super().compose_node(parent, index)


def _yaml_problem(exc: yaml.YAMLError) -> str:
    mark = getattr(exc, "problem_mark", None)
    where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
    return f"not valid YAML: {where}{getattr(exc, 'problem', None) or exc}"


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def _json_value_problems(value: Any, where: str = "") -> list[str]:
    """Where ``value`` (as YAML built it) holds what JSON cannot say: each as ``KEY: words``."""
    key = where or "(top level)"
    if isinstance(value, dict):
        out: list[str] = []
        for name, item in value.items():
            if not isinstance(name, str):
                out.append(f"{key}: the key {name!r} must be text (put it in quotes)")
                continue
            out += _json_value_problems(item, f"{where}.{name}" if where else name)
        return out
    if isinstance(value, list):
        return [problem for index, item in enumerate(value)
                for problem in _json_value_problems(item, f"{key}[{index}]")]
    if isinstance(value, float) and not math.isfinite(value):
        return [f"{key}: must be a finite number, got {value}"]
    if isinstance(value, (datetime.date, datetime.datetime)):
        return [f"{key}: {value.isoformat()} reads as a date: put it in quotes to make it text"]
    if value is None or isinstance(value, (str, bool, int, float)):
        return []
    return [f"{key}: a {type(value).__name__} is not a value a configuration takes"]


def parse_text(text: str, fmt: TextFormat = "yaml") -> tuple[Any, list[tuple[str, str]]]:
    """``text`` read as ``fmt``: (the value, []) or (None, [(key, words)]) saying why it cannot be read. An empty
    YAML text is the empty layer. The value is not checked as a layer here (:func:`.config_layers.layer_problems`)."""
    try:
        if fmt == "json":
            value = json.loads(text, parse_constant=_no_constant)
        else:
            value = yaml.load(text, Loader=_NoAliasLoader)  # SafeLoader, refusing aliases
            value = {} if value is None else value
    except yaml.YAMLError as exc:
        return None, [(TEXT_KEY, _yaml_problem(exc))]
    except json.JSONDecodeError as exc:
        return None, [(TEXT_KEY, f"not valid JSON: line {exc.lineno}, column {exc.colno}: {exc.msg}")]
    except ValueError as exc:
        return None, [(TEXT_KEY, f"not valid JSON: {exc}")]
    except RecursionError:
        return None, [(TEXT_KEY, f"nests deeper than {MAX_DOCUMENT_NESTING} levels")]
    if nesting(value, MAX_DOCUMENT_NESTING) > MAX_DOCUMENT_NESTING:
        return None, [(TEXT_KEY, f"nests deeper than {MAX_DOCUMENT_NESTING} levels")]
    problems = _json_value_problems(value)
    if problems:
        return None, [tuple(problem.split(": ", 1)) for problem in problems]  # type: ignore[misc]
    return value, []


def dump_text(document: Any, fmt: TextFormat = "yaml") -> str:
    """``document`` as text: YAML as ``fleet config get`` prints it (keys in their order), or JSON indented."""
    if fmt == "json":
        return json.dumps(document, indent=2, ensure_ascii=False) + "\n"
    return "" if document == {} else yaml.safe_dump(document, sort_keys=False, allow_unicode=True)


__all__ = ["TEXT_KEY", "TextFormat", "dump_text", "parse_text"]

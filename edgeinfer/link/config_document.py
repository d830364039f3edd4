"""A device's configuration document — what the fleet sets of a device's ``agent.yaml`` — and the one check of it
that the fleet manager, ``edgeinfer agent --check`` and the device all run.

The document is a JSON object (UTF-8, at most :data:`MAX_DOCUMENT_BYTES`) holding the keys of ``agent.yaml`` the fleet
may set: each pipeline with every option (``pipelines``) and ``telemetry_interval_s``. The device's identity, its
broker and credentials, its ``data_dir`` and the pinned update key are the bootstrap: only ``agent.yaml`` sets them
(:data:`~.config_schema.BOOTSTRAP_KEYS`), and a document naming one is refused. Its JSON Schema is
:data:`~.config_schema.CONFIG_SCHEMA`, generated from ``PipelineOptions`` (``edgeinfer/agent/document_schema.py``):
the options' types, choices and bounds are read from the one definition, and a test fails when the committed schema
is stale.

:func:`document_problems` reads a document as ``agent.yaml``'s reader does (leniently: a null is the key left out, a
number where text is wanted is its text, one rule where a list is wanted is a list of one — YAML's ways), checks it
against the schema with :mod:`.schema_check`'s readable errors, then checks what a schema cannot say (one of
``source`` and ``sources``; names used once; the lines' and zones' shapes and coordinates, and a task that takes
them, by ``forms.regions`` as the device reads them).
Each problem names its key: ``pipelines[0].max_fps: must be > 0, got
-1``. The fleet manager answers a refused document with these words (409), the agent refuses ``agent.yaml`` with
them (``agent.yaml: pipelines[0].max_fps: ...``, exit 78), and a device refuses a fleet revision with them.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from ..errors import ConfigError, ConfigTooLarge
from ..forms.regions import parse_regions, task_problem
from ..util.config import current_names
from .config_schema import BOOTSTRAP_KEYS, CONFIG_SCHEMA, RENAMED_KEYS
from .schema_check import nesting, schema_errors

#: a document larger than this is refused before it is parsed (the fleet manager: 413)
MAX_DOCUMENT_BYTES = 128 * 1024
#: a document nests far less deep than this (pipelines → a pipeline → sources → a stream: 4)
MAX_DOCUMENT_NESTING = 16
#: pipelines one device runs at most
MAX_PIPELINES = 32
#: the longest text a key takes (a GStreamer pipeline, an RTSP URL with its options)
MAX_TEXT_CHARS = 4096
#: items of a list key at most (lines, zones, event and sampling rules)
MAX_LIST_ITEMS = 64
#: the keys the fleet sets: the schema's (a document holds any of them; agent.yaml's others are the bootstrap)
FLEET_KEYS = tuple(CONFIG_SCHEMA["properties"])
#: the forms of a source, for messages
SOURCE_FORMS = "a video file, image folder or glob, camera index, /dev/videoN, rtsp:// URL or GStreamer pipeline"


def default_pipeline_name(index: int) -> str:
    """The name of ``pipelines[index]`` when it gives none: ``main``, then ``pipeline1``, ``pipeline2``, ..."""
    return f"pipeline{index}" if index else "main"


def default_stream_name(index: int) -> str:
    """The name of ``sources[index]`` when it gives none (as ``edgeinfer run -s`` names the streams)."""
    return f"stream{index}"


def fleet_part(data: Mapping[str, Any]) -> dict[str, Any]:
    """The keys of an ``agent.yaml`` mapping that a fleet document would set (the rest is the bootstrap)."""
    return {key: data[key] for key in FLEET_KEYS if key in data}


# ---------------------------------------------------------------------------------- lenient reading

def _types(schema: Mapping[str, Any]) -> list[str]:
    kind = schema.get("type", [])
    return list(kind) if isinstance(kind, list) else [kind]


def normalised(value: Any, schema: Mapping[str, Any] = CONFIG_SCHEMA) -> Any:
    """``value`` in the form the schema states, read as ``agent.yaml``'s lenient reader reads it: a null is the key
    left out (where null is not a value of its own, ``opencv_threads: null``), a number where only text is wanted is
    its text (``version: 2``), one string where a list of strings is wanted is a list of one (``lines: door=...``).
    Anything else is left for the schema to judge."""
    types = _types(schema)
    if isinstance(value, dict):
        props = schema.get("properties", {})
        out = {}
        for key, item in value.items():
            sub = props.get(key)
            if sub is None:
                out[key] = item  # unknown: the schema names it
            elif item is not None or "null" in _types(sub):
                out[key] = normalised(item, sub)
        return out
    if isinstance(value, list) and "items" in schema:
        return [normalised(item, schema["items"]) for item in value]
    if types == ["string"] and isinstance(value, (int, float)) and not isinstance(value, bool) and value == value:
        return str(value)
    if types == ["array"] and isinstance(value, str) and _types(schema.get("items", {})) == ["string"]:
        return [value]
    return value


# ---------------------------------------------------------------------------------- the check

def current_keys(document: Mapping[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """``document`` with each pipeline's keys under their names (an old name, :data:`RENAMED_KEYS`, read as its
    name), and the problems (a key given under both names), each naming its key."""
    pipelines = document.get("pipelines")
    if not isinstance(pipelines, list):
        return dict(document), []
    problems: list[str] = []
    current = []
    for index, pipeline in enumerate(pipelines):
        if isinstance(pipeline, Mapping):
            pipeline, found = current_names(pipeline, RENAMED_KEYS)
            problems += [f"pipelines[{index}].{problem}" for problem in found]
        current.append(pipeline)
    return {**document, "pipelines": current}, problems


def _where(path: str) -> str:
    """A schema_check path as the config's key: ``$.pipelines[0].max_fps`` → ``pipelines[0].max_fps``."""
    return path[2:] if path.startswith("$.") else "(top level)" + path[1:]


def _structure(pipelines: list[Any]) -> list[str]:
    """What the schema cannot say of the pipelines: one of source and sources, batch with sources, names used once,
    lines and zones."""
    problems, names = [], []
    for index, pipeline in enumerate(pipelines):
        if not isinstance(pipeline, dict):
            continue
        where = f"pipelines[{index}]"
        if "source" in pipeline and "sources" in pipeline:
            problems.append(f"{where}.sources: give either source (one stream) or sources (several), not both")
        elif "source" not in pipeline and "sources" not in pipeline:
            problems.append(f"{where}.source: required ({SOURCE_FORMS}; or sources: a list of them)")
        elif "batch" in pipeline and "sources" not in pipeline:
            problems.append(f"{where}.batch: only a pipeline with sources takes it (frames of several streams per "
                            f"invoke)")
        streams: list[str] = []
        for position, item in enumerate(pipeline.get("sources") or ()):
            name = item.get("name", default_stream_name(position)) if isinstance(item, dict) else \
                default_stream_name(position)
            if name in streams:
                problems.append(f"{where}.sources[{position}]: two streams are named {name!r}; stream names must be "
                                f"unique")
            streams.append(name)
        problems += [f"{where}: {problem}" for problem in _regions_problems(pipeline)]
        name = pipeline.get("name", default_pipeline_name(index))
        if name in names:
            problems.append(f"pipelines: two pipelines are named {name!r}; names must be unique")
        names.append(name)
    return problems


def _regions_problems(pipeline: Mapping[str, Any]) -> list[str]:
    """A pipeline's lines and zones as the device reads them (``forms.regions``: their shapes, bounds and names, said as
    the device says them), and whether its task takes them."""
    lines, zones = pipeline.get("lines") or [], pipeline.get("zones") or []
    refusal = task_problem(pipeline.get("task"), "tracking, lines and zones") if lines or zones or \
        pipeline.get("track") else None
    if refusal:
        return [refusal]
    try:
        parse_regions(lines, zones)
    except ValueError as exc:
        return [str(exc)]
    return []


def document_problems(document: Any) -> list[str]:
    """Every way ``document`` (decoded JSON or YAML: the fleet's document, or the fleet's keys of an agent.yaml) is
    not a configuration a device takes, each naming its key; empty when it is one. Read leniently (:func:`normalised`)
    first."""
    if not isinstance(document, dict):
        return [f"(top level): must be an object of {', '.join(FLEET_KEYS)}, got {type(document).__name__}"]
    bootstrap = [f"{key}: set only in the device's agent.yaml (it is the device's bootstrap), not by the fleet"
                 for key in document if key in BOOTSTRAP_KEYS]
    if bootstrap:
        return bootstrap
    document, renamed = current_keys(document)
    if renamed:
        return renamed
    document = normalised(document)
    problems = []
    for problem in schema_errors(document, CONFIG_SCHEMA):
        path, _, words = problem.partition(": ")
        problems.append(f"{_where(path)}: {words}")
    if not problems and isinstance(document.get("pipelines"), list):
        problems = _structure(document["pipelines"])
    return problems


def check_document(document: Any) -> dict[str, Any]:
    """``document`` in its normal form (:func:`normalised`), or ConfigError with its first problem
    (:func:`document_problems`), which names the key."""
    problems = document_problems(document)
    if problems:
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        raise ConfigError(f"{problems[0]}{more}")
    return normalised(current_keys(document)[0])


def parse_document(payload: bytes | str) -> dict[str, Any]:
    """A configuration document from its JSON text, checked (:func:`check_document`), in its normal form.
    ConfigTooLarge over :data:`MAX_DOCUMENT_BYTES`; ConfigError for anything else, naming the key where there is one."""
    size = len(payload.encode("utf-8") if isinstance(payload, str) else payload)
    if size > MAX_DOCUMENT_BYTES:
        raise ConfigTooLarge(f"(top level): the document is {size} bytes; at most {MAX_DOCUMENT_BYTES} are taken")
    try:
        text = payload.decode("utf-8") if isinstance(payload, (bytes, bytearray)) else payload
        document = json.loads(text, parse_constant=_no_constant)
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise ConfigError(f"(top level): not a JSON document ({exc})") from None
    if nesting(document, MAX_DOCUMENT_NESTING) > MAX_DOCUMENT_NESTING:
        raise ConfigError(f"(top level): nests deeper than {MAX_DOCUMENT_NESTING} levels")
    return check_document(document)


def encode_document(document: Mapping[str, Any]) -> bytes:
    """The document's canonical bytes (sorted keys, no spaces, UTF-8): what a revision's sha256 is taken of."""
    return json.dumps(document, sort_keys=True, separators=(",", ":"), ensure_ascii=False,
                      allow_nan=False).encode("utf-8")


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


__all__ = ["FLEET_KEYS", "MAX_DOCUMENT_BYTES", "check_document", "current_keys", "default_pipeline_name",
           "default_stream_name",
           "document_problems", "encode_document", "fleet_part", "normalised", "parse_document"]

"""One ``pipelines:`` entry of agent.yaml: every option of :class:`edgeinfer.Pipeline`, and the agent's own keys.

:class:`PipelineConfig` *is* a :class:`~edgeinfer.pipeline.options.PipelineOptions` (so each
pipeline option is a key, under the name of the ``Pipeline`` keyword) with the agent's fields added:
``name``, ``model``, ``source`` (or ``sources``: several streams on one engine, and their ``batch``),
``version``, ``restart``. Nothing here lists the pipeline options a
second time: :func:`read_pipeline` reads each field by its type annotation (``bool``, ``int``,
``float``, a string with the ``choices`` in its metadata, a path, ``WxH``, a number or list of
numbers, a nested dataclass such as ``backoff``), and turns the ``ValueError`` that
``PipelineOptions`` raises for a bad value into a ConfigError naming the file and the key.
"""

from __future__ import annotations

import dataclasses
import os
import re
import types
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import ConfigError
from ..link.config_document import SOURCE_FORMS, default_pipeline_name, default_stream_name
from ..pipeline.events import EventRule
from ..pipeline.labels import Labels
from ..pipeline.options import BOX_OPTIONS, PipelineOptions
from .config_reader import ConfigReader

#: what the runner does when a pipeline fails (``on-failure``) or its source ends (``always``)
RESTART_POLICIES = ("on-failure", "always", "never")


@dataclass(frozen=True)
class StreamSource:
    """One stream of a pipeline with ``sources``: its name (an id, like a pipeline's) and its source."""

    name: str
    source: str | int


@dataclass(frozen=True, kw_only=True)
class PipelineConfig(PipelineOptions):
    """One pipeline the agent runs: the options of :class:`edgeinfer.Pipeline`, plus name, model, source, restart.

    Exactly one of ``source`` (a :class:`~edgeinfer.Pipeline`) and ``sources`` (several named streams on
    one engine: a :class:`~edgeinfer.pipeline.multi.MultiPipeline`) is set.
    """

    name: str
    #: path of the model file (relative paths: to the config file)
    model: str
    #: anything :func:`edgeinfer.open_source` takes; a camera index as an int (None: ``sources`` is set)
    source: str | int | None = None
    #: several streams served by one engine, in config order (empty: ``source`` is set)
    sources: tuple[StreamSource, ...] = ()
    #: with ``sources``: frames per invoke, one per stream (a delegate that can reshape the model: openvino)
    batch: int | None = None
    #: reported with the model's sha256 in the ``state`` message
    version: str | None = None
    restart: str = field(default="on-failure", metadata={"choices": RESTART_POLICIES})

    def __post_init__(self) -> None:
        super().__post_init__()
        if (self.source is None) == (not self.sources):
            raise ValueError("a pipeline takes exactly one of source and sources")
        if self.batch is not None and (self.batch < 1 or not self.sources):
            raise ValueError("batch must be >= 1, and only a pipeline with sources takes it")
        if self.record_source is not None and self.sources:
            raise ValueError("record_source goes with source (one camera), not sources")

    @property
    def options(self) -> PipelineOptions:
        """The pipeline's own options: what ``Pipeline(model, source, options)`` takes."""
        return PipelineOptions(**self.pipeline_kwargs())

    def pipeline_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for ``Pipeline(model, source, **kwargs)``: every pipeline option."""
        return {name: getattr(self, name) for name in PipelineOptions.names()}


#: every key of a ``pipelines:`` entry: the pipeline's options, then the agent's own
PIPELINE_KEYS = tuple(option.name for option in dataclasses.fields(PipelineConfig))
#: the keys read by hand in read_pipeline(), not by their type
_READ_BY_HAND = ("name", "model", "source", "sources", "batch")

Read = Callable[[ConfigReader, str], Any]


# ------------------------------------------------------------------------------- reading by type

def members_of(hint: Any) -> tuple[tuple[Any, ...], bool]:
    """The types a hint allows, without None, and whether None is allowed."""
    args = typing.get_args(hint) if typing.get_origin(hint) in (typing.Union, types.UnionType) else (hint,)
    return tuple(a for a in args if a is not type(None)), type(None) in args


def _kind(members: tuple[Any, ...]) -> str | None:
    """The words for a numeric option's kind in error messages ("a number", "an integer"); None for others."""
    return {(int,): "an integer", (float,): "a number"}.get(members)


def _reader_for(option: dataclasses.Field, hint: Any) -> Read:
    """How to read ``option`` from YAML, from its type; TypeError for a type with no YAML form."""
    members = members_of(hint)[0]
    choices = option.metadata.get("choices")
    if members == (bool,):
        return lambda r, key: r.boolean(key, False)
    if members == (int,):
        return lambda r, key: r.number(key, None, integer=True)
    if members == (float,):
        return lambda r, key: float(r.number(key, None))
    if members == (str,):
        return lambda r, key: r.string(key, choices=choices)
    if os.PathLike in members:
        return lambda r, key: r.path(key)
    if members == (tuple[int, int],):
        return lambda r, key: r.pair(key)
    if members == (tuple[str, ...],):  # an empty list is none (the fleet's form for "no rules")
        return lambda r, key: () if r.get(key) == [] else r.strings(key)
    if members == (float, tuple[float, ...]):
        return lambda r, key: r.numbers(key)
    if len(members) == 1 and dataclasses.is_dataclass(members[0]):
        return _dataclass_reader(members[0])
    raise TypeError(f"pipeline option {option.name!r}: no YAML form for {hint}; teach agent/pipeline_config.py one")


def _dataclass_reader(cls: type) -> Read:
    """A nested mapping of ``cls``'s fields (``backoff: {initial_s: 1, max_s: 30}``), built and validated."""
    hints = typing.get_type_hints(cls)
    readers = {f.name: _reader_for(f, hints[f.name]) for f in dataclasses.fields(cls)}

    def read(r: ConfigReader, key: str) -> Any:
        nested = r.nested(key, readers)
        assert nested is not None  # only called for a key that is given
        values = {name: read_one(nested, name) for name, read_one in readers.items() if nested.has(name)}
        try:
            return cls(**values)
        except ValueError as exc:
            raise r.fail(key, str(exc)) from None

    return read


@dataclass(frozen=True)
class _OptionForm:
    """How one key of a pipeline entry is read: by its field's type."""

    option: dataclasses.Field
    read: Read
    #: "a number" / "an integer" for numeric options, for messages
    kind: str | None
    #: None is a value of its own (``opencv_threads: null``: leave OpenCV's thread count alone)
    nullable: bool

    def given(self, r: ConfigReader) -> bool:
        """Whether the YAML sets this key: a value, or null where None is not already the default."""
        name = self.option.name
        return r.has(name) or (r.is_null(name) and self.nullable and self.option.default is not None)


def _forms() -> dict[str, _OptionForm]:
    hints = typing.get_type_hints(PipelineConfig, localns={"Labels": Labels})
    out = {}
    for option in dataclasses.fields(PipelineConfig):
        if option.name not in _READ_BY_HAND:
            members, nullable = members_of(hints[option.name])
            out[option.name] = _OptionForm(option, _reader_for(option, hints[option.name]), _kind(members), nullable)
    return out


_FORMS = _forms()
#: PipelineOptions says "max_fps must be > 0, not -1"; the file's reader says "must be a number > 0, got -1"
_BOUND_RE = re.compile(r"^must be (?P<bound>[<>]=? ?\S+)(?:, not .*)?$")


def _problem(error: ValueError, key: str, value: Any, kind: str | None) -> str:
    """A PipelineOptions ValueError about ``key`` as a config problem (without the key in front)."""
    text = str(error)
    text = text[len(key) + 1:] if text.startswith(f"{key} ") else text
    match = _BOUND_RE.match(text)
    if match and kind:
        return f"must be {kind} {match['bound']}, got {value!r}"
    return text


def _read_option(r: ConfigReader, form: _OptionForm) -> Any:
    """The value of one pipeline key, typed and validated on its own (ConfigError naming the key)."""
    key = form.option.name
    value = None if r.is_null(key) else form.read(r, key)
    if key in PipelineOptions.names():
        alone = {key: value, "task": "detect"} if key in BOX_OPTIONS else {key: value}  # checked alone
        if key == "events":  # each rule's text alone; its line or zone is checked with the whole entry
            alone = {}
            try:
                for text in value or ():
                    EventRule.parse(text)
            except ValueError as exc:
                raise r.fail(key, str(exc)) from None
        try:
            PipelineOptions(**alone)
        except ValueError as exc:
            raise r.fail(key, _problem(exc, key, r.get(key), form.kind)) from None  # as written
    return value


# ---------------------------------------------------------------------------------- the entry

def _resolve_source(reader: ConfigReader, key: str) -> str | int:
    """``key`` as a source: a camera index as an int, a path that exists relative to the config file resolved."""
    value = reader.get(key)
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if not isinstance(value, (str, int, float)) or isinstance(value, bool):
        raise reader.fail(key, f"must be a source ({SOURCE_FORMS}), got {value!r}")
    source = reader.string(key, required=True)
    assert source is not None
    if source.isdigit():
        return int(source)
    looks_like_path = "://" not in source and "!" not in source and not source.startswith("/")
    if looks_like_path and (reader.base / source).exists():
        return str(reader.base / source)
    return source


def _read_sources(r: ConfigReader) -> tuple[StreamSource, ...]:
    """``sources``: a list of sources, or of ``{name, source}``; unnamed streams are stream0, stream1, ...
    by their place in the list, as ``edgeinfer run -s`` names them. Its form (a list of at most MAX_STREAMS, each
    with a source, names used once) was checked with the document (link/config_document.py)."""
    entries = r.items("sources")
    streams: list[StreamSource] = []
    for index, key in enumerate(entries.data):
        if isinstance(entries.data[key], Mapping):
            fields = entries.mapping(key, ("name", "source"))
            assert fields is not None
            name = fields.identifier("name", default_stream_name(index))
            source = _resolve_source(fields, "source")
        else:
            name, source = default_stream_name(index), _resolve_source(entries, key)
        assert name is not None
        streams.append(StreamSource(name, source))
    return tuple(streams)


def read_pipeline(item: Any, index: int, file: str, base: Path) -> PipelineConfig:
    """``pipelines[index]`` of the YAML document as a PipelineConfig (ConfigError names the file and key)."""
    if not isinstance(item, Mapping):
        raise ConfigError(f"{file}: pipelines[{index}]: must be a mapping with name, model and source")
    r = ConfigReader(item, f"pipelines[{index}].", file, base)
    r.check_unknown(set(PIPELINE_KEYS))
    name = r.identifier("name", default_pipeline_name(index))
    model = r.path("model")
    if model is None:
        raise r.fail("model", "required (path to a .tflite, .onnx or OpenVINO .xml model)")
    values: dict[str, Any] = {"name": name, "model": model}
    # one of source and sources, batch with sources: checked with the document (link/config_document.py)
    if r.has("sources"):
        values["sources"] = _read_sources(r)
        values["batch"] = r.positive_int("batch")
    else:
        values["source"] = _resolve_source(r, "source")
    for key, form in _FORMS.items():
        if form.given(r):
            values[key] = _read_option(r, form)
    try:
        return PipelineConfig(**values)
    except ValueError as exc:  # options that are fine alone but not together
        raise ConfigError(f"{file}: pipelines[{index}]: {exc}") from None

"""Keyed config validation: typed access to one YAML mapping, with errors that name the file and the key.

:class:`KeyedReader` is how agent.yaml and the device profiles are read: ``reader.number("max_fps",
None, above=0)`` either returns a value of the right type or raises the reader's error class (a
constructor argument: ``ConfigError``, ``ProfileError``) with the message ``FILE: WHERE KEY:
problem``, e.g. ``agent.yaml: pipelines[0].max_fps: must be a number > 0, got -1``. It remembers
nothing but the keys it was asked for; unknown keys are found with :meth:`KeyedReader.check_unknown`,
which suggests the closest known one.

A reader is lenient or strict about how a value is written. Lenient (agent.yaml): a null is the key
left out, and a number where text is wanted is read as its text (``mqtt_version: 5``). Strict (device
profiles): a key that is present is checked as written, so a null or a number where text is wanted is
an error, except for the accessors called with ``nullable=True``, where a null is the key left out.
"""

from __future__ import annotations

import copy
import difflib
import os
import re
from collections.abc import Collection, Iterable, Mapping
from collections.abc import Set as AbstractSet
from pathlib import Path
from typing import Any

_UNSET: Any = object()
_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMG]i?B|B)?\s*$", re.IGNORECASE)
_UNITS = {"b": 1, "kb": 1000, "mb": 1000**2, "gb": 1000**3, "kib": 1024, "mib": 1024**2, "gib": 1024**3}
_PAIR_RE = re.compile(r"^\s*(\d+)\s*[xX×]\s*(\d+)\s*$")


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value == value


def suggestion(name: str, known: Collection[str], *, limit: int | None = None) -> str:
    """`` — did you mean 'x'?`` for the closest of ``known``, else `` (known: a, b)``; a set is listed sorted.
    ``limit``: list at most that many of ``known`` (a model's 1000 class names), saying how many there are."""
    names = sorted(known) if isinstance(known, AbstractSet) else list(known)
    close = difflib.get_close_matches(name, names, n=1)
    if close:
        return f" — did you mean {close[0]!r}?"
    if limit is not None and len(names) > limit:
        return f" (known: {', '.join(names[:limit])}, … {len(names)} in all)"
    return f" (known: {', '.join(names)})"


def keyed_error(error: type[Exception], file: str, key: str, problem: str) -> Exception:
    """The error (to raise) about ``key`` of ``file``: ``FILE: KEY: problem``."""
    return error(f"{file}: {key}: {problem}")


def read_document(data: Any, file: str, known: Collection[str], *, error: type[Exception], strict: bool = False,
                  base: Path | None = None) -> KeyedReader:
    """A reader for a whole document, which must be a mapping of ``known`` keys (``FILE: (top level): ...``)."""
    if not isinstance(data, Mapping):
        raise keyed_error(error, file, "(top level)", f"must be a mapping, got {type(data).__name__}")
    reader = KeyedReader(data, "", file, error=error, strict=strict, base=base)
    reader.check_unknown(known)
    return reader


class KeyedReader:
    """Typed access to one mapping of a YAML document, with errors that name the file and the key."""

    def __init__(self, data: Mapping[Any, Any], where: str, file: str, *, error: type[Exception],
                 base: Path | None = None, strict: bool = False) -> None:
        self.data = data
        #: the key path before this mapping's keys, e.g. ``pipelines[0].``
        self.where = where
        self.file = file
        #: what :meth:`fail` builds: ``ConfigError``, ``ProfileError``
        self.error = error
        #: relative paths are relative to this folder (the config file's); None: left relative
        self.base = base
        #: a present key is checked as written (see the module's docstring)
        self.strict = strict

    def fail(self, key: str, problem: str) -> Exception:
        """The error for ``key`` (to raise): ``FILE: WHERE KEY: problem``."""
        return keyed_error(self.error, self.file, f"{self.where}{key}", problem)

    def _raw(self, key: str, nullable: bool = False) -> Any:
        """The value as written, or ``_UNSET`` when the key is left out (or is a null that counts as left out)."""
        value = self.data.get(key, _UNSET)
        if value is None and (nullable or not self.strict):
            return _UNSET
        return value

    def _child(self, data: Mapping[Any, Any], where: str, known: Collection[str] | None = None) -> KeyedReader:
        child = copy.copy(self)  # keeps a subclass and its settings
        child.data, child.where = data, where
        if known is not None:
            child.check_unknown(known)
        return child

    def get(self, key: str, default: Any = None) -> Any:
        """The raw value of ``key``; ``default`` when it is missing (or null, in a lenient reader)."""
        value = self._raw(key)
        return default if value is _UNSET else value

    def has(self, key: str) -> bool:
        """Whether ``key`` is given (in a lenient reader a null counts as not given)."""
        return self._raw(key) is not _UNSET

    def is_null(self, key: str) -> bool:
        """Whether ``key`` is written out as null (``opencv_threads: null``)."""
        return key in self.data and self.data[key] is None

    def check_unknown(self, known: Collection[str]) -> None:
        """The error for the first key not in ``known``, with the closest known key as a suggestion."""
        for key in self.data:
            if key not in known:
                raise self.fail(str(key), f"unknown key{suggestion(str(key), known)}")

    # ------------------------------------------------------------------------------ mappings, lists

    def nested(self, key: str, known: Iterable[str]) -> KeyedReader | None:
        """A reader for the mapping under ``key`` (unknown keys checked), or None when it is not given or null."""
        value = self.get(key)
        if value is None:
            return None
        names = sorted(known)
        if not isinstance(value, Mapping):
            raise self.fail(key, f"must be a mapping of {', '.join(names)}, got {value!r}")
        return self._child(value, f"{self.where}{key}.", set(names))

    def mapping(self, key: str, known: Collection[str] | None = None, *,
                nullable: bool = False) -> KeyedReader | None:
        """A reader for the mapping under ``key`` (unknown keys checked when ``known`` is given); None if not given."""
        value = self._raw(key, nullable)
        if value is _UNSET:
            return None
        if not isinstance(value, Mapping):
            raise self.fail(key, f"must be a mapping, got {type(value).__name__}")
        return self._child(value, f"{self.where}{key}.", known)

    def items(self, key: str) -> KeyedReader:
        """A reader over the list under ``key``, entries keyed ``key[0]``, ``key[1]``…; one value is a list of one."""
        value = self._raw(key)
        if value is _UNSET:
            value = []
        elif not isinstance(value, list):
            value = [value]
        return self._child({f"{key}[{i}]": item for i, item in enumerate(value)}, self.where)

    # ---------------------------------------------------------------------------------------- text

    def string(self, key: str, default: str | None = None, *, required: bool = False,
               choices: tuple[str, ...] | None = None, empty: bool = False, nullable: bool = False) -> str | None:
        """A non-empty string (``empty``: may be blank), one of ``choices``; a lenient reader takes a number's text."""
        value = self._raw(key, nullable)
        if value is _UNSET:
            if required:
                raise self.fail(key, "required")
            return default
        if not self.strict and _is_number(value):  # mqtt_version: 5, device_id: 42
            value = str(value)
        if not isinstance(value, str) or (not empty and not value.strip()):
            raise self.fail(key, f"must be a non-empty string, got {value!r}")
        if choices is not None and value not in choices:
            raise self.fail(key, f"must be one of {', '.join(choices)}, got {value!r}")
        return value

    def strings(self, key: str) -> tuple[str, ...] | None:
        """A non-empty list of non-empty strings (a lone string is a list of one); None when not given."""
        value = self._raw(key)
        if value is _UNSET:
            return None
        if isinstance(value, str):
            value = [value]
        if not isinstance(value, list) or not value:
            raise self.fail(key, f"must be a non-empty list of strings, got {value!r}")
        entries = self.items(key)
        return tuple(str(entries.string(entry, required=True)) for entry in entries.data)

    def regex(self, key: str) -> str | None:
        """A regular expression (an empty one matches anything); None when not given."""
        text = self.string(key, empty=True)
        if text is not None:
            try:
                re.compile(text)
            except re.error as exc:
                raise self.fail(key, f"is not a valid regular expression ({exc})") from None
        return text

    def path(self, key: str, *, must_exist: bool = False) -> str | None:
        """A file path, ``~`` expanded, relative to :attr:`base`."""
        value = self.string(key)
        if value is None:
            return None
        resolved = Path(os.path.expanduser(value))
        if not resolved.is_absolute() and self.base is not None:
            resolved = self.base / resolved
        if must_exist and not resolved.exists():
            raise self.fail(key, f"file {resolved} does not exist")
        return str(resolved)

    # ------------------------------------------------------------------------------------- numbers

    def number(self, key: str, default: float | None, *, minimum: float | None = None, above: float | None = None,
               maximum: float | None = None, integer: bool = False) -> Any:
        """An integer or a number (as written), within the bounds given."""
        value = self._raw(key)
        if value is _UNSET:
            return default
        kind = "an integer" if integer else "a number"
        ok = isinstance(value, int) if integer else isinstance(value, (int, float))
        if not ok or isinstance(value, bool) or value != value:
            raise self.fail(key, f"must be {kind}, got {value!r}")
        if above is not None and not value > above:
            raise self.fail(key, f"must be {kind} > {above:g}, got {value!r}")
        if minimum is not None and value < minimum:
            raise self.fail(key, f"must be {kind} >= {minimum:g}, got {value!r}")
        if maximum is not None and value > maximum:
            raise self.fail(key, f"must be {kind} <= {maximum:g}, got {value!r}")
        return value

    def positive_int(self, key: str, default: int | None = None, *, nullable: bool = False) -> int | None:
        """An integer >= 1 (not a bool); ``nullable``: a null is allowed too (it reads as ``default``)."""
        value = self._raw(key, nullable)
        if value is _UNSET:
            return default
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise self.fail(key, f"must be a positive integer{' or null' if nullable else ''}, got {value!r}")
        return value

    def numbers(self, key: str) -> float | tuple[float, ...] | None:
        """A number, or a non-empty list of numbers (one per channel: ``mean: [127.5, 127.5, 127.5]``)."""
        value = self._raw(key)
        if value is _UNSET:
            return None
        if _is_number(value):
            return float(value)
        if isinstance(value, list) and value and all(_is_number(v) for v in value):
            return tuple(float(v) for v in value)
        raise self.fail(key, f"must be a number or a list of numbers, got {value!r}")

    def pair(self, key: str) -> tuple[int, int] | None:
        """Two positive integers, written ``640x480`` or ``[640, 480]``."""
        value = self._raw(key)
        if value is _UNSET:
            return None
        match = _PAIR_RE.match(value) if isinstance(value, str) else None
        if match:
            pair = (int(match.group(1)), int(match.group(2)))
        elif isinstance(value, list) and len(value) == 2 and all(type(v) is int for v in value):
            pair = (value[0], value[1])
        else:
            pair = (0, 0)
        if min(pair) < 1:
            raise self.fail(key, f"must be WIDTHxHEIGHT such as 640x480, or [640, 480], got {value!r}")
        return pair

    def boolean(self, key: str, default: bool) -> bool:
        """true or false (not yes/no, not 0/1)."""
        value = self._raw(key)
        if value is _UNSET:
            return default
        if not isinstance(value, bool):
            raise self.fail(key, f"must be true or false, got {value!r}")
        return value

    def size(self, key: str, default: int, *, minimum: int) -> int:
        """A size in bytes: a number, or with a unit (``512KiB``, ``64MiB``, ``1GB``)."""
        value = self._raw(key)
        if value is _UNSET:
            return default
        if isinstance(value, int) and not isinstance(value, bool):
            size = value
        else:
            match = _SIZE_RE.match(str(value))
            if not match or isinstance(value, bool):
                raise self.fail(key, f"must be a size such as 67108864, 512KiB or 64MiB, got {value!r}")
            size = int(float(match.group(1)) * _UNITS[(match.group(2) or "B").lower()])
        if size < minimum:
            raise self.fail(key, f"must be at least {minimum} bytes ({minimum // 1024} KiB), got {size}")
        return size


#: the bounds a dataclass field may state in its metadata, under their JSON Schema names (a schema copies them)
BOUND_WORDS = {"minimum": ">=", "exclusiveMinimum": ">", "maximum": "<=", "exclusiveMaximum": "<"}


def bounds(**given: float) -> dict[str, float]:
    """A field's metadata stating its bounds: ``field(default=None, metadata=bounds(exclusiveMinimum=0))``."""
    unknown = set(given) - set(BOUND_WORDS)
    if unknown:
        raise TypeError(f"unknown bound(s) {sorted(unknown)}; bounds are {', '.join(BOUND_WORDS)}")
    return dict(given)


def out_of_bounds(name: str, value: Any, metadata: Mapping[str, Any]) -> str | None:
    """What is wrong with ``value`` of field ``name`` against the bounds in its ``metadata`` (``max_fps must be
    > 0, not -1``), or None; a None value is not checked, NaN is never within bounds."""
    if value is None or isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    checks = {"minimum": lambda bound: value >= bound, "exclusiveMinimum": lambda bound: value > bound,
              "maximum": lambda bound: value <= bound, "exclusiveMaximum": lambda bound: value < bound}
    for word, symbol in BOUND_WORDS.items():
        if word in metadata and not checks[word](metadata[word]):
            return f"{name} must be {symbol} {metadata[word]:g}, not {value}"
    return None


__all__ = ["BOUND_WORDS", "KeyedReader", "bounds", "keyed_error", "out_of_bounds", "read_document", "suggestion"]

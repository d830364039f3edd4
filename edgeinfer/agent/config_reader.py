"""Typed access to one mapping of agent.yaml, with errors that name the file and the key.

:class:`ConfigReader` is how every part of the config is read: ``reader.number("max_fps", None,
above=0)`` either returns a value of the right type or raises a
:class:`~edgeinfer.errors.ConfigError` such as ``agent.yaml: pipelines[0].max_fps: must be a
number > 0, got -1``. It remembers nothing but the keys it was asked for; unknown keys are found
with :meth:`ConfigReader.check_unknown`, which suggests the closest known one.
"""

from __future__ import annotations

import difflib
import os
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from ..errors import ConfigError
from ..link.protocol import ID_PATTERN

#: device ids, fleet names, pipeline names, groups: one MQTT topic level each
ID_RE = re.compile(ID_PATTERN)
_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMG]i?B|B)?\s*$", re.IGNORECASE)
_UNITS = {"b": 1, "kb": 1000, "mb": 1000**2, "gb": 1000**3, "kib": 1024, "mib": 1024**2, "gib": 1024**3}
_PAIR_RE = re.compile(r"^\s*(\d+)\s*[xX×]\s*(\d+)\s*$")


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value == value


class ConfigReader:
    """Typed access to one mapping of the YAML document, with errors that name the file and key."""

    def __init__(self, data: Mapping[str, Any], where: str, file: str, base: Path) -> None:
        self.data = data
        #: the key path before this mapping's keys, e.g. ``pipelines[0].``
        self.where = where
        self.file = file
        #: relative paths are relative to this folder (the config file's)
        self.base = base

    def fail(self, key: str, problem: str) -> ConfigError:
        """The error for ``key`` (to raise): ``FILE: WHERE KEY: problem``."""
        return ConfigError(f"{self.file}: {self.where}{key}: {problem}")

    def get(self, key: str, default: Any = None) -> Any:
        """The raw value of ``key``; ``default`` when it is missing or null."""
        value = self.data.get(key, default)
        return default if value is None else value

    def has(self, key: str) -> bool:
        """Whether ``key`` is given (a null counts as not given)."""
        return self.data.get(key) is not None

    def is_null(self, key: str) -> bool:
        """Whether ``key`` is written out as null (``opencv_threads: null``)."""
        return key in self.data and self.data[key] is None

    def nested(self, key: str, known: Iterable[str]) -> ConfigReader | None:
        """A reader for the mapping under ``key`` (unknown keys checked), or None when it is not given."""
        value = self.get(key)
        if value is None:
            return None
        names = sorted(known)
        if not isinstance(value, Mapping):
            raise self.fail(key, f"must be a mapping of {', '.join(names)}, got {value!r}")
        reader = ConfigReader(value, f"{self.where}{key}.", self.file, self.base)
        reader.check_unknown(set(names))
        return reader

    def string(self, key: str, default: str | None = None, *, required: bool = False,
               choices: tuple[str, ...] | None = None, pattern: re.Pattern[str] | None = None) -> str | None:
        """A non-empty string (numbers are taken as their text), one of ``choices`` or matching ``pattern``."""
        value = self.get(key)
        if value is None:
            if required:
                raise self.fail(key, "required")
            return default
        if _is_number(value):  # mqtt_version: 5, device_id: 42
            value = str(value)
        if not isinstance(value, str) or not value.strip():
            raise self.fail(key, f"must be a non-empty string, got {value!r}")
        if choices is not None and value not in choices:
            raise self.fail(key, f"must be one of {', '.join(choices)}, got {value!r}")
        if pattern is not None and not pattern.match(value):
            raise self.fail(key, f"{value!r} is not valid: use 1-64 of A-Z a-z 0-9 . _ - (starting with a letter "
                                 "or digit)")
        return value

    def number(self, key: str, default: float | None, *, minimum: float | None = None, above: float | None = None,
               maximum: float | None = None, integer: bool = False) -> Any:
        """An integer or a number (as written), within the bounds given."""
        value = self.get(key)
        if value is None:
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

    def numbers(self, key: str) -> float | tuple[float, ...] | None:
        """A number, or a non-empty list of numbers (one per channel: ``mean: [127.5, 127.5, 127.5]``)."""
        value = self.get(key)
        if value is None:
            return None
        if _is_number(value):
            return float(value)
        if isinstance(value, list) and value and all(_is_number(v) for v in value):
            return tuple(float(v) for v in value)
        raise self.fail(key, f"must be a number or a list of numbers, got {value!r}")

    def pair(self, key: str) -> tuple[int, int] | None:
        """Two positive integers, written ``640x480`` or ``[640, 480]``."""
        value = self.get(key)
        if value is None:
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
        value = self.get(key)
        if value is None:
            return default
        if not isinstance(value, bool):
            raise self.fail(key, f"must be true or false, got {value!r}")
        return value

    def path(self, key: str, *, must_exist: bool = False) -> str | None:
        """A file path, ``~`` expanded, relative to the config file's folder."""
        value = self.string(key)
        if value is None:
            return None
        resolved = Path(os.path.expanduser(value))
        if not resolved.is_absolute():
            resolved = self.base / resolved
        if must_exist and not resolved.exists():
            raise self.fail(key, f"file {resolved} does not exist")
        return str(resolved)

    def size(self, key: str, default: int, *, minimum: int) -> int:
        """A size in bytes: a number, or with a unit (``512KiB``, ``64MiB``, ``1GB``)."""
        value = self.get(key)
        if value is None:
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

    def check_unknown(self, known: set[str]) -> None:
        """ConfigError for the first key not in ``known``, with the closest known key as a suggestion."""
        for key in self.data:
            if key not in known:
                close = difflib.get_close_matches(str(key), sorted(known), n=1)
                hint = f" — did you mean {close[0]!r}?" if close else f" (known: {', '.join(sorted(known))})"
                raise self.fail(str(key), f"unknown key{hint}")

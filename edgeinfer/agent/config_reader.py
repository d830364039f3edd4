"""The reader of agent.yaml: the shared :class:`~edgeinfer.util.config.KeyedReader`, plus the agent's ids.

A :class:`ConfigReader` raises :class:`~edgeinfer.errors.ConfigError` (``agent.yaml:
pipelines[0].max_fps: must be a number > 0, got -1``), reads leniently (a null is a key left out)
and resolves relative paths from the config file's folder. What only the agent has is here: the
id rule of :mod:`edgeinfer.link.protocol` (device ids, fleet, pipeline names, groups).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..errors import ConfigError
from ..link.protocol import ID_PATTERN
from ..util.config import KeyedReader

#: device ids, fleet names, pipeline names, groups: one MQTT topic level each
ID_RE = re.compile(ID_PATTERN)


class ConfigReader(KeyedReader):
    """A lenient :class:`KeyedReader` for agent.yaml: ConfigError, paths relative to ``base``, the agent's ids."""

    base: Path

    def __init__(self, data: Mapping[str, Any], where: str, file: str, base: Path) -> None:
        super().__init__(data, where, file, error=ConfigError, base=base)

    def identifier(self, key: str, default: str | None) -> str | None:
        """An id (device, fleet, pipeline name): one MQTT topic level, 1-64 of ``A-Z a-z 0-9 . _ -``."""
        value = self.string(key)
        if value is None:
            return default
        if not ID_RE.match(value):
            raise self.fail(key, f"{value!r} is not valid: use 1-64 of A-Z a-z 0-9 . _ - (starting with a letter "
                                 "or digit)")
        return value

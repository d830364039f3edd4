"""Label files: one label per line (line number = class index), or ``"<index> <label>"`` / ``"<index>: <label>"``."""

from __future__ import annotations

import io
import os
import re
import zipfile
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import LabelsError

if TYPE_CHECKING:
    from ..runtime.model import ModelInfo

_INDEXED = re.compile(r"^\s*(\d+)\s*[:\s]\s*(.+?)\s*$")


class Labels:
    """Class index -> name; unknown indices read as ``"class <i>"``."""

    def __init__(self, names: dict[int, str]) -> None:
        self._names = dict(names)

    @classmethod
    def load(cls, path: str | os.PathLike) -> Labels:
        """Read a labels file in either format (detected from its lines)."""
        label_path = Path(path)
        try:
            lines = label_path.read_text(encoding="utf-8").splitlines()
        except FileNotFoundError:
            raise LabelsError(f"labels file not found: {label_path}") from None
        except (OSError, UnicodeDecodeError) as exc:
            raise LabelsError(f"cannot read labels file {label_path}: {exc}") from None
        return cls.from_lines(lines)

    @classmethod
    def from_lines(cls, lines: list[str]) -> Labels:
        """Parse label lines in either format."""
        lines = [ln for ln in (raw.rstrip("\r\n") for raw in lines) if ln.strip()]
        matches = [_INDEXED.match(ln) for ln in lines]
        if lines and all(matches):
            return cls({int(m.group(1)): m.group(2) for m in matches if m})
        return cls(dict(enumerate(ln.strip() for ln in lines)))

    @classmethod
    def embedded(cls, model: ModelInfo) -> Labels | None:
        """Labels packed into a .tflite by TFLite metadata, if the model carries a labels file."""
        names = [n for n in model.associated_files if "label" in n.lower() and n.endswith(".txt")]
        if not names:
            return None
        data = Path(model.path).read_bytes()
        try:  # ZipFile finds the archive from its end record, past the flatbuffer in front
            with zipfile.ZipFile(io.BytesIO(data)) as archive:
                text = archive.read(names[0]).decode("utf-8", errors="replace")
        except (zipfile.BadZipFile, KeyError):
            return None
        return cls.from_lines(text.splitlines())

    def __getitem__(self, index: int) -> str:
        return self._names.get(index, f"class {index}")

    def __len__(self) -> int:
        return len(self._names)

    def names(self) -> tuple[str, ...]:
        """Every class name, by index."""
        return tuple(self._names[index] for index in sorted(self._names))

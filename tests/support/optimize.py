"""Helpers for the optimize and bench tests."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from .assets import (
    IMAGENET_LABELS,
    IMAGES,
    MOBILENET_TINY,
    MOBILENET_TINY_ONNX,
    MOBILENET_V2,
    MOBILENET_V2_FLOAT_ONNX,
    MOBILENET_V2_ONNX,
)
from .processes import edgeinfer_cmd

#: MobileNet v2 (TF) normalisation: (pixel - 128) / 128, see ../shared/assets/README.md
MOBILENET_NORM = ("--mean", "128", "--std", "128")


def run_cli(*args: str, timeout: float = 240) -> subprocess.CompletedProcess:
    """The CLI in a subprocess, as a user runs it."""
    return subprocess.run(edgeinfer_cmd(*map(str, args)), capture_output=True, text=True, timeout=timeout)


def json_out(result: subprocess.CompletedProcess) -> dict:
    """The JSON document a ``--json`` command printed on stdout."""
    return json.loads(result.stdout)


def error_line(result: subprocess.CompletedProcess) -> str:
    """The single ``edgeinfer: error:`` line of a failed command (asserts there is exactly one line)."""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("edgeinfer: error:"), lines[0]
    assert "Traceback" not in result.stderr
    return lines[0]


def leftovers(folder: Path) -> list[str]:
    """Temporary files an interrupted or refused write would leave behind."""
    return sorted(p.name for p in folder.iterdir() if ".tmp" in p.name or p.name.endswith(".probe"))


__all__ = [
    "IMAGENET_LABELS",
    "IMAGES",
    "MOBILENET_NORM",
    "MOBILENET_TINY",
    "MOBILENET_TINY_ONNX",
    "MOBILENET_V2",
    "MOBILENET_V2_FLOAT_ONNX",
    "MOBILENET_V2_ONNX",
    "error_line",
    "json_out",
    "leftovers",
    "run_cli",
]

"""A real small disk for a test: a tmpfs of a few KiB mounted on a folder (the tests run as root), so a write
past it fails with ENOSPC as on a device whose card is full."""

from __future__ import annotations

import contextlib
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest


@contextlib.contextmanager
def small_disk(folder: Path, size_kib: int) -> Iterator[Path]:
    """``folder`` (created) on a tmpfs of ``size_kib`` KiB while the block runs; skipped where mounting is not
    allowed (a container without CAP_SYS_ADMIN), saying so."""
    folder.mkdir(parents=True, exist_ok=True)
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_kib}k", "tmpfs", str(folder)],
                             capture_output=True, text=True)
    if mounted.returncode:
        pytest.skip(f"cannot mount a small tmpfs here (a full disk is needed): {mounted.stderr.strip()}")
    try:
        yield folder
    finally:
        if subprocess.run(["umount", str(folder)], capture_output=True).returncode:
            subprocess.run(["umount", "-l", str(folder)], capture_output=True)

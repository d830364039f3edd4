"""What the device side needs of installed packages' metadata, read from their ``*.dist-info`` folders.

The agent reports the installed runtimes' versions and looks for delegate plug-ins (the
``edgeinfer.delegates`` entry-point group). :mod:`importlib.metadata` answers both, but brings ``email``,
``csv`` and ``importlib.resources``: 2 MiB resident in the agent (measured with bench/footprint.py, issue 18).
Installed distributions record themselves as ``{name}-{version}.dist-info`` folders on ``sys.path`` holding
``METADATA`` (its ``Version:`` header) and ``entry_points.txt`` (PyPA's "Recording installed projects"),
setuptools' ``*.egg-info`` folders the same with ``PKG-INFO``: these read them. Whatever they cannot look
into — an egg, a zip archive on the path — is answered by importlib.metadata, as is the parsing of entry
points once a plug-in is declared.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Sequence


def _normalise(name: str) -> str:
    return re.sub(r"[-_.]+", "_", name).lower()


def _info_folders() -> list[str] | None:
    """Each ``*.dist-info`` (and setuptools' ``*.egg-info``) folder on ``sys.path``, in path order; None when an
    entry is one only importlib.metadata can read (a zip archive, an egg)."""
    folders = []
    for entry in sys.path:
        base = entry or "."
        try:
            names = os.listdir(base)
        except NotADirectoryError:
            return None
        except OSError:  # gone, or not a folder at all (an import hook's marker)
            continue
        for name in sorted(names):
            if name.endswith(".egg"):
                return None
            if name.endswith((".dist-info", ".egg-info")):
                folders.append(os.path.join(base, name))
    return folders


def _metadata_version(folder: str) -> str | None:
    headers = "METADATA" if folder.endswith(".dist-info") else "PKG-INFO"
    try:
        with open(os.path.join(folder, headers), encoding="utf-8") as fh:
            for line in fh:
                if not line.strip():  # the headers end at the first blank line
                    return None
                if line.startswith("Version:"):
                    return line.split(":", 1)[1].strip()
    except (OSError, UnicodeDecodeError):
        return None
    return None


def version(name: str) -> str | None:
    """The installed version of distribution ``name`` (``"opencv-python-headless"``), None when not installed."""
    return versions((name,))[name]


def versions(names: Sequence[str]) -> dict[str, str | None]:
    """:func:`version` of each of ``names``, from one look at ``sys.path``."""
    folders = _info_folders()
    if folders is None:
        return {name: _metadata_version_of(name) for name in names}
    found: dict[str, str] = {}  # normalised name -> its first folder on the path, as the import system finds it
    for folder in folders:
        stem = os.path.basename(folder).rpartition(".")[0]  # name-version, or name[-version[-pyX.Y]] for an egg
        found.setdefault(_normalise(stem.split("-")[0]), folder)
    return {name: _metadata_version(found[key]) if (key := _normalise(name)) in found else None for name in names}


def _metadata_version_of(name: str) -> str | None:
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as metadata_version

    try:
        return metadata_version(name)
    except PackageNotFoundError:
        return None


def entry_points(group: str) -> dict[str, str]:
    """``{name: "module:attribute"}`` of the entry points in ``group``; importlib.metadata reads them once
    any distribution's entry_points.txt names the group."""
    folders = _info_folders()
    if folders is not None and not any(_declares(folder, group) for folder in folders):
        return {}
    from importlib.metadata import entry_points as metadata_entry_points

    return {ep.name: ep.value for ep in metadata_entry_points(group=group)}


def _declares(folder: str, group: str) -> bool:
    try:
        with open(os.path.join(folder, "entry_points.txt"), encoding="utf-8") as fh:
            return f"[{group}]" in fh.read()
    except (OSError, UnicodeDecodeError):
        return False

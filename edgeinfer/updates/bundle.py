"""An agent bundle: edgeinfer's own wheel and the wheels it needs, as one artifact of an ``agent`` deployment.

The bundle is an uncompressed tar (wheels are zips already), made the same byte for byte from the same wheels
(sorted names, no times, no owners), so the fleet's content-addressed store keeps one copy and its sha256 — the
one the signed manifest names — says what it is::

    bundle.json     {"format": 1, "name": "edgeinfer", "version": "0.2.0", "wheel": "edgeinfer-0.2.0-py3-none-any.whl"}
    wheels/*.whl    the edgeinfer wheel and every wheel beside it (its dependencies, pip)

``edgeinfer deploy --agent WHEEL --wheels DIR`` packs it (:func:`pack`); the device unpacks it (:func:`unpack`,
which refuses anything but regular files under ``wheels/`` and the index) and installs every wheel in it with
``pip --no-index`` (edgeinfer/updates/agent_slots.py), so a device with no route to a package index can install.
An agent's version in a deployment is an integer, as a model's is: :func:`version_number`.
"""

from __future__ import annotations

import io
import json
import os
import re
import tarfile
import zipfile
from dataclasses import dataclass, field
from email.parser import HeaderParser
from pathlib import Path

from ..errors import UpdateRejected

BUNDLE_FORMAT = 1
INDEX = "bundle.json"
WHEELS = "wheels"
PROJECT = "edgeinfer"
#: members a bundle may hold, and the bytes it may unpack to (a tar bomb is refused, not unpacked)
MAX_MEMBERS = 2000
MAX_UNPACKED_BYTES = 4 << 30
#: a release segment's parts: the version number is major * 1,000,000 + minor * 1,000 + micro
PART_LIMIT = 1000
MAX_NUMBER = 2**31 - 1
#: a release segment of at most three parts, then anything a pre-, post-, dev- or local part starts with
_RELEASE = re.compile(r"(\d+(?:\.\d+){0,2})(?:[.\-_]?[A-Za-z][A-Za-z0-9.\-_]*)?(?:\+[A-Za-z0-9.]+)?")


def version_number(version: str) -> int:
    """The integer a deployment carries for an edgeinfer version: major * 1,000,000 + minor * 1,000 + micro.

    Only the release segment counts: 0.2.0rc1, 0.2.0 and 0.2.0.post1 are the same number (a device refuses the
    second as not newer), so deploy releases. ValueError for a version that is no PEP 440 release, or whose
    minor or micro part is 1000 or more."""
    match = _RELEASE.fullmatch(version.strip())
    if match is None:
        raise ValueError(f"{version!r} is not a version of the form MAJOR.MINOR.MICRO")
    major, minor, micro = ([int(part) for part in match.group(1).split(".")] + [0, 0])[:3]
    if minor >= PART_LIMIT or micro >= PART_LIMIT:
        raise ValueError(f"version {version}: minor and micro must be below {PART_LIMIT}")
    number = (major * PART_LIMIT + minor) * PART_LIMIT + micro
    if number > MAX_NUMBER:
        raise ValueError(f"version {version} is too large for a deployment's version number")
    return number


def wheel_metadata(path: str | os.PathLike) -> tuple[str, str]:
    """(name, version) from a wheel's ``*.dist-info/METADATA``; ValueError when it is not a wheel."""
    try:
        with zipfile.ZipFile(path) as archive:
            names = [n for n in archive.namelist() if n.count("/") == 1 and n.endswith(".dist-info/METADATA")]
            if len(names) != 1:
                raise ValueError(f"{path} is not a wheel: no single *.dist-info/METADATA in it")
            headers = HeaderParser().parsestr(archive.read(names[0]).decode("utf-8", "replace"))
    except (zipfile.BadZipFile, OSError) as exc:
        raise ValueError(f"{path} is not a wheel: {exc}") from None
    name, version = headers.get("Name"), headers.get("Version")
    if not name or not version:
        raise ValueError(f"{path} is not a wheel: its METADATA has no Name or Version")
    return name, version


@dataclass(frozen=True)
class Bundle:
    """What a bundle holds: edgeinfer's version, its wheel's file name, and every wheel (paths once unpacked)."""

    version: str
    wheel: str
    wheels: tuple[Path, ...] = field(default=())

    @property
    def number(self) -> int:
        return version_number(self.version)

    @property
    def name(self) -> str:
        """The artifact's name in a deployment: ``edgeinfer-<version>``."""
        return f"{PROJECT}-{self.version}"

    def pip_wheel(self) -> Path | None:
        """pip's own wheel, when the bundle has one (it can install the others without any pip on the device)."""
        return next((w for w in self.wheels if w.name.lower().startswith("pip-")), None)


def pack(wheel: str | os.PathLike, dest: str | os.PathLike, *, wheels_dir: str | os.PathLike | None = None) -> Bundle:
    """Write the bundle of ``wheel`` (edgeinfer's) and every ``*.whl`` in ``wheels_dir`` to ``dest``.

    ValueError when ``wheel`` is not an edgeinfer wheel with a usable version, or ``wheels_dir`` holds another
    edgeinfer wheel."""
    wheel = Path(wheel)
    name, version = wheel_metadata(wheel)
    if name.lower().replace("_", "-") != PROJECT:
        raise ValueError(f"{wheel.name} is a wheel of {name!r}, not of {PROJECT}")
    version_number(version)
    others = sorted(Path(wheels_dir).glob("*.whl")) if wheels_dir is not None else []
    for other in others:
        if other.name != wheel.name and wheel_metadata(other)[0].lower().replace("_", "-") == PROJECT:
            raise ValueError(f"{other} is another {PROJECT} wheel: give --wheels a folder of its dependencies only")
    members = {wheel.name: wheel, **{o.name: o for o in others if o.name != wheel.name}}
    index = {"format": BUNDLE_FORMAT, "name": PROJECT, "version": version, "wheel": wheel.name}
    with tarfile.open(dest, "w", format=tarfile.PAX_FORMAT) as archive:
        _add(archive, INDEX, json.dumps(index, sort_keys=True).encode())
        for file_name in sorted(members):
            _add(archive, f"{WHEELS}/{file_name}", members[file_name].read_bytes())
    return Bundle(version, wheel.name, tuple(members[n] for n in sorted(members)))


def _add(archive: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size, info.mode, info.mtime = len(data), 0o644, 0
    archive.addfile(info, io.BytesIO(data))


def unpack(bundle: str | os.PathLike, dest: str | os.PathLike) -> Bundle:
    """Unpack a (verified) bundle into ``dest``: its index and its wheels, nothing else.

    UpdateRejected('bad_bundle') for a file that is no bundle of this format, a member that is not a regular file
    of ``wheels/`` (a link, a device, a path out of ``dest``), too many members or bytes, or an index whose wheel
    is missing."""
    folder = Path(dest)
    folder.mkdir(parents=True, exist_ok=True)
    try:
        with tarfile.open(bundle, "r:") as archive:
            members = archive.getmembers()
            _check(members)
            index = json.loads(_read(archive, INDEX))
            wheels = []
            for member in members:
                if member.name == INDEX:
                    continue
                target = folder / WHEELS / Path(member.name).name
                target.parent.mkdir(exist_ok=True)
                target.write_bytes(_read(archive, member.name))
                wheels.append(target)
    except (tarfile.TarError, OSError, ValueError, KeyError) as exc:
        raise UpdateRejected("bad_bundle", f"the agent bundle does not unpack: {exc}") from None
    if not isinstance(index, dict) or index.get("format") != BUNDLE_FORMAT or index.get("name") != PROJECT:
        raise UpdateRejected("bad_bundle", f"{INDEX} is not an index of a {PROJECT} bundle of format {BUNDLE_FORMAT}")
    version, wheel = str(index.get("version")), str(index.get("wheel"))
    if not any(w.name == wheel for w in wheels):
        raise UpdateRejected("bad_bundle", f"the bundle does not hold its own wheel {wheel}")
    try:
        version_number(version)
    except ValueError as exc:
        raise UpdateRejected("bad_bundle", str(exc)) from None
    return Bundle(version, wheel, tuple(sorted(wheels)))


def _check(members: list[tarfile.TarInfo]) -> None:
    if len(members) > MAX_MEMBERS:
        raise ValueError(f"{len(members)} members, more than {MAX_MEMBERS}")
    if sum(m.size for m in members) > MAX_UNPACKED_BYTES:
        raise ValueError(f"more than {MAX_UNPACKED_BYTES} bytes")
    names = set()
    for member in members:
        parts = member.name.split("/")
        wheel_file = len(parts) == 2 and parts[0] == WHEELS and parts[1].endswith(".whl") \
            and not parts[1].startswith(".")
        if not member.isreg() or not (member.name == INDEX or wheel_file):
            raise ValueError(f"unexpected member {member.name!r} (a bundle holds {INDEX} and {WHEELS}/*.whl files)")
        if member.name in names:
            raise ValueError(f"{member.name!r} twice")
        names.add(member.name)
    if INDEX not in names:
        raise ValueError(f"no {INDEX}")


def _read(archive: tarfile.TarFile, name: str) -> bytes:
    handle = archive.extractfile(name)
    if handle is None:
        raise ValueError(f"{name} is not a file")
    return handle.read()

"""Device profiles: the schema, validation, the search path and loading.

A profile (one YAML file in ``device_profiles/``) says how to recognise a device family, which
delegates to try in which order, thread count, camera defaults, telemetry sources and a memory
budget. Matching profiles against a machine is :mod:`edgeinfer.device.detect`; what the machine
is, :mod:`edgeinfer.device.host`; reading its sensors, :mod:`edgeinfer.device.sensors`.

Search path: the profiles shipped with edgeinfer, then each directory in ``$EDGEINFER_PROFILE_DIRS``
(``os.pathsep``-separated), then directories given by the caller (``--profile-dir``). A profile
in a later directory replaces a profile of the same name from an earlier one.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from ..errors import ProfileError
from ..util.config import KeyedReader, keyed_error, read_document
from ..util.yaml_text import load_yaml
from .host import ARCH_ALIASES

PROFILE_DIRS_ENV = "EDGEINFER_PROFILE_DIRS"
PROFILE_ENV = "EDGEINFER_PROFILE"
SCHEMA_VERSION = 1

#: how much each kind of evidence counts toward a profile's specificity
WEIGHTS = {
    "device_tree_model": 8, "tegra_release": 8, "usb": 4, "pci": 4, "device_nodes": 4,
    "cpu_model": 2, "cpu_flags": 1, "arch": 1,
}
_USB_ID = re.compile(r"^[0-9a-f]{4}:[0-9a-f]{4}$")
_NAME = re.compile(r"^[a-z0-9][a-z0-9._-]*$")
_DELEGATE_SPEC = re.compile(r"^[a-z][a-z0-9_-]*(:[A-Za-z0-9_.:,-]+)?$")
_SCRIPT = re.compile(r"^[\w.-]+\.sh$")


# ---------------------------------------------------------------------------------------- schema

@dataclass(frozen=True, kw_only=True)
class Match:
    """How to recognise a device. Every criterion given must hold; lists match when any entry does
    (``cpu_flags``: all of them)."""

    device_tree_model: str | None = None  # regex searched in the device-tree model
    tegra_release: str | None = None  # regex searched in /etc/nv_tegra_release ("" = the file exists)
    usb: tuple[str, ...] = ()  # vendor:product ids, lower-case hex
    pci: tuple[str, ...] = ()
    device_nodes: tuple[str, ...] = ()  # absolute paths, globs allowed (/dev/apex_*)
    cpu_flags: tuple[str, ...] = ()
    cpu_model: str | None = None  # regex searched in /proc/cpuinfo's model name
    arch: tuple[str, ...] = ()  # x86_64, aarch64, armv7l

    @property
    def specificity(self) -> int:
        """The weight of the evidence this match requires: more specific profiles win."""
        return sum(weight for key, weight in WEIGHTS.items() if getattr(self, key) not in (None, ()))


@dataclass(frozen=True, kw_only=True)
class Camera:
    """Camera defaults: a V4L2 node and a GStreamer pipeline with {width} {height} {fps} fields."""

    device: str | None = None
    gstreamer: str | None = None
    width: int = 640
    height: int = 480
    fps: int = 30

    def pipeline(self, width: int | None = None, height: int | None = None, fps: int | None = None) -> str | None:
        """The GStreamer pipeline with the size and rate filled in (None when the profile has none)."""
        if self.gstreamer is None:
            return None
        return self.gstreamer.format(width=width or self.width, height=height or self.height, fps=fps or self.fps)


@dataclass(frozen=True, kw_only=True)
class PowerRail:
    """A power rail read from sysfs: ``power`` in mW if readable, else ``voltage`` (mV) times ``current`` (mA).

    Each is a path glob as seen on the device; the first readable match is used.
    """

    name: str
    power: str | None = None
    voltage: str | None = None
    current: str | None = None


@dataclass(frozen=True, kw_only=True)
class Telemetry:
    """Where telemetry reads temperatures and power on this device."""

    #: (label, thermal zone type such as ``cpu-thermal`` or an absolute path to a millidegree file;
    #: ``a|b`` tries ``a`` then ``b``)
    thermal_zones: tuple[tuple[str, str], ...] = ()
    power_rails: tuple[PowerRail, ...] = ()


@dataclass(frozen=True, kw_only=True)
class Profile:
    """One device family: recognition, delegate order, threads, camera, telemetry, memory budget."""

    name: str
    description: str
    match: Match
    delegates: tuple[str, ...]
    threads: int | None = None
    camera: Camera = field(default_factory=Camera)
    telemetry: Telemetry = field(default_factory=Telemetry)
    memory_budget_mb: int | None = None
    #: the provisioning script in firmware_scripts/ for this device family
    setup_script: str | None = None
    #: L4T (JetPack) major releases this device supports, for the doctor's JetPack check
    l4t: tuple[int, ...] = ()
    #: (codec, GStreamer decoder fragments tried in order) for RTSP on this board's hardware decoder
    stream_decode: tuple[tuple[str, tuple[str, ...]], ...] = ()
    extends: str | None = None
    #: the file this profile was loaded from
    source: str = ""
    #: 0 for a shipped profile, 1, 2, … for each later directory; on equal specificity the later wins
    layer: int = 0

    @property
    def specificity(self) -> int:
        """Its match's specificity (see :attr:`Match.specificity`)."""
        return self.match.specificity

    def decoders(self) -> dict[str, tuple[str, ...]]:
        """``stream_decode`` as the mapping :func:`edgeinfer.capture.hwdecode.open_rtsp` takes."""
        return dict(self.stream_decode)

    def to_dict(self) -> dict[str, Any]:
        """Plain data (for --json and telemetry)."""
        data = asdict(self)
        data["telemetry"]["thermal_zones"] = dict(self.telemetry.thermal_zones)
        data["stream_decode"] = {codec: list(fragments) for codec, fragments in self.stream_decode}
        return data


# ------------------------------------------------------------------------------------ validation

_TOP_KEYS = ("schema", "name", "description", "extends", "match", "delegates", "threads", "camera", "telemetry",
             "memory_budget_mb", "setup_script", "l4t", "stream_decode")
_MATCH_KEYS = tuple(WEIGHTS)
_CAMERA_KEYS = ("device", "gstreamer", "width", "height", "fps")
_TELEMETRY_KEYS = ("thermal_zones", "power_rails")
_RAIL_KEYS = ("power", "voltage", "current")
_STREAM_CODECS = ("h264", "h265")  # capture.hwdecode.CODECS: device/ may not import capture/
_MERGED_SECTIONS = ("match", "camera", "telemetry", "stream_decode")


def _error(path: str, key: str, message: str) -> Exception:
    return keyed_error(ProfileError, path, key, message)


def _check_raw(path: str, data: Any) -> dict:
    """Type-check one file's mapping (before ``extends`` is resolved); return it as a dict."""
    r = read_document(data, path, _TOP_KEYS, error=ProfileError, strict=True)
    if r.has("schema") and r.get("schema") != SCHEMA_VERSION:
        raise r.fail("schema", f"this edgeinfer reads schema {SCHEMA_VERSION}, the file says {r.get('schema')!r}")
    for key in ("name", "extends"):
        name = r.string(key)
        if name is not None and not _NAME.match(name):
            raise r.fail(key, f"{name!r} must be lower-case letters, digits, '.', '_' or '-'")
    r.string("description")
    match = r.mapping("match", _MATCH_KEYS)
    if match is not None:
        _check_match(match)
    for i, spec in enumerate(r.strings("delegates") or ()):
        if not _DELEGATE_SPEC.match(spec):
            raise r.fail(f"delegates[{i}]", f"{spec!r} is not a delegate spec like 'xnnpack' or 'coral:usb'")
    r.positive_int("threads", nullable=True)
    r.positive_int("memory_budget_mb", nullable=True)
    script = r.string("setup_script")
    if script is not None and not _SCRIPT.match(script):
        raise r.fail("setup_script", f"{script!r} must be a script file name like setup-pi.sh")
    releases = r.items("l4t")
    for key in releases.data:
        releases.positive_int(key)
    camera = r.mapping("camera", _CAMERA_KEYS, nullable=True)
    if camera is not None:
        _check_camera(camera)
    telemetry = r.mapping("telemetry", _TELEMETRY_KEYS, nullable=True)
    if telemetry is not None:
        _check_telemetry(telemetry)
    decode = r.mapping("stream_decode", _STREAM_CODECS, nullable=True)
    for codec in decode.data if decode is not None else ():
        for i, fragment in enumerate(decode.strings(codec) or ()):
            if "appsink" in fragment or "rtspsrc" in fragment:
                raise decode.fail(f"{codec}[{i}]", "names the decoder only (… ! nvvidconv), not the source or sink")
    return dict(r.data)


def _check_match(match: KeyedReader) -> None:
    for key in ("device_tree_model", "cpu_model"):
        match.regex(key)
    if match.get("tegra_release") is not True:  # true: the file exists
        match.regex("tegra_release")
    for key in ("usb", "pci"):
        for i, item in enumerate(match.strings(key) or ()):
            if not _USB_ID.match(item):
                raise match.fail(f"{key}[{i}]", f"{item!r} is not a vendor:product id like 1a6e:089a "
                                 "(four lower-case hex digits each)")
    for i, item in enumerate(match.strings("device_nodes") or ()):
        if not item.startswith("/"):
            raise match.fail(f"device_nodes[{i}]", f"{item!r} must be an absolute path like /dev/apex_0")
    for key in ("cpu_flags", "arch"):
        match.strings(key)


def _check_camera(camera: KeyedReader) -> None:
    for key in ("width", "height", "fps"):
        camera.positive_int(key)
    device = camera.string("device", nullable=True)
    if device is not None and not device.startswith("/"):
        raise camera.fail("device", f"{device!r} must be an absolute path like /dev/video0")
    pipeline = camera.string("gstreamer", nullable=True)
    if pipeline is not None:
        try:
            pipeline.format(width=1, height=1, fps=1)
        except (KeyError, IndexError, ValueError) as exc:
            raise camera.fail("gstreamer", f"only {{width}}, {{height}} and {{fps}} may appear in braces "
                              f"({type(exc).__name__}: {exc})") from None


def _check_telemetry(telemetry: KeyedReader) -> None:
    # an empty (or false) section is no zones / no rails, as _build reads it
    zones = telemetry.mapping("thermal_zones") if telemetry.get("thermal_zones") else None
    if zones is not None:
        for label in zones.data:
            zones.string(label)
    rails = telemetry.mapping("power_rails") if telemetry.get("power_rails") else None
    if rails is not None:
        for label in rails.data:
            _check_rail(rails, label)


def _check_rail(rails: KeyedReader, label: str) -> None:
    rail = rails.mapping(label, _RAIL_KEYS)
    assert rail is not None  # the label is a key of rails
    for part in rail.data:
        value = str(rail.string(part, required=True))
        if not value.startswith("/"):
            raise rail.fail(part, f"{value!r} must be an absolute sysfs path")
    if "power" not in rail.data and not {"voltage", "current"} <= set(rail.data):
        raise rails.fail(label, "needs 'power' (mW), or both 'voltage' (mV) and 'current' (mA)")


def _build(path: str, data: Mapping) -> Profile:
    """A Profile from a checked, ``extends``-resolved mapping; required keys are checked here."""
    for key in ("name", "match", "delegates"):
        if key not in data:
            raise _error(path, key, "is required")
    match_raw = dict(data["match"])
    if not match_raw:
        raise _error(path, "match", "needs at least one criterion (a generic profile can match on 'arch')")
    tegra = match_raw.get("tegra_release")
    match = Match(
        device_tree_model=match_raw.get("device_tree_model"),
        tegra_release="" if tegra is True else tegra,
        usb=_as_tuple(match_raw.get("usb")), pci=_as_tuple(match_raw.get("pci")),
        device_nodes=_as_tuple(match_raw.get("device_nodes")),
        cpu_flags=_as_tuple(match_raw.get("cpu_flags")), cpu_model=match_raw.get("cpu_model"),
        arch=tuple(ARCH_ALIASES.get(a, a) for a in _as_tuple(match_raw.get("arch"))),
    )
    camera_raw = dict(data.get("camera") or {})
    telemetry_raw = dict(data.get("telemetry") or {})
    rails = tuple(PowerRail(name=str(label), **dict(rail))
                  for label, rail in (telemetry_raw.get("power_rails") or {}).items())
    zones = tuple((str(label), str(where)) for label, where in (telemetry_raw.get("thermal_zones") or {}).items())
    l4t = data.get("l4t")
    decode = tuple((str(codec), _as_tuple(fragments)) for codec, fragments in (data.get("stream_decode") or {}).items())
    return Profile(
        name=str(data["name"]), description=str(data.get("description", data["name"])), match=match,
        delegates=tuple(_as_tuple(data["delegates"])), threads=data.get("threads"),
        camera=Camera(**camera_raw), telemetry=Telemetry(thermal_zones=zones, power_rails=rails),
        memory_budget_mb=data.get("memory_budget_mb"), setup_script=data.get("setup_script"),
        l4t=() if l4t is None else tuple(l4t) if isinstance(l4t, list) else (l4t,), extends=data.get("extends"),
        stream_decode=decode,
        source=path,
    )


def _as_tuple(value: Any) -> tuple:
    if value is None:
        return ()
    return (value,) if isinstance(value, str) else tuple(value)


# --------------------------------------------------------------------------------------- loading

def builtin_profile_dir() -> Path:
    """The profiles shipped with edgeinfer: inside the installed package, else the source checkout's.
    (A path beside the package's own files, not importlib.resources: edgeinfer is installed as files, and
    importlib.resources is 0.5 MiB of the agent's memory for this one lookup.)"""
    package = Path(__file__).resolve().parents[1]
    packaged = package / "device_profiles"
    return packaged if packaged.is_dir() else package.parent / "device_profiles"


def profile_dirs(extra: Iterable[str | os.PathLike] = (), *, env: Mapping[str, str] | None = None,
                 builtin: bool = True) -> list[Path]:
    """The search path: shipped profiles, then ``$EDGEINFER_PROFILE_DIRS``, then ``extra``."""
    env = os.environ if env is None else env
    dirs = [builtin_profile_dir()] if builtin else []
    dirs += [Path(p) for p in env.get(PROFILE_DIRS_ENV, "").split(os.pathsep) if p.strip()]
    dirs += [Path(p) for p in extra]
    return dirs


def _read_yaml(path: Path) -> Any:
    import yaml

    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ProfileError(f"{path}: cannot read the profile ({exc.strerror or exc})") from exc
    except UnicodeDecodeError as exc:
        raise ProfileError(f"{path}: is not UTF-8 text ({exc.reason})") from exc
    try:
        return load_yaml(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else "(syntax)"
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ProfileError(f"{path}: {where}: invalid YAML: {problem}") from exc


def _merge(base: Mapping, child: Mapping) -> dict:
    merged = {k: v for k, v in base.items() if k not in ("name", "description")}
    for key, value in child.items():
        if key in _MERGED_SECTIONS and isinstance(value, Mapping) and isinstance(merged.get(key), Mapping):
            section = dict(merged[key])
            section.update(value)
            merged[key] = section
        else:
            merged[key] = value
    merged.pop("extends", None)
    return merged


_Definitions = dict[str, list[tuple[str, dict, int]]]


def _collect(directories: Iterable[Path]) -> _Definitions:
    """name -> every definition (file, checked mapping, layer), earliest first; the last one is in force."""
    raws: _Definitions = {}
    for layer, directory in enumerate(directories):
        if not directory.is_dir():
            raise ProfileError(f"{directory}: profile directory does not exist (from --profile-dir or "
                               f"${PROFILE_DIRS_ENV})")
        seen_here: dict[str, str] = {}
        for path in sorted(directory.glob("*.yaml")) + sorted(directory.glob("*.yml")):
            raw = _check_raw(str(path), _read_yaml(path))
            name = raw.setdefault("name", path.stem)
            if name in seen_here:
                raise _error(str(path), "name", f"{name!r} is also defined in {seen_here[name]}")
            seen_here[name] = str(path)
            raws.setdefault(name, []).append((str(path), raw, layer))
    return raws


def _resolve(raws: _Definitions, names: Iterable[str]) -> dict[str, Profile]:
    """Profiles for ``names`` with ``extends`` resolved; ``extends: <own name>`` extends the earlier definition."""

    def resolve(name: str, index: int, chain: tuple[tuple[str, int], ...]) -> dict:
        path, raw, _layer = raws[name][index]
        base_name = raw.get("extends")
        if base_name is None:
            return raw
        if base_name == name:
            if index == 0:
                raise _error(path, "extends", f"{name!r} extends itself and no earlier directory defines it")
            base_index = index - 1
        elif base_name in raws:
            base_index = len(raws[base_name]) - 1
        else:
            raise _error(path, "extends", f"no profile named {base_name!r} (known: {', '.join(sorted(raws))})")
        if (base_name, base_index) in chain:
            cycle = " -> ".join(n for n, _ in (*chain, (base_name, base_index)))
            raise _error(path, "extends", f"circular: {cycle}")
        merged = _merge(resolve(base_name, base_index, (*chain, (base_name, base_index))), raw)
        merged["name"] = raw["name"]
        if "description" in raw:
            merged["description"] = raw["description"]
        merged["extends"] = base_name
        return merged

    profiles = {}
    for name in names:
        path, _raw, layer = raws[name][-1]
        profiles[name] = replace(_build(path, resolve(name, len(raws[name]) - 1, ((name, len(raws[name]) - 1),))),
                                 layer=layer)
    return profiles


def load_profiles(dirs: Iterable[str | os.PathLike] = (), *, env: Mapping[str, str] | None = None,
                  builtin: bool = True) -> dict[str, Profile]:
    """Every profile on the search path (see :func:`profile_dirs`), validated, ``extends`` resolved."""
    raws = _collect(profile_dirs(dirs, env=env, builtin=builtin))
    return _resolve(raws, list(raws))


def load_profile(path: str | os.PathLike) -> Profile:
    """One profile file on its own; its ``extends`` may name a shipped profile."""
    path = Path(path)
    raws = _collect([builtin_profile_dir()])
    raw = _check_raw(str(path), _read_yaml(path))
    name = raw.setdefault("name", path.stem)
    raws.setdefault(name, []).append((str(path), raw, 1))
    return _resolve(raws, [name])[name]


__all__ = [
    "PROFILE_DIRS_ENV", "PROFILE_ENV", "SCHEMA_VERSION", "WEIGHTS", "Camera", "Match", "PowerRail", "Profile",
    "Telemetry", "builtin_profile_dir", "load_profile", "load_profiles", "profile_dirs",
]

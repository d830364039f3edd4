"""Device profiles: schema, loading with validation, and detection against a root filesystem.

A profile (one YAML file in ``device_profiles/``) says how to recognise a device family, which
delegates to try in which order, thread count, camera defaults, telemetry sources and a memory
budget. Detection is an explicit call, :func:`detect`, that reads a root filesystem (``/`` on the
device, a small fake tree in tests) — nothing is probed at import time. The most *specific*
matching profile wins: "Pi 4 + Coral USB" (device-tree model and a USB id) beats "Pi 4" (model
only), which beats "generic aarch64" (architecture only).

Search path: the profiles shipped with edgeinfer, then each directory in ``$EDGEINFER_PROFILE_DIRS``
(``os.pathsep``-separated), then directories given by the caller (``--profile-dir``). A profile
in a later directory replaces a profile of the same name from an earlier one.
"""

from __future__ import annotations

import difflib
import glob as _glob
import os
import platform
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from ..errors import ProfileError

PROFILE_DIRS_ENV = "EDGEINFER_PROFILE_DIRS"
PROFILE_ENV = "EDGEINFER_PROFILE"
SCHEMA_VERSION = 1

#: Coral USB Accelerator before (Global Unichip) and after (Google) its firmware is loaded
CORAL_USB_IDS = ("1a6e:089a", "18d1:9302")
#: Coral M.2 / Mini PCIe accelerator (the apex chip)
CORAL_PCI_IDS = ("1ac1:089a",)
#: Intel Neural Compute Stick 2 (Movidius Myriad X) before and after its firmware boots
NCS2_USB_IDS = ("03e7:2485", "03e7:f63b")

#: how much each kind of evidence counts toward a profile's specificity
WEIGHTS = {
    "device_tree_model": 8, "tegra_release": 8, "usb": 4, "pci": 4, "device_nodes": 4,
    "cpu_model": 2, "cpu_flags": 1, "arch": 1,
}
#: architecture spellings that mean the same thing
ARCH_ALIASES = {"amd64": "x86_64", "x64": "x86_64", "arm64": "aarch64", "armv8l": "aarch64", "armhf": "armv7l"}
#: where shared libraries are looked for under a root (plus /etc/ld.so.conf.d entries)
LIBRARY_DIRS = (
    "/lib", "/lib64", "/usr/lib", "/usr/lib64", "/usr/local/lib", "/lib/*-linux-gnu", "/usr/lib/*-linux-gnu",
    "/usr/lib/*-linux-gnu/tegra", "/usr/local/cuda/lib64", "/usr/local/cuda/targets/*/lib",
)
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

    def evaluate(self, host: Host) -> tuple[bool, tuple[str, ...]]:
        """Whether ``host`` satisfies every criterion, and the evidence that it does."""
        evidence: list[str] = []
        if self.device_tree_model is not None:
            if not host.model or not re.search(self.device_tree_model, host.model):
                return False, ()
            evidence.append(f"device-tree model {host.model!r}")
        if self.tegra_release is not None:
            if host.tegra_release is None or not re.search(self.tegra_release, host.tegra_release):
                return False, ()
            evidence.append(f"/etc/nv_tegra_release (L4T {host.l4t_string or '?'})")
        for key, present in (("usb", host.usb_ids), ("pci", host.pci_ids)):
            wanted = getattr(self, key)
            if wanted:
                hits = [i for i in wanted if i in present]
                if not hits:
                    return False, ()
                evidence.append(f"{key.upper()} {', '.join(hits)}")
        if self.device_nodes:
            nodes = [n for pattern in self.device_nodes for n in host.glob(pattern)]
            if not nodes:
                return False, ()
            evidence.append(f"device node {', '.join(nodes)}")
        if self.cpu_model is not None:
            if not host.cpu_model or not re.search(self.cpu_model, host.cpu_model):
                return False, ()
            evidence.append(f"CPU {host.cpu_model!r}")
        if self.cpu_flags:
            if not set(self.cpu_flags) <= host.cpu_flags:
                return False, ()
            evidence.append(f"CPU flags {' '.join(self.cpu_flags)}")
        if self.arch:
            if host.arch not in self.arch:
                return False, ()
            evidence.append(f"architecture {host.arch}")
        return True, tuple(evidence)


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
    extends: str | None = None
    #: the file this profile was loaded from
    source: str = ""
    #: 0 for a shipped profile, 1, 2, … for each later directory; on equal specificity the later wins
    layer: int = 0

    @property
    def specificity(self) -> int:
        return self.match.specificity

    def to_dict(self) -> dict[str, Any]:
        """Plain data (for --json and telemetry)."""
        data = asdict(self)
        data["telemetry"]["thermal_zones"] = dict(self.telemetry.thermal_zones)
        return data


# ------------------------------------------------------------------------------------ validation

_TOP_KEYS = ("schema", "name", "description", "extends", "match", "delegates", "threads", "camera", "telemetry",
             "memory_budget_mb", "setup_script", "l4t")
_MATCH_KEYS = tuple(WEIGHTS)
_CAMERA_KEYS = ("device", "gstreamer", "width", "height", "fps")
_TELEMETRY_KEYS = ("thermal_zones", "power_rails")
_RAIL_KEYS = ("power", "voltage", "current")
_MERGED_SECTIONS = ("match", "camera", "telemetry")


def _error(path: str, key: str, message: str) -> ProfileError:
    return ProfileError(f"{path}: {key}: {message}")


def _check_keys(path: str, prefix: str, data: Mapping, allowed: Sequence[str]) -> None:
    for key in data:
        if key not in allowed:
            close = difflib.get_close_matches(str(key), allowed, n=1)
            hint = f" — did you mean {close[0]!r}?" if close else f" (known: {', '.join(allowed)})"
            raise _error(path, f"{prefix}{key}", f"unknown key{hint}")


def _mapping(path: str, key: str, value: Any) -> Mapping:
    if not isinstance(value, Mapping):
        raise _error(path, key, f"must be a mapping, got {type(value).__name__}")
    return value


def _string(path: str, key: str, value: Any, *, allow_empty: bool = False) -> str:
    if not isinstance(value, str) or (not allow_empty and not value.strip()):
        raise _error(path, key, f"must be a non-empty string, got {value!r}")
    return value


def _string_list(path: str, key: str, value: Any) -> tuple[str, ...]:
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not value:
        raise _error(path, key, f"must be a non-empty list of strings, got {value!r}")
    return tuple(_string(path, f"{key}[{i}]", item) for i, item in enumerate(value))


def _positive_int(path: str, key: str, value: Any, *, allow_none: bool = True) -> int | None:
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise _error(path, key, f"must be a positive integer{' or null' if allow_none else ''}, got {value!r}")
    return value


def _regex(path: str, key: str, value: Any) -> str:
    text = _string(path, key, value, allow_empty=True)
    try:
        re.compile(text)
    except re.error as exc:
        raise _error(path, key, f"is not a valid regular expression ({exc})") from None
    return text


def _check_match(path: str, raw: Mapping) -> None:
    _check_keys(path, "match.", raw, _MATCH_KEYS)
    for key in ("device_tree_model", "cpu_model"):
        if key in raw:
            _regex(path, f"match.{key}", raw[key])
    if "tegra_release" in raw and raw["tegra_release"] is not True:
        _regex(path, "match.tegra_release", raw["tegra_release"])
    for key in ("usb", "pci"):
        if key in raw:
            for i, item in enumerate(_string_list(path, f"match.{key}", raw[key])):
                if not _USB_ID.match(item):
                    raise _error(path, f"match.{key}[{i}]", f"{item!r} is not a vendor:product id like 1a6e:089a "
                                 "(four lower-case hex digits each)")
    if "device_nodes" in raw:
        for i, item in enumerate(_string_list(path, "match.device_nodes", raw["device_nodes"])):
            if not item.startswith("/"):
                raise _error(path, f"match.device_nodes[{i}]", f"{item!r} must be an absolute path like /dev/apex_0")
    for key in ("cpu_flags", "arch"):
        if key in raw:
            _string_list(path, f"match.{key}", raw[key])


def _check_raw(path: str, data: Any) -> dict:
    """Type-check one file's mapping (before ``extends`` is resolved); return it as a dict."""
    data = dict(_mapping(path, "(top level)", data))
    _check_keys(path, "", data, _TOP_KEYS)
    if "schema" in data and data["schema"] != SCHEMA_VERSION:
        raise _error(path, "schema", f"this edgeinfer reads schema {SCHEMA_VERSION}, the file says {data['schema']!r}")
    for key in ("name", "extends"):
        if key in data and not _NAME.match(str(_string(path, key, data[key]))):
            raise _error(path, key, f"{data[key]!r} must be lower-case letters, digits, '.', '_' or '-'")
    if "description" in data:
        _string(path, "description", data["description"])
    if "match" in data:
        _check_match(path, _mapping(path, "match", data["match"]))
    if "delegates" in data:
        for i, spec in enumerate(_string_list(path, "delegates", data["delegates"])):
            if not _DELEGATE_SPEC.match(spec):
                raise _error(path, f"delegates[{i}]", f"{spec!r} is not a delegate spec like 'xnnpack' or 'coral:usb'")
    if "threads" in data:
        _positive_int(path, "threads", data["threads"])
    if "memory_budget_mb" in data:
        _positive_int(path, "memory_budget_mb", data["memory_budget_mb"])
    if "setup_script" in data and not _SCRIPT.match(_string(path, "setup_script", data["setup_script"])):
        raise _error(path, "setup_script", f"{data['setup_script']!r} must be a script file name like setup-pi.sh")
    if "l4t" in data:
        releases = data["l4t"] if isinstance(data["l4t"], list) else [data["l4t"]]
        for i, release in enumerate(releases):
            _positive_int(path, f"l4t[{i}]", release, allow_none=False)
    if "camera" in data and data["camera"] is not None:
        camera = _mapping(path, "camera", data["camera"])
        _check_keys(path, "camera.", camera, _CAMERA_KEYS)
        for key in ("width", "height", "fps"):
            if key in camera:
                _positive_int(path, f"camera.{key}", camera[key], allow_none=False)
        if camera.get("device") is not None and not _string(path, "camera.device", camera["device"]).startswith("/"):
            raise _error(path, "camera.device", f"{camera['device']!r} must be an absolute path like /dev/video0")
        if camera.get("gstreamer") is not None:
            pipeline = _string(path, "camera.gstreamer", camera["gstreamer"])
            try:
                pipeline.format(width=1, height=1, fps=1)
            except (KeyError, IndexError, ValueError) as exc:
                raise _error(path, "camera.gstreamer", f"only {{width}}, {{height}} and {{fps}} may appear in braces "
                             f"({type(exc).__name__}: {exc})") from None
    if "telemetry" in data and data["telemetry"] is not None:
        telemetry = _mapping(path, "telemetry", data["telemetry"])
        _check_keys(path, "telemetry.", telemetry, _TELEMETRY_KEYS)
        zones = telemetry.get("thermal_zones") or {}
        for label, where in _mapping(path, "telemetry.thermal_zones", zones).items():
            _string(path, f"telemetry.thermal_zones.{label}", where)
        rails = telemetry.get("power_rails") or {}
        for label, rail in _mapping(path, "telemetry.power_rails", rails).items():
            key = f"telemetry.power_rails.{label}"
            rail = _mapping(path, key, rail)
            _check_keys(path, f"{key}.", rail, _RAIL_KEYS)
            for part, value in rail.items():
                if not _string(path, f"{key}.{part}", value).startswith("/"):
                    raise _error(path, f"{key}.{part}", f"{value!r} must be an absolute sysfs path")
            if "power" not in rail and not {"voltage", "current"} <= set(rail):
                raise _error(path, key, "needs 'power' (mW), or both 'voltage' (mV) and 'current' (mA)")
    return data


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
    return Profile(
        name=str(data["name"]), description=str(data.get("description", data["name"])), match=match,
        delegates=tuple(_as_tuple(data["delegates"])), threads=data.get("threads"),
        camera=Camera(**camera_raw), telemetry=Telemetry(thermal_zones=zones, power_rails=rails),
        memory_budget_mb=data.get("memory_budget_mb"), setup_script=data.get("setup_script"),
        l4t=() if l4t is None else tuple(l4t) if isinstance(l4t, list) else (l4t,), extends=data.get("extends"),
        source=path,
    )


def _as_tuple(value: Any) -> tuple:
    if value is None:
        return ()
    return (value,) if isinstance(value, str) else tuple(value)


# --------------------------------------------------------------------------------------- loading

def builtin_profile_dir() -> Path:
    """The profiles shipped with edgeinfer: inside the installed package, else the source checkout's."""
    from importlib.resources import files

    packaged = files("edgeinfer") / "device_profiles"
    if packaged.is_dir():
        return Path(str(packaged))
    return Path(__file__).resolve().parents[2] / "device_profiles"


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
        return yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))  # libyaml when present
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


# ------------------------------------------------------------------------------------ the host

@dataclass(frozen=True)
class UsbDevice:
    """One USB device seen in sysfs."""

    id: str  # vendor:product
    sysfs: str
    busnum: int | None
    devnum: int | None

    @property
    def node(self) -> str | None:
        """The usbfs node (/dev/bus/usb/BBB/DDD) a user-space driver such as libedgetpu opens."""
        if self.busnum is None or self.devnum is None:
            return None
        return f"/dev/bus/usb/{self.busnum:03d}/{self.devnum:03d}"


@dataclass(frozen=True)
class Host:
    """What detection read from a root filesystem. Paths it reports are as seen on the device."""

    root: str
    live: bool
    arch: str
    model: str | None
    tegra_release: str | None
    l4t: tuple[int, int, int] | None
    usb: tuple[UsbDevice, ...]
    pci_ids: frozenset[str]
    cpu_flags: frozenset[str]
    cpu_model: str | None

    @property
    def usb_ids(self) -> frozenset[str]:
        return frozenset(d.id for d in self.usb)

    @property
    def l4t_string(self) -> str | None:
        return ".".join(map(str, self.l4t)) if self.l4t else None

    def path(self, device_path: str) -> Path:
        """Where ``device_path`` (absolute, as on the device) lies under this root."""
        return Path(self.root) / device_path.lstrip("/")

    def exists(self, device_path: str) -> bool:
        return bool(self.glob(device_path))

    def glob(self, pattern: str) -> list[str]:
        """Device paths matching ``pattern`` under this root (sorted), as seen on the device."""
        root = str(Path(self.root))
        hits = _glob.glob(str(self.path(pattern)))
        return sorted("/" + os.path.relpath(h, root) if root != "/" else h for h in hits)

    def read(self, device_path: str) -> str | None:
        """The text of a file under this root, stripped (None if unreadable)."""
        return _read_text(self.path(device_path))

    def library_dirs(self) -> list[str]:
        dirs = [d for pattern in LIBRARY_DIRS for d in self.glob(pattern)]
        for conf in self.glob("/etc/ld.so.conf.d/*.conf"):
            for line in (self.read(conf) or "").splitlines():
                line = line.split("#", 1)[0].strip()
                if line.startswith("/"):
                    dirs += self.glob(line)
        return list(dict.fromkeys(dirs))

    def find_library(self, pattern: str) -> str | None:
        """First library file matching ``pattern`` (a file-name glob such as ``libnvinfer.so.*``)."""
        for directory in self.library_dirs():
            hits = self.glob(f"{directory}/{pattern}")
            if hits:
                return hits[0]
        return None

    def usb_devices(self, ids: Iterable[str]) -> list[UsbDevice]:
        wanted = set(ids)
        return [d for d in self.usb if d.id in wanted]

    def to_dict(self) -> dict[str, Any]:
        return {"root": self.root, "arch": self.arch, "model": self.model, "l4t": self.l4t_string,
                "usb": sorted(self.usb_ids), "pci": sorted(self.pci_ids), "cpu_model": self.cpu_model}


def _read_text(path: Path) -> str | None:
    try:
        return path.read_bytes().replace(b"\x00", b"").decode("utf-8", errors="replace").strip()
    except OSError:
        return None


_L4T = re.compile(r"R(\d+)\s*\(release\),\s*REVISION:\s*(\d+)(?:\.(\d+))?")


def parse_tegra_release(text: str) -> tuple[int, int, int] | None:
    """``# R36 (release), REVISION: 4.0, ...`` -> (36, 4, 0)."""
    found = _L4T.search(text)
    if not found:
        return None
    return int(found.group(1)), int(found.group(2)), int(found.group(3) or 0)


def _cpuinfo(text: str) -> tuple[frozenset[str], str | None, dict[str, str]]:
    flags: set[str] = set()
    fields: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if not sep:
            continue
        key = key.strip().lower()
        if key in ("flags", "features"):
            flags.update(value.split())
        fields.setdefault(key, value.strip())
    return frozenset(flags), fields.get("model name"), fields


def _arch_from(root: Path, fields: Mapping[str, str], flags: frozenset[str], live: bool) -> str:
    if live:
        return ARCH_ALIASES.get(platform.machine(), platform.machine())
    declared = _read_text(root / "proc/sys/kernel/arch")
    if declared:
        return ARCH_ALIASES.get(declared, declared)
    architecture = fields.get("cpu architecture", "")
    if architecture.startswith("8") or "asimd" in flags:
        return "aarch64"
    if architecture.startswith("7"):
        return "armv7l"
    if "lm" in flags:
        return "x86_64"
    if flags and "vendor_id" in fields:
        return "i686"
    return ""


def probe_host(root: str | os.PathLike = "/", *, arch: str | None = None) -> Host:
    """Read the facts detection needs from ``root``; nothing else is touched."""
    root_path = Path(root)
    live = root_path.resolve() == Path("/")
    model = _read_text(root_path / "proc/device-tree/model") or _read_text(
        root_path / "sys/firmware/devicetree/base/model")
    flags, cpu_model, fields = _cpuinfo(_read_text(root_path / "proc/cpuinfo") or "")
    board = fields.get("model", "")
    if not model and board and not board.isdigit():  # Raspberry Pi OS puts the board name there (x86: a number)
        model = board
    tegra = _read_text(root_path / "etc/nv_tegra_release")
    usb = []
    for device in sorted(root_path.glob("sys/bus/usb/devices/*")):
        vendor, product = _read_text(device / "idVendor"), _read_text(device / "idProduct")
        if vendor and product:
            busnum, devnum = _read_text(device / "busnum"), _read_text(device / "devnum")
            usb.append(UsbDevice(f"{vendor.lower()}:{product.lower()}", "/" + str(device.relative_to(root_path)),
                                 int(busnum) if busnum and busnum.isdigit() else None,
                                 int(devnum) if devnum and devnum.isdigit() else None))
    pci = set()
    for device in root_path.glob("sys/bus/pci/devices/*"):
        vendor, product = _read_text(device / "vendor"), _read_text(device / "device")
        if vendor and product:
            pci.add(f"{vendor.lower().removeprefix('0x')}:{product.lower().removeprefix('0x')}")
    machine = ARCH_ALIASES.get(arch, arch) if arch else _arch_from(root_path, fields, flags, live)
    return Host(root=str(root_path), live=live, arch=machine, model=model or None,
                tegra_release=tegra.splitlines()[0] if tegra else None,
                l4t=parse_tegra_release(tegra) if tegra else None, usb=tuple(usb), pci_ids=frozenset(pci),
                cpu_flags=flags, cpu_model=cpu_model)


# ------------------------------------------------------------------------------------ detection

@dataclass(frozen=True)
class Detection:
    """The matched profile, the host facts, why it matched, and every other profile that matched."""

    profile: Profile | None
    host: Host
    score: int = 0
    evidence: tuple[str, ...] = ()
    #: every matching profile as (name, specificity), best first
    ranking: tuple[tuple[str, int], ...] = ()

    @property
    def ambiguous(self) -> bool:
        """Two profiles matched with the same specificity (a user's profile, else the first by name, was taken)."""
        return len(self.ranking) > 1 and self.ranking[0][1] == self.ranking[1][1]

    def to_dict(self) -> dict[str, Any]:
        return {"profile": self.profile.name if self.profile else None, "score": self.score,
                "evidence": list(self.evidence), "ranking": [list(r) for r in self.ranking],
                "host": self.host.to_dict()}


def detect(root: str | os.PathLike = "/", *, profiles: Mapping[str, Profile] | None = None,
           profile_dirs: Iterable[str | os.PathLike] = (), arch: str | None = None,
           env: Mapping[str, str] | None = None) -> Detection:
    """Match the profiles against ``root``; the most specific match wins (ties: by name).

    ``$EDGEINFER_PROFILE`` names a profile to use without matching (it must exist).
    """
    env = os.environ if env is None else env
    host = probe_host(root, arch=arch)
    known = load_profiles(profile_dirs, env=env) if profiles is None else profiles
    forced = env.get(PROFILE_ENV, "").strip()
    if forced:
        if forced not in known:
            raise ProfileError(f"${PROFILE_ENV}: no profile named {forced!r} (known: {', '.join(sorted(known))})")
        return Detection(known[forced], host, known[forced].specificity, (f"${PROFILE_ENV}={forced}",),
                         ((forced, known[forced].specificity),))
    matches = []
    for profile in known.values():
        ok, evidence = profile.match.evaluate(host)
        if ok:
            matches.append((profile.specificity, profile.layer, profile.name, profile, evidence))
    # most specific first; on a tie the profile from a later directory (a user's) wins, then by name
    matches.sort(key=lambda m: (-m[0], -m[1], m[2]))
    if not matches:
        return Detection(None, host)
    score, _layer, _name, best, evidence = matches[0]
    return Detection(best, host, score, evidence, tuple((m[2], m[0]) for m in matches))


# ------------------------------------------------------------------------------------ telemetry

def read_temperatures(profile: Profile, root: str | os.PathLike = "/") -> dict[str, float]:
    """Degrees Celsius of the profile's thermal zones that exist under ``root``."""
    root_path = Path(root)
    by_type: dict[str, Path] = {}
    for zone in sorted(root_path.glob("sys/class/thermal/thermal_zone*")):
        kind = _read_text(zone / "type")
        if kind:
            by_type.setdefault(kind, zone / "temp")
    temperatures: dict[str, float] = {}
    for label, where in profile.telemetry.thermal_zones:
        for choice in where.split("|"):  # alternatives, e.g. zone names that changed between releases
            path = root_path / choice.lstrip("/") if choice.startswith("/") else by_type.get(choice)
            value = _read_number(path) if path is not None else None
            if value is not None:
                temperatures[label] = value / 1000.0  # sysfs reports millidegrees
                break
    return temperatures


def read_power(profile: Profile, root: str | os.PathLike = "/") -> dict[str, float]:
    """Milliwatts on the profile's power rails that exist under ``root``."""
    host_root = Path(root)

    def first(pattern: str | None) -> float | None:
        if pattern is None:
            return None
        for hit in sorted(_glob.glob(str(host_root / pattern.lstrip("/")))):
            value = _read_number(Path(hit))
            if value is not None:
                return value
        return None

    power: dict[str, float] = {}
    for rail in profile.telemetry.power_rails:
        milliwatts = first(rail.power)
        if milliwatts is None:
            volts, amps = first(rail.voltage), first(rail.current)
            if volts is not None and amps is not None:
                milliwatts = volts * amps / 1000.0
        if milliwatts is not None:
            power[rail.name] = milliwatts
    return power


def _read_number(path: Path | None) -> float | None:
    text = _read_text(path) if path is not None else None
    try:
        return float(text) if text else None
    except ValueError:
        return None


__all__ = [
    "CORAL_PCI_IDS", "CORAL_USB_IDS", "NCS2_USB_IDS", "PROFILE_DIRS_ENV", "PROFILE_ENV", "Camera", "Detection",
    "Host", "Match", "PowerRail", "Profile", "Telemetry", "UsbDevice", "builtin_profile_dir", "detect",
    "load_profile", "load_profiles", "parse_tegra_release", "probe_host", "profile_dirs", "read_power",
    "read_temperatures",
]

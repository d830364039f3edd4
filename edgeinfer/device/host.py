"""What a root filesystem says about the machine: architecture, board, L4T release, USB/PCI ids, CPU.

:func:`probe_host` reads ``root`` (``/`` on the device, a small fake tree in tests, a mounted SD
card image) and nothing else; it is an explicit call, never made at import time. Paths a
:class:`Host` reports are as seen on the device, whatever the root.
"""

from __future__ import annotations

import functools
import glob as _glob
import os
import platform
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: architecture spellings that mean the same thing
ARCH_ALIASES = {"amd64": "x86_64", "x64": "x86_64", "arm64": "aarch64", "armv8l": "aarch64", "armhf": "armv7l"}
#: x86 architectures (the spellings profiles use)
X86_ARCHES = frozenset({"x86_64", "i686", "i386"})
#: x86 flags of the instructions that multiply uint8 by int8 straight into 32-bit sums (VNNI; AMX comes with it)
VNNI_FLAGS = frozenset({"avx512_vnni", "avx_vnni", "amx_int8"})
#: where shared libraries are looked for under a root (plus /etc/ld.so.conf.d entries)
LIBRARY_DIRS = (
    "/lib", "/lib64", "/usr/lib", "/usr/lib64", "/usr/local/lib", "/lib/*-linux-gnu", "/usr/lib/*-linux-gnu",
    "/usr/lib/*-linux-gnu/tegra", "/usr/local/cuda/lib64", "/usr/local/cuda/targets/*/lib",
)


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
        """The vendor:product ids of every USB device."""
        return frozenset(d.id for d in self.usb)

    @property
    def l4t_string(self) -> str | None:
        """The L4T release as ``"36.4.0"`` (None off a Jetson)."""
        return ".".join(map(str, self.l4t)) if self.l4t else None

    def path(self, device_path: str) -> Path:
        """Where ``device_path`` (absolute, as on the device) lies under this root."""
        return Path(self.root) / device_path.lstrip("/")

    def exists(self, device_path: str) -> bool:
        """Whether anything matches ``device_path`` (a glob allowed) under this root."""
        return bool(self.glob(device_path))

    def glob(self, pattern: str) -> list[str]:
        """Device paths matching ``pattern`` under this root (sorted), as seen on the device."""
        root = str(Path(self.root))
        hits = _glob.glob(str(self.path(pattern)))
        return sorted("/" + os.path.relpath(h, root) if root != "/" else h for h in hits)

    def read(self, device_path: str) -> str | None:
        """The text of a file under this root, stripped (None if unreadable)."""
        return read_text(self.path(device_path))

    def library_dirs(self) -> list[str]:
        """The library folders that exist under this root, the standard ones then ld.so.conf.d's."""
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
        """The USB devices whose vendor:product id is one of ``ids``."""
        wanted = set(ids)
        return [d for d in self.usb if d.id in wanted]

    def to_dict(self) -> dict[str, Any]:
        """Plain data (for --json and telemetry)."""
        return {"root": self.root, "arch": self.arch, "model": self.model, "l4t": self.l4t_string,
                "usb": sorted(self.usb_ids), "pci": sorted(self.pci_ids), "cpu_model": self.cpu_model}


def read_text(path: Path) -> str | None:
    """The text of a sysfs/procfs-style file, NULs dropped and stripped (None if unreadable)."""
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


#: binaries every Linux userland has: the ELF header of the first one found names the image's architecture
USERLAND_BINARIES = ("/bin/sh", "/usr/bin/env", "/bin/busybox", "/sbin/init")
#: ELF e_machine -> architecture, by ELF class (1: 32-bit, 2: 64-bit); the spellings profiles use
_ELF_MACHINES = {(3, 1): "i686", (40, 1): "armv7l", (62, 2): "x86_64", (183, 2): "aarch64",
                 (243, 2): "riscv64", (243, 1): "riscv32", (22, 2): "s390x"}
_ELF_PPC64 = 21  # ppc64le / ppc64 by byte order


def elf_arch(path: str | os.PathLike) -> str | None:
    """The architecture an ELF executable is built for, from its header (None if not ELF or unreadable).

    Reads e_ident (class, byte order) and e_machine, the first 20 bytes of the file.
    """
    try:
        with open(path, "rb") as fh:
            header = fh.read(20)
    except OSError:
        return None
    if len(header) < 20 or header[:4] != b"\x7fELF" or header[4] not in (1, 2) or header[5] not in (1, 2):
        return None
    elf_class, little = header[4], header[5] == 1
    machine = int.from_bytes(header[18:20], "little" if little else "big")
    if machine == _ELF_PPC64 and elf_class == 2:
        return "ppc64le" if little else "ppc64"
    return _ELF_MACHINES.get((machine, elf_class))


def resolve_under(root: Path, device_path: str, *, hops: int = 16) -> Path | None:
    """Where ``device_path`` lies under ``root`` with every symlink followed inside the root.

    An image's absolute links (``/bin/sh -> /bin/busybox``) name paths of the image, not of this
    machine, so an absolute target restarts at ``root``; ``..`` never climbs above it. None when
    the links go on for more than ``hops`` (a loop).
    """
    pending = [p for p in device_path.split("/") if p]
    resolved: list[str] = []
    while pending:
        part = pending.pop(0)
        if part == ".":
            continue
        if part == "..":
            if resolved:
                resolved.pop()
            continue
        candidate = root.joinpath(*resolved, part)
        if candidate.is_symlink():
            if hops == 0:
                return None
            hops -= 1
            target = os.readlink(candidate)
            if target.startswith("/"):
                resolved = []
            pending[:0] = [p for p in target.split("/") if p]
        else:
            resolved.append(part)
    return root.joinpath(*resolved)


def _userland_arch(root: Path) -> str | None:
    for binary in USERLAND_BINARIES:
        path = resolve_under(root, binary)
        found = elf_arch(path) if path is not None and path.is_file() else None
        if found:
            return found
    return None


def _arch_from(root: Path, fields: Mapping[str, str], flags: frozenset[str], live: bool) -> str:
    """The architecture: the running kernel's on ``/``; under another root the image's own.

    Under another root (a mounted SD card, an unpacked image, a chroot), ``proc`` is empty or is the
    build host's, so the ELF header of the root's own ``/bin/sh`` (or ``env``, ``busybox``, ``init``)
    comes first: every Linux userland has one, whatever its distribution (dpkg's database is Debian's
    only, and a debootstrap image has no ``var/lib/dpkg/arch``). Then ``proc`` (fake trees):
    ``proc/sys/kernel/arch``, else what cpuinfo implies.
    """
    if live:
        return ARCH_ALIASES.get(platform.machine(), platform.machine())
    userland = _userland_arch(root)
    if userland:
        return userland
    declared = read_text(root / "proc/sys/kernel/arch")
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


def _usb_devices(root: Path) -> tuple[UsbDevice, ...]:
    usb = []
    for device in sorted(root.glob("sys/bus/usb/devices/*")):
        vendor, product = read_text(device / "idVendor"), read_text(device / "idProduct")
        if vendor and product:
            busnum, devnum = read_text(device / "busnum"), read_text(device / "devnum")
            usb.append(UsbDevice(f"{vendor.lower()}:{product.lower()}", "/" + str(device.relative_to(root)),
                                 int(busnum) if busnum and busnum.isdigit() else None,
                                 int(devnum) if devnum and devnum.isdigit() else None))
    return tuple(usb)


def _pci_ids(root: Path) -> frozenset[str]:
    pci = set()
    for device in root.glob("sys/bus/pci/devices/*"):
        vendor, product = read_text(device / "vendor"), read_text(device / "device")
        if vendor and product:
            pci.add(f"{vendor.lower().removeprefix('0x')}:{product.lower().removeprefix('0x')}")
    return frozenset(pci)


def _board_model(root: Path, cpuinfo_fields: Mapping[str, str]) -> str | None:
    model = read_text(root / "proc/device-tree/model") or read_text(root / "sys/firmware/devicetree/base/model")
    board = cpuinfo_fields.get("model", "")
    if not model and board and not board.isdigit():  # Raspberry Pi OS puts the board name there (x86: a number)
        model = board
    return model or None


def cpu_flags(root: str | os.PathLike = "/") -> frozenset[str]:
    """The CPU's flags (x86) or features (ARM) as ``root``'s ``/proc/cpuinfo`` lists them; empty if unreadable.

    What :func:`probe_host` reads of the CPU, without its USB, PCI and library scans.
    """
    return _cpuinfo(read_text(Path(root) / "proc/cpuinfo") or "")[0]


def u8s8_saturates(arch: str, flags: Iterable[str]) -> bool:
    """Whether INT8 layers multiplied as uint8 x int8 can saturate on a CPU of ``arch`` with these cpuinfo ``flags``.

    An x86 CPU without VNNI multiplies uint8 activations by int8 weights with VPMADDUBSW (PMADDUBSW on SSE4.1),
    which adds each pair of products into 16 bits and saturates at 32767: 255 x 127 x 2 does not fit. ONNX
    Runtime's U8S8 kernels and OpenVINO's (oneDNN) do that on such CPUs; both projects document it (ONNX
    Runtime's remedies: 7-bit weights, "reduce_range", or U8U8 kernels; OpenVINO's: 7-bit weights). VNNI
    (VPDPBUSD; AMX CPUs have it) adds into 32 bits, and ARM kernels widen before they add: exact.
    """
    return ARCH_ALIASES.get(arch, arch) in X86_ARCHES and not VNNI_FLAGS & set(flags)


@functools.cache
def host_u8s8_saturates() -> bool:
    """:func:`u8s8_saturates` for the CPU this process runs on (read once)."""
    return u8s8_saturates(platform.machine(), cpu_flags())


def probe_host(root: str | os.PathLike = "/", *, arch: str | None = None) -> Host:
    """Read the facts detection needs from ``root``; nothing else is touched."""
    root_path = Path(root)
    live = root_path.resolve() == Path("/")
    flags, cpu_model, fields = _cpuinfo(read_text(root_path / "proc/cpuinfo") or "")
    tegra = read_text(root_path / "etc/nv_tegra_release")
    machine = ARCH_ALIASES.get(arch, arch) if arch else _arch_from(root_path, fields, flags, live)
    return Host(root=str(root_path), live=live, arch=machine, model=_board_model(root_path, fields),
                tegra_release=tegra.splitlines()[0] if tegra else None,
                l4t=parse_tegra_release(tegra) if tegra else None, usb=_usb_devices(root_path),
                pci_ids=_pci_ids(root_path), cpu_flags=flags, cpu_model=cpu_model)


__all__ = ["ARCH_ALIASES", "LIBRARY_DIRS", "USERLAND_BINARIES", "VNNI_FLAGS", "X86_ARCHES", "Host", "UsbDevice",
           "cpu_flags", "elf_arch", "host_u8s8_saturates", "parse_tegra_release", "probe_host", "read_text",
           "resolve_under", "u8s8_saturates"]

"""Fake root filesystems for the hardware this machine lacks (Pi, Coral, Jetson, NCS2, Core Ultra).

A fake root holds only the few files detection and the doctor read: the device-tree model,
/proc/cpuinfo, /etc/nv_tegra_release, sysfs USB/PCI ids, device nodes (plain files), libraries
(empty files with the right names), udev rules and /etc/passwd + /etc/group.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

X86_FLAGS = "fpu vme de pse tsc msr pae mce cx8 apic sep mtrr pge mca cmov pat lm sse sse2 ssse3 sse4_1 avx avx2 fma"
ARM_FEATURES = "fp asimd evtstrm crc32 cpuid"


class FakeRoot:
    """Builder for a fake root tree; every method returns self so calls chain."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.path.mkdir(parents=True, exist_ok=True)
        self._usb = 0

    def __str__(self) -> str:
        return str(self.path)

    def __fspath__(self) -> str:
        return str(self.path)

    def file(self, device_path: str, text: str | bytes = "", mode: int | None = None) -> FakeRoot:
        target = self.path / device_path.lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(text, bytes):
            target.write_bytes(text)
        else:
            target.write_text(text)
        if mode is not None:
            os.chmod(target, mode)
        return self

    def model(self, text: str) -> FakeRoot:
        return self.file("/proc/device-tree/model", text.encode() + b"\x00")

    def cpu(self, arch: str, model_name: str | None = None) -> FakeRoot:
        if arch == "x86_64":
            text = (f"processor\t: 0\nvendor_id\t: GenuineIntel\nmodel\t\t: 170\n"
                    f"model name\t: {model_name or 'Intel(R) Xeon(R) CPU'}\nflags\t\t: {X86_FLAGS}\n")
        else:
            text = f"processor\t: 0\nBogoMIPS\t: 108.00\nFeatures\t: {ARM_FEATURES}\nCPU architecture: 8\n"
        return self.file("/proc/cpuinfo", text)

    def tegra(self, release: int, revision: str, board: str = "generic") -> FakeRoot:
        return self.file("/etc/nv_tegra_release", f"# R{release} (release), REVISION: {revision}, GCID: 36191598, "
                                                  f"BOARD: {board}, EABI: aarch64, DATE: Mon May 6 17:34:21 UTC 2024\n")

    def usb(self, vid_pid: str, *, node_mode: int = 0o664, node_gid: int | None = None) -> FakeRoot:
        """A USB device in sysfs plus its usbfs node /dev/bus/usb/001/NNN."""
        self._usb += 1
        vendor, product = vid_pid.split(":")
        sysfs = f"/sys/bus/usb/devices/1-{self._usb}"
        devnum = self._usb + 1
        self.file(f"{sysfs}/idVendor", vendor + "\n").file(f"{sysfs}/idProduct", product + "\n")
        self.file(f"{sysfs}/busnum", "1\n").file(f"{sysfs}/devnum", f"{devnum}\n")
        return self.node(f"/dev/bus/usb/001/{devnum:03d}", mode=node_mode, gid=node_gid)

    def pci(self, vid_pid: str, slot: str = "0000:01:00.0") -> FakeRoot:
        vendor, product = vid_pid.split(":")
        return self.file(f"/sys/bus/pci/devices/{slot}/vendor", f"0x{vendor}\n").file(
            f"/sys/bus/pci/devices/{slot}/device", f"0x{product}\n")

    def node(self, device_path: str, *, mode: int = 0o660, gid: int | None = None) -> FakeRoot:
        self.file(device_path, mode=mode)
        if gid is not None:
            os.chown(self.path / device_path.lstrip("/"), -1, gid)
        return self

    def library(self, name: str, directory: str = "/usr/lib/aarch64-linux-gnu") -> FakeRoot:
        return self.file(f"{directory}/{name}", b"\x7fELF")

    def udev_rule(self, name: str, text: str, directory: str = "/etc/udev/rules.d") -> FakeRoot:
        return self.file(f"{directory}/{name}", text)

    def user(self, name: str, uid: int = 1000, groups: dict[str, int] | None = None) -> FakeRoot:
        groups = groups or {}
        passwd = f"root:x:0:0:root:/root:/bin/bash\n{name}:x:{uid}:{uid}::/home/{name}:/bin/bash\n"
        group = "root:x:0:\n" + f"{name}:x:{uid}:\n" + "".join(f"{g}:x:{gid}:{name}\n" for g, gid in groups.items())
        return self.file("/etc/passwd", passwd).file("/etc/group", group)


def _pi(model: str) -> Callable[[FakeRoot], FakeRoot]:
    return lambda root: root.cpu("aarch64").model(model)


def _jetson(model: str, release: int, revision: str, trt: str) -> Callable[[FakeRoot], FakeRoot]:
    return lambda root: (root.cpu("aarch64").model(model).tegra(release, revision)
                         .node("/dev/nvhost-ctrl-gpu").library(f"libnvinfer.so.{trt}"))


PI4 = "Raspberry Pi 4 Model B Rev 1.4"
PI5 = "Raspberry Pi 5 Model B Rev 1.0"

#: one fake root per shipped profile: the device as that profile should recognise it
ROOTS: dict[str, Callable[[FakeRoot], FakeRoot]] = {
    "generic-x86-64": lambda r: r.cpu("x86_64"),
    "generic-aarch64": lambda r: r.cpu("aarch64").model("Pine64 RockPro64 v2.1"),
    "raspberry-pi-3": _pi("Raspberry Pi 3 Model B Plus Rev 1.3"),
    "raspberry-pi-3-coral-usb": lambda r: _pi("Raspberry Pi 3 Model B Rev 1.2")(r).usb("18d1:9302"),
    "raspberry-pi-4": _pi(PI4),
    "raspberry-pi-4-coral-usb": lambda r: _pi(PI4)(r).usb("1a6e:089a"),
    "raspberry-pi-5": _pi(PI5),
    "raspberry-pi-5-coral-usb": lambda r: _pi(PI5)(r).usb("18d1:9302"),
    "raspberry-pi-5-coral-pcie": lambda r: _pi(PI5)(r).pci("1ac1:089a").node("/dev/apex_0"),
    "coral-dev-board": lambda r: r.cpu("aarch64").model("Freescale i.MX8MQ Phanbell").node("/dev/apex_0"),
    "jetson-nano": _jetson("NVIDIA Jetson Nano Developer Kit", 32, "7.1", "8.2.1"),
    "jetson-xavier-nx": _jetson("NVIDIA Jetson Xavier NX Developer Kit", 35, "4.1", "8.5.2"),
    "jetson-orin-nano": _jetson("NVIDIA Jetson Orin Nano Developer Kit", 36, "4.0", "10.3.0"),
    "jetson-orin-nx": _jetson("NVIDIA Jetson Orin NX Engineering Reference Developer Kit", 35, "4.1", "8.5.2"),
    "jetson-agx-orin": _jetson("NVIDIA Jetson AGX Orin Developer Kit", 36, "3.0", "8.6.2"),
    "jetson-generic": _jetson("NVIDIA Jetson TX2 Developer Kit", 32, "7.1", "8.2.1"),
    "x86-64-ncs2": lambda r: r.cpu("x86_64").usb("03e7:2485"),
    "intel-core-ultra-npu": lambda r: r.cpu("x86_64", "Intel(R) Core(TM) Ultra 7 155H").node("/dev/accel/accel0"),
    "x86-64-coral-usb": lambda r: r.cpu("x86_64").usb("18d1:9302"),
    "x86-64-coral-pcie": lambda r: r.cpu("x86_64").pci("1ac1:089a").node("/dev/apex_0"),
    "x86-64-nvidia-gpu": lambda r: r.cpu("x86_64").node("/dev/nvidia0").library("libnvinfer.so.10.3.0",
                                                                                 "/usr/lib/x86_64-linux-gnu"),
}


def fake_root(path: Path, profile: str) -> FakeRoot:
    """The fake root of ``profile`` (see ROOTS) under ``path``."""
    return ROOTS[profile](FakeRoot(path))


def write_profile(directory: Path, name: str, text: str) -> Path:
    """A user profile file (YAML text) in ``directory``."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / name
    path.write_text(text)
    return path

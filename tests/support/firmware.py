"""Fake root filesystems for the provisioning scripts' tests, and helpers to run the scripts.

This machine has no Pi, Coral, Jetson, NCS2 or NPU, so each device family is a small tree holding
only what the scripts read: the device-tree model, /etc/nv_tegra_release, sysfs USB/PCI ids,
/proc/cpuinfo, /etc/os-release, the dpkg status database, /etc/passwd and /etc/group, python3.N
interpreters (empty executables: only their names are read) and, where a test needs one, a venv's
pyvenv.cfg and *.dist-info directories. The strings are the ones these devices report.
"""

from __future__ import annotations

import hashlib
import os
import re
import stat
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from .assets import REPO

SCRIPTS = REPO / "firmware_scripts"
SCRIPT_NAMES = ("setup-pi.sh", "setup-jetson.sh", "setup-intel.sh", "install-agent.sh")

#: every fake root kind, with the family the scripts must detect
KINDS = {
    "pi4": "pi",
    "pi4-coral": "pi",
    "pi5": "pi",
    "pi5-coral-usb": "pi",
    "pi5-coral-pcie": "pi",
    "jetson-jp5": "jetson",
    "jetson-jp6": "jetson",
    "intel-ncs2": "intel-ncs2",
    "intel-npu": "intel-npu",
    "x86-64": "x86-64",
}

OS_RELEASE = {
    "bookworm": 'PRETTY_NAME="Debian GNU/Linux 12 (bookworm)"\nNAME="Debian GNU/Linux"\nVERSION_ID="12"\n'
                "VERSION_CODENAME=bookworm\nID=debian\n",
    "focal": 'PRETTY_NAME="Ubuntu 20.04.6 LTS"\nNAME="Ubuntu"\nVERSION_ID="20.04"\nVERSION_CODENAME=focal\n'
             "ID=ubuntu\nID_LIKE=debian\n",
    "jammy": 'PRETTY_NAME="Ubuntu 22.04.4 LTS"\nNAME="Ubuntu"\nVERSION_ID="22.04"\nVERSION_CODENAME=jammy\n'
             "ID=ubuntu\nID_LIKE=debian\n",
    "noble": 'PRETTY_NAME="Ubuntu 24.04.1 LTS"\nNAME="Ubuntu"\nVERSION_ID="24.04"\nVERSION_CODENAME=noble\n'
             "ID=ubuntu\nID_LIKE=debian\n",
}

_TEGRA_TAIL = ("# KERNEL_VARIANT: oot\nTARGET_USERSPACE_LIB_DIR=nvidia\n"
               "TARGET_USERSPACE_LIB_DIR_PATH=usr/lib/aarch64-linux-gnu/nvidia\n")
TEGRA_RELEASE = {
    35: "# R35 (release), REVISION: 4.1, GCID: 33958178, BOARD: t186ref, EABI: aarch64, "
        "DATE: Tue Aug  1 19:57:35 UTC 2023\n" + _TEGRA_TAIL,
    36: "# R36 (release), REVISION: 3.0, GCID: 36191598, BOARD: generic, EABI: aarch64, "
        "DATE: Mon May  6 17:34:21 UTC 2024\n" + _TEGRA_TAIL,
}

NVPMODEL_CONF = """\
< POWER_MODEL ID=0 NAME=15W >
CPU_ONLINE CORE_0 1
< POWER_MODEL ID=1 NAME=7W >
CPU_ONLINE CORE_0 1
< POWER_MODEL ID=2 NAME=MAXN_SUPER >
CPU_ONLINE CORE_0 1
< PM_CONFIG DEFAULT=0 >
"""

BASE_GROUPS = ["root:x:0:", "adm:x:4:", "users:x:100:", "video:x:44:", "plugdev:x:46:", "render:x:105:"]


@dataclass
class RootSpec:
    """What one fake root holds."""

    arch: str
    release: str
    python: str  # the distribution's python3 (the /usr/bin/python3 link)
    extra_pythons: tuple[str, ...] = ()
    packages: list[str] = field(default_factory=list)
    model: str | None = None
    cpu: str = ""
    usb: dict[str, str] = field(default_factory=dict)  # sysfs name -> "vid:pid"
    pci: dict[str, str] = field(default_factory=dict)  # sysfs name -> "vendor:device"
    files: dict[str, str] = field(default_factory=dict)
    user: str | None = None


def _spec(kind: str) -> RootSpec:
    hub = {"usb1": "1d6b:0002"}  # a root hub: every real machine has one, and it matches nothing
    if kind.startswith("pi"):
        pi5 = kind.startswith("pi5")
        spec = RootSpec(
            arch="arm64", release="bookworm", python="3.11",
            packages=["python3-venv", "ca-certificates", "curl"],
            model="Raspberry Pi 5 Model B Rev 1.0" if pi5 else "Raspberry Pi 4 Model B Rev 1.4",
            cpu="", usb=dict(hub), user="pi",
            files={"/etc/rpi-issue": "Raspberry Pi reference 2024-07-04\n",
                   "/boot/firmware/config.txt": "[all]\ncamera_auto_detect=1\ndisplay_auto_detect=1\n",
                   "/proc/sys/kernel/osrelease": "6.6.31+rpt-rpi-2712\n" if pi5 else "6.6.31+rpt-rpi-v8\n"},
        )
        if kind in ("pi4-coral", "pi5-coral-usb"):
            spec.usb["2-1"] = "1a6e:089a"  # Global Unichip: the Accelerator before its firmware is loaded
        if kind == "pi5-coral-pcie":
            spec.pci["0000:01:00.0"] = "1ac1:089a"
        return spec
    if kind.startswith("jetson"):
        jp6 = kind == "jetson-jp6"
        spec = RootSpec(
            arch="arm64", release="jammy" if jp6 else "focal", python="3.10" if jp6 else "3.8",
            packages=["nvidia-l4t-gstreamer", "python3-venv", "gstreamer1.0-tools"],
            model="NVIDIA Jetson Orin Nano Developer Kit" if jp6 else "NVIDIA Jetson AGX Xavier Developer Kit",
            usb=dict(hub), user="ubuntu",
            files={"/etc/nv_tegra_release": TEGRA_RELEASE[36 if jp6 else 35],
                   "/etc/nvpmodel.conf": NVPMODEL_CONF,
                   "/usr/lib/aarch64-linux-gnu/gstreamer-1.0/libgstnvarguscamerasrc.so": "",
                   "/proc/sys/kernel/osrelease": "5.15.136-tegra\n" if jp6 else "5.10.120-tegra\n"},
        )
        if jp6:
            spec.packages.append("python3-libnvinfer")
            spec.files["/usr/lib/python3.10/dist-packages/tensorrt/__init__.py"] = "__version__ = '8.6.2'\n"
        return spec
    if kind == "intel-ncs2":
        return RootSpec(arch="amd64", release="jammy", python="3.10", packages=["python3-venv", "usbutils"],
                        cpu="Intel(R) Core(TM) i5-8365U CPU @ 1.60GHz", usb={**hub, "1-2": "03e7:2485"},
                        user="ubuntu", files={"/proc/sys/kernel/osrelease": "5.15.0-119-generic\n"})
    if kind == "intel-npu":
        return RootSpec(arch="amd64", release="noble", python="3.12", packages=["python3-venv"],
                        cpu="Intel(R) Core(TM) Ultra 7 155H", usb=dict(hub), pci={"0000:00:0b.0": "8086:7d1d"},
                        user="ubuntu",
                        files={"/dev/accel/accel0": "", "/sys/module/intel_vpu/version": "1.0\n",
                               "/proc/sys/kernel/osrelease": "6.8.0-45-generic\n"})
    if kind == "x86-64":
        return RootSpec(arch="amd64", release="bookworm", python="3.11", packages=["python3-venv"],
                        cpu="AMD EPYC 7B13 64-Core Processor", usb=dict(hub),
                        files={"/proc/sys/kernel/osrelease": "6.1.0-25-amd64\n"})
    raise ValueError(f"unknown fake root kind {kind!r}; known: {', '.join(KINDS)}")


def _write(root: Path, device_path: str, text: str, mode: int = 0o644) -> Path:
    path = root / device_path.lstrip("/")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(mode)
    return path


def dpkg_status(packages: list[str], arch: str) -> str:
    """A /var/lib/dpkg/status with these packages installed (libc6 first: it carries the architecture)."""
    entries = []
    for name in ["libc6", *packages]:
        entries.append(f"Package: {name}\nStatus: install ok installed\nPriority: optional\n"
                       f"Architecture: {arch}\nVersion: 1.0\nDescription: {name}\n")
    return "\n".join(entries)


def build_root(base: Path, kind: str, *, packages: tuple[str, ...] = (), extra_pythons: tuple[str, ...] = (),
               usb: dict[str, str] | None = None) -> Path:
    """Make a fake root of ``kind`` (see KINDS) under ``base``; extra installed packages, interpreters
    or USB devices can be added."""
    spec = _spec(kind)
    root = base / kind
    root.mkdir(parents=True)
    spec.packages.extend(packages)
    spec.usb.update(usb or {})
    _write(root, "/etc/os-release", OS_RELEASE[spec.release])
    bindir = root / "usr/bin"
    bindir.mkdir(parents=True)
    for version in (spec.python, *spec.extra_pythons, *extra_pythons):
        _write(root, f"/usr/bin/python{version}", "", 0o755)
    (bindir / "python3").symlink_to(f"python{spec.python}")
    _write(root, "/var/lib/dpkg/status", dpkg_status(spec.packages, spec.arch))
    passwd = ["root:x:0:0:root:/root:/bin/bash"]
    groups = list(BASE_GROUPS)
    if spec.user:
        passwd.append(f"{spec.user}:x:1000:1000::/home/{spec.user}:/bin/bash")
        groups.append(f"{spec.user}:x:1000:")
    _write(root, "/etc/passwd", "\n".join(passwd) + "\n")
    _write(root, "/etc/group", "\n".join(groups) + "\n")
    cpuinfo = "processor\t: 0\n"
    if spec.cpu:
        vendor = "AuthenticAMD" if "AMD" in spec.cpu else "GenuineIntel"
        cpuinfo += (f"vendor_id\t: {vendor}\nmodel name\t: {spec.cpu}\nflags\t\t: fpu vme de pse tsc msr pae mce "
                    "cx8 apic sep mtrr pge mca cmov pat pse36 clflush mmx fxsr sse sse2 ht syscall nx lm "
                    "constant_tsc pni ssse3 sse4_1 sse4_2 popcnt aes avx avx2\n")
    else:
        cpuinfo += "BogoMIPS\t: 108.00\nFeatures\t: fp asimd evtstrm crc32 cpuid\nCPU implementer\t: 0x41\n"
    _write(root, "/proc/cpuinfo", cpuinfo)
    _write(root, "/proc/sys/kernel/arch", {"amd64": "x86_64", "arm64": "aarch64"}[spec.arch] + "\n")
    if spec.model:
        # Device-tree strings end in a NUL byte.
        for where in ("/proc/device-tree/model", "/sys/firmware/devicetree/base/model"):
            path = root / where.lstrip("/")
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(spec.model.encode() + b"\0")
    for name, ids in spec.usb.items():
        vendor, product = ids.split(":")
        _write(root, f"/sys/bus/usb/devices/{name}/idVendor", vendor + "\n")
        _write(root, f"/sys/bus/usb/devices/{name}/idProduct", product + "\n")
    for name, ids in spec.pci.items():
        vendor, device = ids.split(":")
        _write(root, f"/sys/bus/pci/devices/{name}/vendor", f"0x{vendor}\n")
        _write(root, f"/sys/bus/pci/devices/{name}/device", f"0x{device}\n")
    for device_path, text in spec.files.items():
        _write(root, device_path, text)
    return root


def add_packages(root: Path, *names: str) -> None:
    """Mark more packages installed in the root's dpkg database."""
    status = root / "var/lib/dpkg/status"
    arch = "arm64" if "Architecture: arm64" in status.read_text() else "amd64"
    with status.open("a") as out:
        for name in names:
            out.write("\n" + dpkg_status([name], arch).split("\n\n", 1)[1])


def make_venv(root: Path, venv: str, python: str, *, system_site: bool, dists: dict[str, str]) -> Path:
    """A venv as the scripts see it: pyvenv.cfg, bin/python, and *.dist-info directories."""
    where = root / venv.lstrip("/")
    _write(root, f"{venv}/pyvenv.cfg",
           f"home = /usr/bin\ninclude-system-site-packages = {'true' if system_site else 'false'}\n"
           f"version = {python}.2\n")
    _write(root, f"{venv}/bin/python", "", 0o755)
    _write(root, f"{venv}/bin/edgeinfer", "", 0o755)
    site = where / f"lib/python{python}/site-packages"
    for name, version in dists.items():
        (site / f"{name}-{version}.dist-info").mkdir(parents=True)
    return where


def tree_digest(root: Path) -> str:
    """A hash of everything under ``root``: paths, types, modes, owners, contents, link targets and
    modification times — a rewrite with the same content changes it too."""
    digest = hashlib.sha256()
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        for name in sorted(dirnames + filenames):
            path = Path(dirpath) / name
            info = path.lstat()
            rel = str(path.relative_to(root))
            digest.update(f"{rel}\0{info.st_mode:o}\0{info.st_uid}:{info.st_gid}\0{info.st_mtime_ns}\0".encode())
            if stat.S_ISLNK(info.st_mode):
                digest.update(os.readlink(path).encode())
            elif stat.S_ISREG(info.st_mode):
                digest.update(path.read_bytes())
    return digest.hexdigest()


def script_env(**extra: str) -> dict[str, str]:
    """The environment the scripts run with: a plain PATH, no sudo user, this tree's edgeinfer as the
    one `--detect auto` may ask (via $EDGEINFER_PYTHON)."""
    env = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8",
           "HOME": os.environ.get("HOME", "/root"), "EDGEINFER_PYTHON": sys.executable,
           "PYTHONPATH": str(REPO), "TMPDIR": os.environ.get("TMPDIR", "/tmp")}
    env.update(extra)
    return env


def run_script(name: str, *args: str | os.PathLike, env: dict[str, str] | None = None,
               timeout: float = 60) -> subprocess.CompletedProcess:
    """Run a provisioning script in a real bash subprocess."""
    return subprocess.run(["bash", str(SCRIPTS / name), *map(str, args)], capture_output=True, text=True,
                          env=env or script_env(), timeout=timeout, cwd="/")


def planned(stdout: str, verb: str | None = None) -> list[str]:
    """The "[dry-run] verb: object" lines of a dry run, as "verb: object" (only ``verb`` if given)."""
    lines = [line[len("[dry-run] "):] for line in stdout.splitlines() if line.startswith("[dry-run] ")]
    return [line for line in lines if verb is None or line.startswith(verb + ": ")]


def written(stdout: str, path: str) -> str | None:
    """The content a dry run would write to ``path`` (the "    | " lines after its write line)."""
    lines = stdout.splitlines()
    for i, line in enumerate(lines):
        if line.startswith(("[dry-run] write: ", "[change] write: ")) and line.split(": ", 1)[1].startswith(path + " "):
            body = []
            for follow in lines[i + 1:]:
                if not follow.startswith("    | "):
                    break
                body.append(follow[6:])
            return "\n".join(body) + "\n"
    return None


def dry(script: str, root: Path, *args: str, expect: int = 0) -> subprocess.CompletedProcess:
    """A dry run against ``root`` that must exit with ``expect``."""
    result = run_script(script, "--dry-run", "--root", root, *args)
    assert result.returncode == expect, f"exit {result.returncode}\nstdout:\n{result.stdout}\nstderr:\n{result.stderr}"
    return result


def runs(stdout: str) -> list[str]:
    """The commands a dry run plans, without the chroot prefix."""
    return [re.sub(r"^chroot \S+ ", "", line[len("run: "):]) for line in planned(stdout, "run")]


def device_line(stdout: str) -> str:
    return next(line for line in stdout.splitlines() if line.startswith("[check] device: "))

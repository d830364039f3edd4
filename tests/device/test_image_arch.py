"""The architecture of another root (an unpacked image, a mounted SD card) comes from the image's own
binaries: such a root has no /proc, or the build host's. The live root keeps platform.machine()."""

from __future__ import annotations

import json
import os
import platform
import struct
import subprocess
from pathlib import Path

import pytest
from support.processes import edgeinfer_cmd
from support.profiles import FakeRoot

from edgeinfer.device.detect import detect
from edgeinfer.device.host import ARCH_ALIASES, elf_arch, probe_host, resolve_under
from edgeinfer.device.profiles import load_profiles

NO_ENV: dict[str, str] = {}
EM_ARM, EM_X86_64, EM_AARCH64 = 0x28, 0x3E, 0xB7


def elf_header(machine: int, *, bits: int = 64, big_endian: bool = False) -> bytes:
    """The ELF header of a position-independent executable (64 bytes for ELF64, 52 for ELF32)."""
    order = ">" if big_endian else "<"
    ident = b"\x7fELF" + bytes([2 if bits == 64 else 1, 2 if big_endian else 1, 1, 0]) + bytes(8)
    if bits == 64:  # e_type ET_DYN, e_machine, e_version, entry, phoff, shoff, flags, ehsize, ph/sh sizes
        return struct.pack(order + "16sHHIQQQIHHHHHH", ident, 3, machine, 1, 0x1040, 64, 0, 0, 64, 56, 0, 64, 0, 0)
    return struct.pack(order + "16sHHIIIIIHHHHHH", ident, 3, machine, 1, 0x1040, 52, 0, 0x5000400, 52, 32, 0,
                       40, 0, 0)


@pytest.fixture(scope="module")
def shipped():
    return load_profiles(env=NO_ENV)


def test_elf_header_helper_is_a_real_header():
    assert len(elf_header(EM_AARCH64)) == 64 and len(elf_header(EM_ARM, bits=32)) == 52


def test_image_without_proc_is_generic_aarch64(tmp_path, shipped):
    root = FakeRoot(tmp_path).file("/bin/sh", elf_header(EM_AARCH64), 0o755)
    assert not (tmp_path / "proc").exists()
    detection = detect(root, profiles=shipped, env=NO_ENV)
    assert detection.host.arch == "aarch64" and not detection.host.live
    assert detection.profile is not None and detection.profile.name == "generic-aarch64", detection.ranking
    assert detection.evidence == ("architecture aarch64",)


def test_merged_usr_and_absolute_links_are_followed_inside_the_image(tmp_path):
    # Debian bookworm: /bin -> usr/bin, /usr/bin/sh -> dash. An absolute link must stay in the image:
    # this machine's own /usr/bin/dash (if any) is not the image's.
    merged = FakeRoot(tmp_path / "merged").file("/usr/bin/dash", elf_header(EM_AARCH64), 0o755)
    (merged.path / "bin").symlink_to("usr/bin")
    (merged.path / "usr/bin/sh").symlink_to("dash")
    assert probe_host(merged).arch == "aarch64"
    absolute = FakeRoot(tmp_path / "absolute").file("/usr/bin/dash", elf_header(EM_AARCH64), 0o755)
    (absolute.path / "bin").mkdir()
    (absolute.path / "bin/sh").symlink_to("/usr/bin/dash")
    assert resolve_under(absolute.path, "/bin/sh") == absolute.path / "usr/bin/dash"
    assert probe_host(absolute).arch == "aarch64"
    escape = FakeRoot(tmp_path / "escape").file("/usr/bin/env", elf_header(EM_AARCH64), 0o755)
    (escape.path / "bin").mkdir()
    (escape.path / "bin/sh").symlink_to("../../../../../../usr/bin/env")  # climbs no higher than the root
    assert resolve_under(escape.path, "/bin/sh") == escape.path / "usr/bin/env"
    assert probe_host(escape).arch == "aarch64"
    loop = FakeRoot(tmp_path / "loop")
    (loop.path / "bin").mkdir()
    (loop.path / "bin/sh").symlink_to("sh")
    assert resolve_under(loop.path, "/bin/sh") is None and probe_host(loop).arch == ""


def test_the_image_wins_over_the_build_hosts_proc(tmp_path, shipped):
    """A chroot with the host's /proc mounted: cpuinfo and kernel/arch say x86-64, the image is arm64."""
    root = FakeRoot(tmp_path).cpu("x86_64").file("/proc/sys/kernel/arch", "x86_64\n")
    root.file("/bin/sh", elf_header(EM_AARCH64), 0o755)
    assert detect(root, profiles=shipped, env=NO_ENV).profile.name == "generic-aarch64"


@pytest.mark.parametrize(("header", "arch"), [
    (elf_header(EM_AARCH64), "aarch64"),
    (elf_header(EM_X86_64), "x86_64"),
    (elf_header(EM_ARM, bits=32), "armv7l"),
    (elf_header(0x15, big_endian=False), "ppc64le"),
    (elf_header(0x16, big_endian=True), "s390x"),
    (elf_header(0xF3), "riscv64"),
    (elf_header(EM_AARCH64, bits=32), None),  # no 32-bit aarch64 ELF
    (elf_header(0x1234), None),
    (b"\x7fELF", None),  # truncated (the fake roots' library stubs)
    (b"#!/bin/sh\necho\n" + bytes(64), None),
])
def test_elf_machines(tmp_path, header, arch):
    (tmp_path / "binary").write_bytes(header)
    assert elf_arch(tmp_path / "binary") == arch


def test_no_elf_in_the_root_falls_back_to_proc(tmp_path, shipped):
    script = FakeRoot(tmp_path / "script").cpu("x86_64").file("/bin/sh", "#!/bin/busybox sh\n", 0o755)
    assert detect(script, profiles=shipped, env=NO_ENV).profile.name == "generic-x86-64"
    assert probe_host(FakeRoot(tmp_path / "empty")).arch == ""


def test_live_root_still_reads_the_running_kernel():
    host = probe_host("/")
    assert host.live and host.arch == ARCH_ALIASES.get(platform.machine(), platform.machine())


def test_device_cli_on_an_image_root(tmp_path):
    root = FakeRoot(tmp_path).file("/usr/bin/env", elf_header(EM_AARCH64), 0o755)
    env = {k: v for k, v in os.environ.items()
           if k not in ("EDGEINFER_DELEGATE", "EDGEINFER_PROFILE", "EDGEINFER_PROFILE_DIRS", "EDGEINFER_STRICT")}
    result = subprocess.run(edgeinfer_cmd("device", "--root", str(root), "--json"), capture_output=True, text=True,
                            timeout=120, env=env)
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["profile"] == "generic-aarch64" and data["detection"]["host"]["arch"] == "aarch64"
    assert Path(data["detection"]["host"]["root"]) == root.path

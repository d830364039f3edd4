"""The arm64 userland of ``make test-arm64``: host tools, qemu through binfmt_misc, a cached Debian bookworm
arm64 root filesystem, overlay layers on it, and the mounts a chroot into it needs.

The cache (``--cache``, default ``build/arm64``)::

    base/               debootstrap --foreign + second stage under qemu: bookworm arm64, minbase, with
                        python3, python3-venv, ca-certificates (the lower layer, never written after the build)
    base.json           what base/ was built from; another key rebuilds it
    layers/NAME/        an overlay's upper and work folders, and layer.json (its key); another key empties it
    mnt/NAME/           where that overlay is mounted while a run uses it
    sys/                the CPU part of a sysfs tree for the emulated cores (rewritten every run)
    logs/               every command's output, one file each

Nothing here runs inside the image except through :meth:`Chroot.run` / :meth:`Chroot.popen`.
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

SUITE = "bookworm"
MIRROR = "http://deb.debian.org/debian"
BASE_PACKAGES = ("python3", "python3-venv", "ca-certificates")
#: host command -> Debian package
HOST_TOOLS = {"debootstrap": "debootstrap", "qemu-aarch64-static": "qemu-user-static",
              "update-binfmts": "binfmt-support"}
BINFMT = Path("/proc/sys/fs/binfmt_misc")
BINFMT_CONF = Path("/usr/lib/binfmt.d/qemu-aarch64.conf")
#: MIDR_EL1 of the cores qemu emulates with QEMU_CPU (what /sys says on the real board)
MIDR = {"cortex-a72": "0x00000000410fd083",   # Raspberry Pi 4
        "cortex-a76": "0x00000000414fd0b1"}   # Raspberry Pi 5
CHROOT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def _die_with_parent() -> None:
    """In a child before exec: SIGKILL it when the harness dies, even by SIGKILL (prctl PR_SET_PDEATHSIG)."""
    ctypes.CDLL(None).prctl(1, signal.SIGKILL)


class SetupError(Exception):
    """The emulated userland cannot be set up; the message says what failed and what to do."""


def host_run(args: list[str], log: Path | None = None, **kwargs) -> subprocess.CompletedProcess:
    """A command on this machine; its output goes to ``log`` (and is returned when there is none)."""
    if log is None:
        return subprocess.run(args, capture_output=True, text=True, **kwargs)
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "a") as out:
        out.write(f"$ {' '.join(args)}\n")
        out.flush()
        return subprocess.run(args, stdout=out, stderr=subprocess.STDOUT, text=True, **kwargs)


def tail(log: Path, lines: int = 15) -> str:
    text = log.read_text(errors="replace").splitlines() if log.exists() else []
    return "\n".join("    | " + line for line in text[-lines:])


def ensure_host_tools(log: Path) -> None:
    missing = sorted({package for tool, package in HOST_TOOLS.items() if shutil.which(tool) is None})
    if not missing:
        return
    if os.geteuid() != 0:
        raise SetupError(f"missing host packages {' '.join(missing)}; as root: apt-get install {' '.join(missing)}")
    print(f"[arm64] installing host packages: {' '.join(missing)}", flush=True)
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    if host_run(["apt-get", "update", "-qq"], log, env=env).returncode or host_run(
            ["apt-get", "install", "-y", "-qq", *missing], log, env=env).returncode:
        raise SetupError(f"apt-get install {' '.join(missing)} failed:\n{tail(log)}")


def ensure_binfmt(log: Path) -> str:
    """qemu-aarch64 registered with binfmt_misc (flag F: the image needs no qemu binary); its description."""
    if not (BINFMT / "register").exists():
        result = host_run(["mount", "-t", "binfmt_misc", "binfmt_misc", str(BINFMT)])
        if result.returncode:
            why = " ".join(result.stderr.split()) or f"exit {result.returncode}"
            raise SetupError(f"binfmt_misc not available: mount -t binfmt_misc binfmt_misc {BINFMT} failed "
                             f"({why}); run as root on a kernel with "
                             "CONFIG_BINFMT_MISC, outside a container that hides /proc/sys")
    entry = BINFMT / "qemu-aarch64"
    if not entry.exists():
        host_run(["update-binfmts", "--enable", "qemu-aarch64"], log)
    if not entry.exists() and BINFMT_CONF.exists():  # binfmt-support not usable: systemd-binfmt's file, by hand
        try:
            (BINFMT / "register").write_text(BINFMT_CONF.read_text().strip())
        except OSError as exc:
            raise SetupError(f"binfmt_misc not available: cannot register qemu-aarch64: {exc}") from None
    if not entry.exists():
        raise SetupError("binfmt_misc not available: qemu-aarch64 is not registered (update-binfmts --enable "
                         f"qemu-aarch64 did nothing and {BINFMT_CONF} is missing); reinstall qemu-user-static")
    lines = entry.read_text().splitlines()
    if lines[0] != "enabled":
        entry.write_text("1")
    fields = dict(line.split(" ", 1) for line in lines[1:] if " " in line)
    interpreter, flags = fields.get("interpreter", "?"), fields.get("flags:", "")
    if "F" not in flags:
        raise SetupError(f"binfmt_misc: qemu-aarch64 is registered without the F flag ({interpreter}, flags "
                         f"'{flags}'), so a chroot would need qemu inside; re-register it: echo -1 > {entry} && "
                         "update-binfmts --enable qemu-aarch64")
    return f"{interpreter} (flags {flags})"


def mounts_under(path: Path) -> list[Path]:
    """Mount points at or below ``path``, deepest first."""
    path = path.resolve()
    found = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        point = Path(line.split()[4].encode().decode("unicode_escape"))
        if point == path or path in point.parents:
            found.append(point)
    return sorted(found, key=lambda p: len(p.parts), reverse=True)


def unmount_stale(cache: Path) -> None:
    """What an interrupted run left mounted under the cache (a SIGKILLed harness cannot clean up)."""
    for point in mounts_under(cache):
        print(f"[arm64] unmounting {point}, left mounted by an earlier run", flush=True)
        if host_run(["umount", str(point)]).returncode:
            host_run(["umount", "-l", str(point)])


def remove_tree(path: Path) -> None:
    """rm -rf, refused while anything is mounted below (a bind mount of /dev or the assets)."""
    if mounts_under(path):
        raise SetupError(f"refusing to delete {path}: still mounted below it: {mounts_under(path)}")
    if path.exists():
        shutil.rmtree(path)


def digest(*parts: object) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:16]


def read_stamp(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def chroot_env(cpu: str, **extra: str) -> dict[str, str]:
    """A clean environment for commands in the image (the host's PIP_* settings point at host paths)."""
    return {"PATH": CHROOT_PATH, "HOME": "/root", "LANG": "C.UTF-8", "TERM": "dumb", "QEMU_CPU": cpu,
            "PIP_DISABLE_PIP_VERSION_CHECK": "1", "PIP_DEFAULT_TIMEOUT": "180", "PYTHONUNBUFFERED": "1", **extra}


def build_base(cache: Path, cpu: str, log: Path) -> tuple[bool, float]:
    """base/ built once; (built now, seconds the build took, now or when it was built)."""
    base, stamp = cache / "base", cache / "base.json"
    key = digest(SUITE, MIRROR, BASE_PACKAGES, "minbase", "host-ca")
    old = read_stamp(stamp)
    if base.is_dir() and old.get("key") == key:
        return False, float(old.get("seconds", 0))
    started = time.monotonic()
    partial = cache / "base.partial"
    for stale in (base, partial):
        remove_tree(stale)
    stamp.unlink(missing_ok=True)
    print(f"[arm64] building the image: debootstrap {SUITE} arm64 (first stage on the host) ...", flush=True)
    first = host_run(["debootstrap", "--arch=arm64", "--foreign", "--variant=minbase",
                      f"--include={','.join(BASE_PACKAGES)}", SUITE, str(partial), MIRROR], log)
    if first.returncode:
        raise SetupError(f"debootstrap (first stage) failed, exit {first.returncode}:\n{tail(log)}")
    print("[arm64] ... second stage under qemu-aarch64 (a few minutes) ...", flush=True)
    second = host_run(["chroot", str(partial), "/debootstrap/debootstrap", "--second-stage"], log,
                      env=chroot_env(cpu))
    if second.returncode:
        raise SetupError(f"debootstrap --second-stage under qemu failed, exit {second.returncode}:\n{tail(log)}")
    # pip and apt in the image trust what this machine trusts (a site's own CA, an egress proxy's).
    local_cas = sorted(Path("/usr/local/share/ca-certificates").glob("**/*.crt"))
    for ca in local_cas:
        shutil.copy2(ca, partial / "usr/local/share/ca-certificates" / ca.name)
    if local_cas and host_run(["chroot", str(partial), "update-ca-certificates"], log,
                              env=chroot_env(cpu)).returncode:
        raise SetupError(f"update-ca-certificates in the image failed:\n{tail(log)}")
    partial.rename(base)
    seconds = time.monotonic() - started
    stamp.write_text(json.dumps({"key": key, "suite": SUITE, "packages": BASE_PACKAGES, "seconds": round(seconds),
                                 "built": time.strftime("%Y-%m-%d %H:%M:%S")}))
    return True, seconds


def write_cpu_sysfs(target: Path, cpu: str) -> None:
    """/sys/devices/system/cpu for the emulated cores: qemu-user emulates the CPU but not the kernel's view of
    it, and the host's x86 sysfs makes the cpuinfo library in LiteRT/XNNPACK and ONNX Runtime crash."""
    if target.exists():
        shutil.rmtree(target)
    cpus = target / "devices/system/cpu"
    cpus.mkdir(parents=True)
    count = os.cpu_count() or 1
    for name in ("possible", "present", "online"):
        (cpus / name).write_text(f"0-{count - 1}\n" if count > 1 else "0\n")
    for index in range(count):
        regs = cpus / f"cpu{index}/regs/identification"
        regs.mkdir(parents=True)
        (regs / "midr_el1").write_text(MIDR[cpu] + "\n")


class Layer:
    """An overlay on base/ whose upper folder is kept between runs while its key stays the same."""

    def __init__(self, cache: Path, name: str, key: str) -> None:
        self.cache, self.name, self.key = cache, name, key
        self.folder = cache / "layers" / name
        self.root = cache / "mnt" / name
        self.stamp = self.folder / "layer.json"

    def prepare(self) -> bool:
        """True when the layer starts empty (new key, or never built)."""
        state = read_stamp(self.stamp)
        if state.get("key") == self.key and (self.folder / "upper").is_dir():
            return False
        remove_tree(self.folder)
        for sub in ("upper", "work"):
            (self.folder / sub).mkdir(parents=True)
        return True

    def done(self, **facts: object) -> None:
        self.stamp.write_text(json.dumps({**read_stamp(self.stamp), "key": self.key, **facts}))

    def facts(self) -> dict:
        return read_stamp(self.stamp)


class Chroot:
    """A layer mounted over base/ with /proc, a read-only /dev (a fresh /dev/shm), the emulated CPUs' sysfs and
    the assets read-only at /assets; everything unmounted again on exit, in reverse order."""

    def __init__(self, layer: Layer, *, assets: Path, cpu: str, logs: Path, extra_mounts: bool = True) -> None:
        self.layer, self.assets, self.cpu, self.logs = layer, assets, cpu, logs
        self.root = layer.root
        self.extra_mounts = extra_mounts
        self._mounted: list[Path] = []

    def _mount(self, args: list[str], point: Path) -> None:
        point.mkdir(parents=True, exist_ok=True)
        result = host_run(["mount", *args, str(point)])
        if result.returncode:
            raise SetupError(f"mount {' '.join(args)} {point} failed: {result.stderr.strip()}")
        self._mounted.append(point)

    def __enter__(self) -> Chroot:
        cache, folder = self.layer.cache, self.layer.folder
        try:
            self._mount(["-t", "overlay", "overlay", "-o", f"lowerdir={cache / 'base'},upperdir={folder / 'upper'},"
                         f"workdir={folder / 'work'}"], self.root)
            shutil.copyfile("/etc/resolv.conf", self.root / "etc/resolv.conf")  # the host's resolver, as on a board
            if self.extra_mounts:
                self.mount_runtime()
        except BaseException:
            self.__exit__()
            raise
        return self

    def mount_runtime(self) -> None:
        sysfs = self.layer.cache / "sys"
        write_cpu_sysfs(sysfs, self.cpu)
        self._mount(["-t", "proc", "proc"], self.root / "proc")
        self._mount(["--bind", "-o", "ro", "/dev"], self.root / "dev")
        self._mount(["-t", "tmpfs", "-o", "mode=1777,size=256m", "shm"], self.root / "dev/shm")
        self._mount(["--bind", "-o", "ro", str(sysfs)], self.root / "sys")
        self._mount(["--bind", "-o", "ro", str(self.assets)], self.root / "assets")

    def unmount_runtime(self) -> None:
        while len(self._mounted) > 1:
            self._umount(self._mounted.pop())

    def _umount(self, point: Path) -> None:
        for _ in range(10):
            if host_run(["umount", str(point)]).returncode == 0:
                return
            time.sleep(0.5)  # a process of the run still exiting
        print(f"[arm64] warning: {point} is busy; detaching it (umount -l)", flush=True)
        host_run(["umount", "-l", str(point)])

    def __exit__(self, *exc: object) -> None:
        while self._mounted:
            self._umount(self._mounted.pop())

    def env(self, **extra: str) -> dict[str, str]:
        return chroot_env(self.cpu, **extra)

    def run(self, name: str, *args: str, timeout: float = 900, env: dict[str, str] | None = None
            ) -> subprocess.CompletedProcess:
        """``args`` inside the image; stdout returned, stderr in logs/NAME.log (with stdout)."""
        log = self.logs / f"{name}.log"
        result = subprocess.run(["chroot", str(self.root), *args], capture_output=True, text=True,
                                timeout=timeout, env=env or self.env(), preexec_fn=_die_with_parent)
        with open(log, "a") as out:
            out.write(f"$ {' '.join(args)}\n[exit {result.returncode}]\n--- stdout\n{result.stdout}\n"
                      f"--- stderr\n{result.stderr}\n")
        return result

    def popen(self, name: str, *args: str) -> tuple[subprocess.Popen, Path]:
        log = self.logs / f"{name}.log"
        out = open(log, "ab")  # noqa: SIM115 - the child holds it; closed when the harness exits
        proc = subprocess.Popen(["chroot", str(self.root), *args], stdout=out, stderr=subprocess.STDOUT,
                                env=self.env(), preexec_fn=_die_with_parent)
        return proc, log

    def path(self, inside: str) -> Path:
        """The host path of a path inside the image."""
        return self.root / inside.lstrip("/")

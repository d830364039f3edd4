"""Agent updates for real: the launcher as a process (copied out of the package, as install-agent.sh does), a
notify socket standing in for systemd's, wheels of this tree built with their version bumped, and the first slot.

The slots' venvs are kept cheap: a venv without pip whose site-packages reach this test venv's packages through a
path file (``edgeinfer-test-deps.pth``: an agent update carries ``edgeinfer-*.pth`` files into the new slot, as it
does a device's system TensorRT), and edgeinfer itself from this checkout (slot a) or from the wheel the update
installs (slot b). A real device's slots hold every package themselves: the bundle carries their wheels.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import threading
import time
from pathlib import Path

from .assets import REPO

LAUNCHER = REPO / "edgeinfer" / "updates" / "launcher.py"
#: what the test slots' site-packages reach this venv's packages through (carried into a new slot by an update)
DEPS_PTH = "edgeinfer-test-deps.pth"


def copy_launcher(folder: Path) -> Path:
    """The launcher as install-agent.sh installs it: a file of its own, outside any slot."""
    folder.mkdir(parents=True, exist_ok=True)
    return Path(shutil.copyfile(LAUNCHER, folder / "launcher.py"))


def clean_env(**extra: str) -> dict[str, str]:
    """This environment without PYTHONPATH (a slot's agent must import its own edgeinfer) and pip's settings."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH" and not k.startswith("PIP_")}
    env.update(PYTHONUNBUFFERED="1", **extra)
    return env


def make_slot(path: Path, *, source: Path | None = REPO) -> Path:
    """A venv without pip (``python -m venv --without-pip`` of this interpreter's base) that reaches this venv's
    packages, and edgeinfer from ``source`` (None: none; the update installs it)."""
    base = getattr(sys, "_base_executable", None) or sys.executable
    subprocess.run([base, "-m", "venv", "--without-pip", str(path)], check=True, timeout=120)
    site = subprocess.run([str(path / "bin" / "python"), "-c",
                           "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          check=True, capture_output=True, text=True, env=clean_env()).stdout.strip()
    (Path(site) / DEPS_PTH).write_text(sysconfig.get_paths()["purelib"] + "\n")
    if source is not None:  # first on the path (path files are read in name order), and not carried to a new slot
        (Path(site) / "00-source.pth").write_text(f"{source}\n")
    return path


def source_copy(folder: Path) -> Path:
    """This checkout's package and build files, to build wheels from (edited first)."""
    target = folder / "src"
    shutil.copytree(REPO, target, ignore=shutil.ignore_patterns(
        ".git", ".venv", "*.egg-info", "build", "dist", "__pycache__", ".pytest_cache", ".ruff_cache", "tests",
        "docs", "bench", "examples", "shared"))
    return target


def bumped_version(steps: int) -> str:
    """This tree's version with its micro part raised by ``steps``."""
    from edgeinfer._version import __version__

    major, minor, micro = ([*__version__.split("."), "0", "0"])[:3]
    return f"{major}.{minor}.{int(micro) + steps}"


def build_wheel(source: Path, dist: Path, version: str, edits: dict[str, str] | None = None) -> Path:
    """A real wheel (pip wheel, no build isolation) of ``source`` as ``version``, with ``edits`` (path relative to
    the tree: new text) written first; the tree is put back afterwards."""
    version_file = source / "edgeinfer" / "_version.py"
    changes = {"edgeinfer/_version.py": f'"""The package version."""\n\n__version__ = "{version}"\n', **(edits or {})}
    saved = {name: (source / name).read_text() if (source / name).exists() else None for name in changes}
    try:
        for name, text in changes.items():
            (source / name).write_text(text)
        out = dist / version
        result = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                                 "-w", str(out), str(source)], capture_output=True, text=True, timeout=300,
                                env=clean_env())
        assert result.returncode == 0, result.stderr
        for stale in ("build", "edgeinfer.egg-info"):
            shutil.rmtree(source / stale, ignore_errors=True)
        (wheel,) = out.glob("edgeinfer-*.whl")
        return wheel
    finally:
        for name, text in saved.items():
            if text is None:
                (source / name).unlink(missing_ok=True)
            else:
                (source / name).write_text(text)
        assert version_file.exists()


class NotifySink:
    """A datagram socket standing in for systemd's NOTIFY_SOCKET: every message with the time it came."""

    def __init__(self, folder: Path) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        self.path = str(folder / "notify")
        self.messages: list[tuple[float, str]] = []
        self._socket = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self._socket.bind(self.path)
        self._socket.settimeout(0.2)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._read, name="notify-sink", daemon=True)
        self._thread.start()

    def _read(self) -> None:
        while not self._stop.is_set():
            try:
                data = self._socket.recv(4096)
            except TimeoutError:
                continue
            except OSError:
                return
            now = time.monotonic()
            self.messages += [(now, line) for line in data.decode().splitlines()]

    def lines(self, name: str) -> list[float]:
        """When ``name`` (e.g. READY=1) came."""
        return [at for at, line in list(self.messages) if line == name]

    def close(self) -> None:
        self._stop.set()
        self._thread.join(2)
        self._socket.close()


class LauncherProcess:
    """``python -I -S launcher.py --root ROOT --initial-slot SLOT [--trial-s S] -- ARGS`` as a real process."""

    def __init__(self, launcher: Path, root: Path, initial_slot: Path, args: list[str], log_path: Path, *,
                 trial_s: float = 120.0, trial_starts: int = 2, env: dict[str, str] | None = None) -> None:
        self.command = [sys.executable, "-I", "-S", str(launcher), "--root", str(root), "--initial-slot",
                        str(initial_slot), "--trial-s", str(trial_s), "--trial-starts", str(trial_starts), "--",
                        *args]
        self.log_path = log_path
        self.env = clean_env(**(env or {}))
        self.proc: subprocess.Popen | None = None

    def start(self) -> LauncherProcess:
        self._log = open(self.log_path, "ab")  # noqa: SIM115 - closed in wait()
        self.proc = subprocess.Popen(self.command, stdout=self._log, stderr=subprocess.STDOUT, env=self.env, cwd="/")
        return self

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def output(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait(self, timeout: float) -> int:
        assert self.proc is not None
        try:
            return self.proc.wait(timeout=timeout)
        finally:
            if not self._log.closed:
                self._log.close()

    def terminate(self, timeout: float = 30) -> int:
        if self.alive():
            self.proc.send_signal(signal.SIGTERM)
        return self.wait(timeout)

    def __enter__(self) -> LauncherProcess:
        return self if self.proc is not None else self.start()

    def __exit__(self, *exc: object) -> None:
        if self.alive():
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        if not self._log.closed:
            self._log.close()

"""Running edgeinfer as a user does (a subprocess of this interpreter) and waiting for things to happen."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time

from .assets import REPO


def edgeinfer_cmd(*args: str) -> list[str]:
    """The CLI as a user runs it, in a subprocess."""
    return [sys.executable, "-m", "edgeinfer", *args]


def wait_until(condition, timeout: float = 10.0, interval: float = 0.02) -> bool:
    """Poll ``condition`` until it is true or ``timeout`` s pass; its last value."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(interval)
    return bool(condition())


def env_with_repo(**extra: str) -> dict[str, str]:
    """This environment with the checkout first on PYTHONPATH, for a child interpreter's ``import edgeinfer``."""
    paths = [str(REPO), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(paths), **extra}


#: prepended to a child's code by run_without(): the named top-level packages cannot be imported
_BLOCKER = '''import sys
class _Absent:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {absent!r}:
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
sys.meta_path.insert(0, _Absent())
'''


def run_without(packages: set[str], code: str, timeout: float = 60) -> subprocess.CompletedProcess:
    """Run ``code`` in a child interpreter in which ``packages`` are not installed (as on a slim device)."""
    child = _BLOCKER.format(absent=set(packages)) + textwrap.dedent(code)
    return subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, timeout=timeout,
                          env=env_with_repo())

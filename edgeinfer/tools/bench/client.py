"""The parent's end of a benchmark worker process (:mod:`.worker` is the other end): JSON lines over pipes."""

from __future__ import annotations

import contextlib
import json
import select
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import IO, TYPE_CHECKING

from ...errors import BenchmarkError, ClosedError, EdgeInferError

if TYPE_CHECKING:
    from .targets import Target

#: worker start + model load may take this long before we call the worker hung
LOAD_TIMEOUT_S = 180.0
WORKER_MODULE = "edgeinfer.tools.bench.worker"


class Worker:
    """A benchmark worker subprocess speaking JSON lines. Idempotent close(); a context manager."""

    def __init__(self, *, env: dict[str, str] | None = None) -> None:
        self._stderr: IO[bytes] = tempfile.TemporaryFile()  # noqa: SIM115 - closed in close()
        #: wall-clock time of the spawn; the worker reports its first result in the same clock
        self.spawned_at = time.time()
        self._proc = subprocess.Popen(
            [sys.executable, "-m", WORKER_MODULE], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=self._stderr, env=env, text=True, bufsize=1,
        )
        self._closed = False

    def request(self, command: dict, timeout: float) -> dict:
        """Send one command, wait for its reply; BenchmarkError if the worker dies or hangs."""
        if self._closed:
            raise ClosedError("the benchmark worker is closed")
        proc = self._proc
        try:
            proc.stdin.write(json.dumps(command) + "\n")
            proc.stdin.flush()
        except (BrokenPipeError, OSError):
            raise BenchmarkError(f"benchmark worker died: {self.stderr_tail()}") from None
        ready, _, _ = select.select([proc.stdout], [], [], timeout)
        if not ready:
            self.close()
            raise BenchmarkError(f"benchmark worker did not answer {command['op']!r} within {timeout:.0f} s")
        line = proc.stdout.readline()
        if not line:
            proc.wait(timeout=5)
            raise BenchmarkError(f"benchmark worker exited ({proc.returncode}): {self.stderr_tail()}")
        return json.loads(line)

    def stderr_tail(self) -> str:
        """The last line the worker wrote to stderr (for error messages)."""
        with contextlib.suppress(OSError, ValueError):
            self._stderr.seek(0)
            lines = [ln.strip() for ln in self._stderr.read().decode("utf-8", "replace").splitlines() if ln.strip()]
            return lines[-1] if lines else "(no output)"
        return "(no output)"

    def close(self) -> None:
        """Ask the worker to quit; kill it if it does not. Idempotent."""
        if self._closed:
            return
        self._closed = True
        proc = self._proc
        with contextlib.suppress(OSError, ValueError):
            proc.stdin.write(json.dumps({"op": "quit"}) + "\n")
            proc.stdin.flush()
        with contextlib.suppress(OSError, ValueError):
            proc.stdin.close()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
        with contextlib.suppress(OSError, ValueError):
            proc.stdout.close()
        self._stderr.close()

    def __enter__(self) -> Worker:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def load_command(target: Target, threads: int, cache_dir: str | None, warmup_s: float) -> dict:
    """The ``load`` command for ``target`` (see :mod:`.worker` for the protocol)."""
    return {"op": "load", "model": target.model.path, "delegate": target.delegate, "threads": threads,
            "cache_dir": cache_dir, "warmup_s": warmup_s}


def raise_remote(reply: dict, target: Target) -> None:
    """Re-raise a worker's failure as the edgeinfer error of the same name (BenchmarkError otherwise)."""
    from ... import errors

    if reply.get("ok"):
        return
    message = f"{Path(target.model.path).name} on {target.delegate}: {reply.get('message', '')}"
    kind = getattr(errors, str(reply.get("error")), None)
    if isinstance(kind, type) and issubclass(kind, EdgeInferError):
        try:
            error = kind(message)
        except TypeError:  # an error class that takes structured arguments
            error = BenchmarkError(message)
        raise error
    raise BenchmarkError(message)


def cold_start(target: Target, threads: int, cache_dir: str | None) -> float:
    """Engine creation to first result in a fresh process (ms)."""
    with Worker() as worker:
        reply = worker.request(load_command(target, threads, cache_dir, 0.0), LOAD_TIMEOUT_S)
        raise_remote(reply, target)
        return float(reply["cold_ms"])

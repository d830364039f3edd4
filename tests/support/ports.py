"""Free TCP ports for the servers the tests start, never handed out twice by parallel workers (pytest-xdist).

``bind(("127.0.0.1", 0))`` then close leaves a window, until the server binds the port, in which another process's
``bind(0)`` may be given it too. With one test process that never happens; with several workers it does. So under
xdist each worker takes ports from its own slice below the kernel's ephemeral range (32768 and up on Linux), where
neither the kernel nor another worker hands them out, each checked free by binding it.
"""

from __future__ import annotations

import os
import random
import socket

__all__ = ["free_port"]

#: the ports the workers share out, below the kernel's ephemeral range
FIRST, LAST = 20000, 32000

_cursor: int | None = None


def _kernel_port(host: str) -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def _worker_slice() -> tuple[int, int] | None:
    """This worker's ports [low, high), or None outside xdist."""
    worker, count = os.environ.get("PYTEST_XDIST_WORKER", ""), os.environ.get("PYTEST_XDIST_WORKER_COUNT", "")
    if not worker[2:].isdigit() or not count.isdigit():
        return None
    size = (LAST - FIRST) // max(int(count), 1)
    low = FIRST + int(worker[2:]) * size
    return low, low + size


def _bindable(host: str, port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def free_port(host: str = "127.0.0.1") -> int:
    """A port nothing listens on now and no other worker of this run will be given."""
    global _cursor
    found = _worker_slice()
    if found is None:
        return _kernel_port(host)
    low, high = found
    if _cursor is None:  # a random start: two runs side by side rarely walk the same ports
        _cursor = random.randrange(low, high)
    for _ in range(high - low):
        port, _cursor = _cursor, low + (_cursor + 1 - low) % (high - low)
        if _bindable(host, port):
            return port
    raise RuntimeError(f"no free port in {low}-{high}")

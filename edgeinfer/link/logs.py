"""The form of a device's log lines and doctor report as they travel to the fleet manager.

The agent keeps a bounded ring of its recent log lines (``agent/log_ring.py``) and sends them only when the
fleet asks (the signed ``logs`` command): each line is ``{seq, ts, level, logger, message}``, ``seq`` counting
up within one agent start (``boot_id``). The redaction (``edgeinfer/_redact.py``) runs on every line before it
enters the ring, and the manager runs it again on what it receives (one function, both ends: a secret that
reached the ring of an older agent still never reaches the database or an API answer). The bounds here are the
device's and the manager's alike: the manager's upload models take them, the agent cuts its batches by them.
"""

from __future__ import annotations

from collections.abc import Mapping

#: the levels a line may have, by name (what the wire, the API and ``--level`` say), with logging's numbers
LEVELS: Mapping[str, int] = {"debug": 10, "info": 20, "warning": 30, "error": 40, "critical": 50}
#: a line's message is cut to this many characters (a traceback included)
MAX_MESSAGE = 4000
MAX_LOGGER = 128
#: lines in one upload, and the bytes of its JSON body
MAX_UPLOAD_LINES = 1000
MAX_UPLOAD_BYTES = 256 * 1024
#: a doctor report's JSON body, at most
MAX_REPORT_BYTES = 256 * 1024


def level_name(levelno: int) -> str:
    """The name of the highest level at or below ``levelno`` (a custom level 25 is ``info``)."""
    name = "debug"
    for candidate, number in LEVELS.items():
        if levelno >= number:
            name = candidate
    return name

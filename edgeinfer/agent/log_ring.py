"""The agent's recent log lines, kept in memory for the fleet to ask for (the ``logs`` command, agent/diagnosis.py).

:class:`LogRing` is a :class:`logging.Handler` on the root logger: each record at ``info`` or above becomes one
line — its wall time, level, logger and message (with its traceback) — redacted (:func:`~.._redact.redact`)
before it enters the ring, so a secret never sits in memory waiting to be sent. The ring is bounded by lines and
by bytes; the oldest lines go first (counted in :attr:`LogRing.evicted`). Lines are numbered from 1 within one
agent start, so a reader asks for the lines after the last one it has. Nothing is written to disk and nothing
is sent unless the fleet asks.
"""

from __future__ import annotations

import itertools
import logging
import threading
from collections import deque
from typing import Any

from .._redact import redact
from ..link.logs import MAX_LOGGER, MAX_MESSAGE, level_name

#: the ring's bounds: the newest lines, and the bytes of their text
MAX_LINES = 2000
MAX_BYTES = 256 * 1024
#: what one line costs besides its text (the figure the byte bound counts)
LINE_OVERHEAD = 64
#: a message is cut to this before it is redacted (and to MAX_MESSAGE after: a secret cut in two is never kept)
_PRE_CUT = 16 * MAX_MESSAGE
_FORMATTER = logging.Formatter()

Line = tuple[int, float, str, str, str]  # seq, ts, level, logger, message


class LogRing(logging.Handler):
    """The newest log lines (at ``level`` or above), bounded by ``max_lines`` and ``max_bytes``."""

    def __init__(self, *, max_lines: int = MAX_LINES, max_bytes: int = MAX_BYTES, level: int = logging.INFO) -> None:
        super().__init__(level)
        self.max_lines, self.max_bytes = max_lines, max_bytes
        self._lines: deque[Line] = deque()
        self._bytes = 0
        self._seq = 0
        #: lines pushed out by the bounds since the agent started
        self.evicted = 0
        self._changed = threading.Condition()
        self._restore: list[tuple[logging.Logger | logging.Handler, int]] | None = None

    # -- logging ------------------------------------------------------------------------------------
    def emit(self, record: logging.LogRecord) -> None:
        try:
            message = record.getMessage()
            if record.exc_info:
                message = f"{message}\n{_FORMATTER.formatException(record.exc_info)}"
            elif record.exc_text:
                message = f"{message}\n{record.exc_text}"
            message = redact(message[:_PRE_CUT])[:MAX_MESSAGE]
            logger = record.name[:MAX_LOGGER]
            level = level_name(record.levelno)
        except Exception:  # a record that cannot be formatted: logging's own report, never a raise
            self.handleError(record)
            return
        size = len(message) + len(logger) + LINE_OVERHEAD
        with self._changed:
            self._seq += 1
            self._lines.append((self._seq, round(record.created, 3), level, logger, message))
            self._bytes += size
            while len(self._lines) > self.max_lines or (self._bytes > self.max_bytes and len(self._lines) > 1):
                _seq, _ts, _level, old_logger, old_message = self._lines.popleft()
                self._bytes -= len(old_message) + len(old_logger) + LINE_OVERHEAD
                self.evicted += 1
            self._changed.notify_all()

    def install(self, logger: logging.Logger | None = None) -> LogRing:
        """Add the ring to ``logger`` (the root logger). When that logger's level would drop the ring's lines, it
        is lowered to the ring's level, and its handlers keep their old threshold (stderr shows what it showed)."""
        target = logger or logging.getLogger()
        self._restore = [(target, target.level)]
        if target.getEffectiveLevel() > self.level:
            threshold = target.getEffectiveLevel()
            for handler in target.handlers:
                if handler.level < threshold:
                    self._restore.append((handler, handler.level))
                    handler.setLevel(threshold)
            target.setLevel(self.level)
        target.addHandler(self)
        return self

    def uninstall(self, logger: logging.Logger | None = None) -> None:
        """Take the ring off ``logger`` and put the levels back as they were."""
        target = logger or logging.getLogger()
        target.removeHandler(self)
        for owner, level in self._restore or ():
            owner.setLevel(level)
        self._restore = None

    # -- reading ------------------------------------------------------------------------------------
    @property
    def newest_seq(self) -> int:
        """The seq of the newest line (0 before any)."""
        with self._changed:
            return self._seq

    def __len__(self) -> int:
        with self._changed:
            return len(self._lines)

    def after(self, seq: int, *, max_lines: int, max_bytes: int) -> tuple[list[dict[str, Any]], bool]:
        """The lines after ``seq``, oldest first, at most ``max_lines`` and about ``max_bytes`` of text (one line
        at least); and whether more lines follow them."""
        with self._changed:
            if not self._lines:
                return [], False
            start = max(0, seq + 1 - self._lines[0][0])
            lines: list[dict[str, Any]] = []
            size = 0
            for line in itertools.islice(self._lines, start, None):
                cost = len(line[4]) + len(line[3]) + LINE_OVERHEAD
                if lines and (len(lines) >= max_lines or size + cost > max_bytes):
                    return lines, True
                lines.append({"seq": line[0], "ts": line[1], "level": line[2], "logger": line[3], "message": line[4]})
                size += cost
            return lines, False

    def wait_newer(self, seq: int, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for a line after ``seq``; whether there is one."""
        with self._changed:
            return self._changed.wait_for(lambda: self._seq > seq, timeout)

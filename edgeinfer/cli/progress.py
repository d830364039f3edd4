"""Progress lines on stderr for long CLI steps (stdout stays clean for tables and ``--json``)."""

from __future__ import annotations

import sys
import time
from typing import TextIO


class StderrProgress:
    """A callable that prints ``edgeinfer: <message>`` lines to stderr, throttling repeated steps.

    Messages that start with the same word as the previous one ("calibrating: image 3/500") are
    printed at most every ``interval`` seconds, except the last of a series (``n/n``). On a
    terminal a series overwrites itself in place; in a log file every printed line stays.
    """

    def __init__(self, stream: TextIO | None = None, *, interval: float = 0.5, enabled: bool = True) -> None:
        self.stream = stream if stream is not None else sys.stderr
        self.interval = interval
        self.enabled = enabled
        self._last_step = ""
        self._last_time = 0.0
        self._inline = False
        self._tty = bool(getattr(self.stream, "isatty", lambda: False)())

    def __call__(self, message: str) -> None:
        if not self.enabled:
            return
        step = message.split(":", 1)[0]
        now = time.monotonic()
        final = _is_final(message)
        if step == self._last_step and not final and now - self._last_time < self.interval:
            return
        same_series = step == self._last_step and self._inline
        self._last_step, self._last_time = step, now
        if self._tty:
            prefix = "\r\x1b[2K" if same_series else ("\n" if self._inline else "")
            self.stream.write(f"{prefix}edgeinfer: {message}")
            self._inline = True
        else:
            self.stream.write(f"edgeinfer: {message}\n")
        self.stream.flush()

    def done(self) -> None:
        """End an in-place line so the next output starts on a fresh line."""
        if self._inline and self._tty:
            self.stream.write("\n")
            self.stream.flush()
        self._inline = False


def _is_final(message: str) -> bool:
    """True for ``.../n`` messages where the count has reached the total."""
    for word in message.replace("(", " ").split():
        if "/" in word:
            done, _, total = word.partition("/")
            if done.isdigit() and total.isdigit():
                return done == total
    return False

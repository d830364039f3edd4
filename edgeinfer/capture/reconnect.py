"""Bringing a dropped live source back, whatever reads it (OpenCV, PyAV, picamera2).

The source says how to let go of its device, how to open it again and how to fetch from it; this
loop owns the schedule (:class:`~edgeinfer.util.backoff.Backoff`), the give-up deadline, interruption
and the ``reconnects`` count, so every live source drops and comes back the same way.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TypeVar

from ..errors import CaptureError
from ..util.backoff import Backoff
from .base import FrameSource

log = logging.getLogger(__name__)

#: the reconnect schedule of live sources unless one is given
DEFAULT_BACKOFF = Backoff()

Fetched = TypeVar("Fetched")


def reconnect(
    source: FrameSource,
    backoff: Backoff,
    *,
    release: Callable[[], None],
    reopen: Callable[[], None],
    fetch: Callable[[], Fetched | None],
) -> Fetched | None:
    """Release, wait out the next delay, ``reopen()`` (CaptureError: try again), until ``fetch()`` gives
    something, which is returned. None when ``source`` is interrupted meanwhile; CaptureError after
    ``backoff.give_up_s``."""
    started = time.monotonic()
    give_up = backoff.give_up_s
    last_error = "it stopped delivering frames"
    log.warning("%s dropped; reconnecting", source.description)
    for delay in backoff.delays():
        release()
        if give_up is not None:
            left = give_up - (time.monotonic() - started)
            if left <= 0:
                break
            delay = min(delay, left)
        if not source.sleep_unless_interrupted(delay):
            return None
        try:
            reopen()
        except CaptureError as exc:
            last_error = str(exc)
            log.debug("reconnect to %s failed: %s", source.description, exc)
            continue
        fetched = fetch()
        if fetched is not None:
            source.reconnects += 1
            log.warning("%s reconnected after %.1f s", source.description, time.monotonic() - started)
            return fetched
        last_error = "it opened but delivered no frame"
    if source.interrupted:
        return None
    raise CaptureError(
        f"{source.description} dropped and did not come back within {give_up:g} s ({last_error}) — "
        "check the cable / network and that the device is powered"
    )

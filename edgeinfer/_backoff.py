"""One retry schedule for everything that reconnects or restarts: exponential, capped, jittered.

Used by live capture sources (reconnecting a camera or a stream), the MQTT link (reconnecting to
the broker), the agent (restarting a failed pipeline) and downloads. The jitter only ever
*shortens* a delay, so ``max_s`` is a true cap; ``jitter=0.5`` is "equal jitter" (half fixed, half
random), which keeps a fleet that lost its broker at the same instant from coming back in lockstep.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass

#: exponent cap: past it the delay is max_s anyway, and factor ** n must not overflow
_MAX_EXPONENT = 64


@dataclass(frozen=True, kw_only=True)
class Backoff:
    """Delays that grow ``factor``-fold from ``initial_s`` to ``max_s``, each shortened by up to ``jitter``."""

    initial_s: float = 0.25
    max_s: float = 5.0
    factor: float = 2.0
    #: each delay is multiplied by a random factor in (1 - jitter, 1]
    jitter: float = 0.2
    #: give up after this long without success; None keeps trying for ever (used by capture sources)
    give_up_s: float | None = None

    def __post_init__(self) -> None:
        if self.initial_s <= 0 or self.max_s < self.initial_s or self.factor < 1.0 or not 0 <= self.jitter < 1:
            raise ValueError(f"invalid backoff {self!r}: need 0 < initial_s <= max_s, factor >= 1, 0 <= jitter < 1")
        if self.give_up_s is not None and self.give_up_s < 0:
            raise ValueError("backoff give_up_s must be >= 0 or None")

    def delay(self, attempt: int, rng: random.Random | None = None) -> float:
        """The delay before retry ``attempt`` (1-based)."""
        exponent = min(max(0, attempt - 1), _MAX_EXPONENT)
        base = min(self.max_s, self.initial_s * self.factor ** exponent)
        return base * (1.0 - self.jitter * (rng or random).random())

    def delays(self, rng: random.Random | None = None) -> Iterator[float]:
        """The successive delays (endless)."""
        attempt = 1
        while True:
            yield self.delay(attempt, rng)
            attempt += 1


#: equal jitter (half fixed, half random): for peers of one server, which must not retry in lockstep
EQUAL_JITTER = 0.5

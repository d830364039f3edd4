"""One retry schedule for everything that reconnects or restarts: exponential, capped, jittered.

Used by live capture sources (reconnecting a camera or a stream), the MQTT link (reconnecting to
the broker), the agent (restarting a failed pipeline) and downloads. The jitter only ever
*shortens* a delay, so ``max_s`` is a true cap; ``jitter=0.5`` is "equal jitter" (half fixed, half
random), which keeps a fleet that lost its broker at the same instant from coming back in lockstep.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass, field, fields

#: exponent cap: past it the delay is max_s anyway, and factor ** n must not overflow
_MAX_EXPONENT = 64


@dataclass(frozen=True, kw_only=True)
class Backoff:
    """Delays that grow ``factor``-fold from ``initial_s`` to ``max_s``, each shortened by up to ``jitter``."""

    # the bounds are the fields' metadata, under their JSON Schema names (the agent's configuration schema copies them)
    initial_s: float = field(default=0.25, metadata={"exclusiveMinimum": 0})
    max_s: float = field(default=5.0, metadata={"exclusiveMinimum": 0})
    factor: float = field(default=2.0, metadata={"minimum": 1})
    #: each delay is multiplied by a random factor in (1 - jitter, 1]
    jitter: float = field(default=0.2, metadata={"minimum": 0, "exclusiveMaximum": 1})
    #: give up after this long without success; None keeps trying for ever (used by capture sources)
    give_up_s: float | None = field(default=None, metadata={"minimum": 0})

    def __post_init__(self) -> None:
        within = {"minimum": float.__ge__, "exclusiveMinimum": float.__gt__, "exclusiveMaximum": float.__lt__}
        for option in fields(self):
            value = getattr(self, option.name)
            if value is not None and not all(test(float(value), float(bound)) for word, test in within.items()
                                             if (bound := option.metadata.get(word)) is not None):
                raise ValueError(f"invalid backoff {self!r}: need 0 < initial_s <= max_s, factor >= 1, "
                                 f"0 <= jitter < 1, give_up_s >= 0 or None")
        if self.max_s < self.initial_s:
            raise ValueError(f"invalid backoff {self!r}: need 0 < initial_s <= max_s, factor >= 1, 0 <= jitter < 1")

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

"""The choices a generator of test inputs makes, from one of two sources: Hypothesis, or a seeded ``random.Random``.

A generator written against :class:`Choices` (``c.integer(0, 9)``, ``c.pick(options)``, ``c.text(12)``...) is one
definition with two uses: ``Drawn(draw)`` inside ``@st.composite`` makes it a Hypothesis strategy (Hypothesis's
edge-seeking draws, shrinking); ``Seeded(random.Random(seed))`` expands a seed into inputs at a fraction of the cost
(no per-choice bookkeeping), each one rebuilt from its seed. ``support.hostile``'s families are written this way:
the in-process ingest fuzz (100,000 payloads) expands Hypothesis-drawn seeds, the broker fuzz draws through
Hypothesis (tests/fleet/test_ingest_fuzz.py).
"""

from __future__ import annotations

import random
import sys
from collections.abc import Callable, Sequence
from functools import cache
from typing import Any, TypeVar

from hypothesis import strategies as st

T = TypeVar("T")


class Choices:
    """What a generator may ask for (the bounds of each draw are the caller's)."""

    def integer(self, low: int | None = None, high: int | None = None) -> int:
        raise NotImplementedError

    def floating(self, low: float | None = None, high: float | None = None) -> float:
        """A finite float within the bounds."""
        raise NotImplementedError

    def boolean(self) -> bool:
        return self.integer(0, 1) == 1

    def pick(self, options: Sequence[T]) -> T:
        """One of ``options`` (Hypothesis shrinks towards the first)."""
        return options[self.integer(0, len(options) - 1)]

    def binary(self, low: int, high: int) -> bytes:
        raise NotImplementedError

    def text(self, high: int, low: int = 0, alphabet: str | None = None) -> str:
        """A string of ``low`` to ``high`` characters (any code point but a surrogate, or from ``alphabet``)."""
        raise NotImplementedError


# ------------------------------------------------------------------------------------------------- Hypothesis
# strategies are built once per set of bounds: a strategy built per draw costs Hypothesis more than the draw does

@cache
def _integers(low: int | None, high: int | None) -> st.SearchStrategy[int]:
    return st.integers(low, high)


@cache
def _floats(low: float | None, high: float | None) -> st.SearchStrategy[float]:
    return st.floats(low, high, allow_nan=False, allow_infinity=False)


@cache
def _binary(low: int, high: int) -> st.SearchStrategy[bytes]:
    return st.binary(min_size=low, max_size=high)


@cache
def _text(high: int, low: int, alphabet: str | None) -> st.SearchStrategy[str]:
    return st.text(alphabet=alphabet, min_size=low, max_size=high) if alphabet else st.text(min_size=low,
                                                                                           max_size=high)


class Drawn(Choices):
    """Choices drawn by Hypothesis (``draw`` of an ``@st.composite``)."""

    def __init__(self, draw: Callable[[st.SearchStrategy[Any]], Any]) -> None:
        self.draw = draw

    def integer(self, low: int | None = None, high: int | None = None) -> int:
        return self.draw(_integers(low, high))

    def floating(self, low: float | None = None, high: float | None = None) -> float:
        return self.draw(_floats(low, high))

    def binary(self, low: int, high: int) -> bytes:
        return self.draw(_binary(low, high))

    def text(self, high: int, low: int = 0, alphabet: str | None = None) -> str:
        return self.draw(_text(high, low, alphabet))


# ------------------------------------------------------------------------------------------------ a seed
#: characters a seeded string is made of: Hypothesis's favourites (ASCII, controls, the first code points of each
#: plane) and any code point but a surrogate (as st.text)
_ASCII = "".join(map(chr, range(128)))
_SPECIAL = "\u0000\u0085\u00a0\u00e9\u00ff\u0100\u200b\u202e\u2028\ufeff\ufffd\uffff\U00010000\U0001f600\U0010ffff"
_WIDE_INTS = (1, 2**7, 2**8, 2**15, 2**16, 2**31, 2**32, 2**53, 2**63, 2**64, 2**70, 2**100)
_FLOAT_EDGES = (0.0, -0.0, 0.5, -1.0, 1.0, 1e-300, 5e-324, 1e308, -1e308, sys.float_info.max, 2.0**53, 1e15 + 0.5)


class Seeded(Choices):
    """Choices made by a seeded ``random.Random``: the same seed, the same inputs; edges as likely as Hypothesis
    makes them (a quarter of the numbers), the rest spread over the range."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng

    def integer(self, low: int | None = None, high: int | None = None) -> int:
        rng = self.rng
        if low is not None and high is not None:
            roll = rng.random()
            if roll < 0.125:
                return low if roll < 0.0625 else high
            return rng.randint(low, high)
        offset = rng.choice((0, 1, rng.randint(0, 255), rng.randrange(rng.choice(_WIDE_INTS))))
        if low is not None:
            return low + offset
        if high is not None:
            return high - offset
        return offset if rng.random() < 0.5 else -offset

    def floating(self, low: float | None = None, high: float | None = None) -> float:
        rng = self.rng
        for _ in range(100):
            value = rng.choice(_FLOAT_EDGES) if rng.random() < 0.25 else \
                rng.choice((-1.0, 1.0)) * 10.0 ** rng.uniform(-12, 308)
            if low is not None and high is None:
                value = low + abs(value)
            elif high is not None and low is None:
                value = high - abs(value)
            elif low is not None and high is not None:
                value = rng.uniform(low, high)
            if abs(value) <= sys.float_info.max and (low is None or value >= low) and (high is None or value <= high):
                return value
        return low if low is not None else high if high is not None else 0.0

    def binary(self, low: int, high: int) -> bytes:
        return self.rng.randbytes(self.integer(low, high))

    def text(self, high: int, low: int = 0, alphabet: str | None = None) -> str:
        rng = self.rng
        size = self.integer(low, high)
        if alphabet:
            return "".join(rng.choices(alphabet, k=size))
        return "".join(self._character() for _ in range(size))

    def _character(self) -> str:
        rng = self.rng
        roll = rng.random()
        if roll < 0.6:
            return rng.choice(_ASCII)
        if roll < 0.75:
            return rng.choice(_SPECIAL)
        code = rng.randrange(0xD800) if roll < 0.9 else rng.randrange(0xE000, 0x110000)  # never a surrogate
        return chr(code)

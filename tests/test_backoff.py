"""edgeinfer.util.backoff: one retry schedule, capped, jittered only downwards."""

from __future__ import annotations

import random

import pytest

from edgeinfer.util.backoff import EQUAL_JITTER, Backoff


def test_delays_grow_to_the_cap_and_jitter_only_shortens():
    backoff = Backoff(initial_s=0.5, max_s=30, jitter=0.2)
    rng = random.Random(7)
    for attempt, base in ((1, 0.5), (2, 1.0), (3, 2.0), (7, 30.0), (10_000, 30.0)):
        values = [backoff.delay(attempt, rng) for _ in range(200)]
        assert base * 0.8 <= min(values) and max(values) <= base


def test_equal_jitter_spreads_a_fleet_over_half_the_delay():
    backoff = Backoff(initial_s=1, max_s=8, jitter=EQUAL_JITTER)
    values = [backoff.delay(4, random.Random(seed)) for seed in range(300)]
    assert min(values) >= 4 and max(values) <= 8 and max(values) - min(values) > 2


def test_no_jitter_is_exact_and_delays_is_the_same_schedule():
    backoff = Backoff(initial_s=0.25, max_s=1.0, jitter=0)
    delays = backoff.delays()
    assert [next(delays) for _ in range(5)] == [0.25, 0.5, 1.0, 1.0, 1.0]


@pytest.mark.parametrize("bad", [{"initial_s": 0}, {"initial_s": 2, "max_s": 1}, {"factor": 0.5}, {"jitter": 1.0},
                                 {"give_up_s": -1}])
def test_invalid_schedules_are_refused(bad):
    with pytest.raises(ValueError):
        Backoff(**bad)

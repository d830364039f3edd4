"""util/group_commit.py: work handed in on many threads is done a batch at a time, in order, by one of the callers."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from edgeinfer.util.group_commit import GroupCommit


def test_callers_arriving_while_a_batch_is_done_are_done_together_in_order_and_bounded():
    batches: list[list[int]] = []
    first_running, release = threading.Event(), threading.Event()

    def process(items):
        batches.append(list(items))
        if items[0] == 0:  # the first batch holds the lead until the others queued up
            first_running.set()
            assert release.wait(10)
        for item in items:
            done[item] = threading.current_thread().name

    done: dict[int, str] = {}
    commit = GroupCommit(process, max_batch=4)
    with ThreadPoolExecutor(11) as pool:
        first = pool.submit(commit.run, 0)
        assert first_running.wait(10)
        rest = []
        for i in range(1, 11):
            rest.append(pool.submit(commit.run, i))
            deadline = time.monotonic() + 10
            while len(commit._queue) < i and time.monotonic() < deadline:  # queued before the next one is handed in
                time.sleep(0.001)
        release.set()
        for future in (first, *rest):
            future.result(10)
    assert batches == [[0], [1, 2, 3, 4], [5, 6, 7, 8], [9, 10]]
    assert (commit.batches, commit.items) == (4, 11) and sorted(done) == list(range(11))


def test_an_error_reaches_every_caller_of_its_batch_and_the_next_batch_still_runs():
    def process(items):
        if "bad" in items:
            raise RuntimeError("the database went away")

    commit = GroupCommit(process)
    with pytest.raises(RuntimeError, match="went away"):
        commit.run("bad")
    commit.run("good")  # the lead was handed back: nothing is stuck
    with pytest.raises(ValueError):
        GroupCommit(process, max_batch=0)

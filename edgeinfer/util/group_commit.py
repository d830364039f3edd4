"""Group commit: work handed in on many threads, done a batch at a time by one of them.

A caller that arrives while nobody leads becomes the leader: it takes the queue's first ``max_batch`` items (its own
first) and processes them together — one database transaction for many requests, where each alone would pay its own
round trips and commit. Callers that arrive meanwhile queue up and wait; when the batch is done the leader hands the
lead to the first of them, who takes the next batch. No thread of its own and no timer: under light load a batch is
one item, done at once; under heavy load the batches grow with the queue, by themselves. (PostgreSQL's commit_delay
and many a message broker's write path group their work the same way.)
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Generic, TypeVar

T = TypeVar("T")


@dataclass(eq=False)
class _Ticket(Generic[T]):
    item: T
    woken: threading.Event = field(default_factory=threading.Event)
    lead: bool = False
    error: BaseException | None = None


class GroupCommit(Generic[T]):
    """``run(item)`` returns once ``process`` has handled a batch holding ``item``; ``process(items)`` records each
    item's outcome on the item. An exception ``process`` raises is raised in every caller of that batch."""

    def __init__(self, process: Callable[[Sequence[T]], None], *, max_batch: int = 64) -> None:
        if max_batch < 1:
            raise ValueError(f"max_batch must be at least 1, not {max_batch}")
        self._process = process
        self.max_batch = max_batch
        self._lock = threading.Lock()
        self._queue: deque[_Ticket[T]] = deque()
        self._leading = False
        #: how many batches and items were processed (a batch's mean size: items / batches)
        self.batches = 0
        self.items = 0

    def run(self, item: T) -> None:
        ticket = _Ticket(item)
        with self._lock:
            self._queue.append(ticket)
            ticket.lead = not self._leading
            self._leading = True
        if not ticket.lead:
            ticket.woken.wait()  # done by a leader, or told to lead the next batch
        if ticket.lead:
            self._lead()
        if ticket.error is not None:
            raise ticket.error

    def _lead(self) -> None:
        with self._lock:  # the leader's ticket is the queue's first: the batch holds it
            batch = [self._queue.popleft() for _ in range(min(self.max_batch, len(self._queue)))]
        try:
            self._process([ticket.item for ticket in batch])
        except BaseException as exc:  # every caller of the batch hears it
            for ticket in batch:
                ticket.error = exc
        finally:
            with self._lock:
                self.batches += 1
                self.items += len(batch)
                successor = self._queue[0] if self._queue else None
                if successor is None:
                    self._leading = False
                else:
                    successor.lead = True
            for ticket in batch:
                ticket.woken.set()
            if successor is not None:
                successor.woken.set()

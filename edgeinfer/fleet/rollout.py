"""Rolling a signed model out in waves: canary first, stop when too many finished devices fail.

Pure logic with the I/O injected (``notify`` sends one device its command; progress arrives via
:meth:`Rollout.on_progress` from the device's events), so the same code runs in the fleet manager
and in tests against a real broker.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

#: device states, in the order a healthy update passes through them
PROGRESS_STATES = ("pending", "notified", "downloading", "validating", "active")
FAILED_STATES = ("failed", "rolled_back", "rejected", "timeout")
FINISHED_STATES = ("active", *FAILED_STATES)
ALL_STATES = (*PROGRESS_STATES, *FAILED_STATES)


def plan_waves(devices: list[str], *, canary_pct: float = 10.0, wave_size: int | None = None) -> list[list[str]]:
    """Split ``devices`` into a canary wave (``canary_pct`` %, at least one) and waves of ``wave_size``."""
    if not devices:
        return []
    if not 0 <= canary_pct <= 100:
        raise ValueError(f"canary percentage must be within 0-100, not {canary_pct}")
    if wave_size is not None and wave_size < 1:
        raise ValueError(f"wave size must be at least 1, not {wave_size}")
    ordered = sorted(devices)
    canary = min(len(ordered), max(1, math.ceil(len(ordered) * canary_pct / 100))) if canary_pct > 0 else 0
    waves = [ordered[:canary]] if canary else []
    rest = ordered[canary:]
    size = wave_size or len(rest) or 1
    waves += [rest[i:i + size] for i in range(0, len(rest), size)]
    return waves


@dataclass
class RolloutResult:
    status: str  # succeeded | aborted | failed
    states: dict[str, str]
    details: dict[str, str] = field(default_factory=dict)
    notified_waves: int = 0

    @property
    def all_active(self) -> bool:
        return all(state == "active" for state in self.states.values())


class Rollout:
    """Drives one deployment through its waves."""

    def __init__(self, waves: list[list[str]], notify: Callable[[str], None], *,
                 abort_failure_rate: float = 0.0, device_timeout_s: float = 300.0,
                 on_change: Callable[[str, str, str | None], None] | None = None) -> None:
        self.waves = waves
        self._notify = notify
        self.abort_failure_rate = abort_failure_rate / 100 if abort_failure_rate > 1 else abort_failure_rate
        self.device_timeout_s = device_timeout_s
        self._on_change = on_change
        self.states = {device: "pending" for wave in waves for device in wave}
        self.details: dict[str, str] = {}
        self._notified_at: dict[str, float] = {}
        self._cond = threading.Condition()
        self._cancelled = False

    # -- progress from devices -----------------------------------------------------------------
    def on_progress(self, device: str, state: str, detail: str | None = None) -> None:
        """A device reported ``state``; states never go backwards and finished states are final."""
        if state not in ALL_STATES:
            return
        with self._cond:
            current = self.states.get(device)
            if current is None or current in FINISHED_STATES or current == "pending":
                return
            if state in PROGRESS_STATES and PROGRESS_STATES.index(state) <= PROGRESS_STATES.index(current):
                return
            self.states[device] = state
            if detail:
                self.details[device] = detail
            self._cond.notify_all()
        if self._on_change:
            self._on_change(device, state, detail)

    def cancel(self) -> None:
        with self._cond:
            self._cancelled = True
            self._cond.notify_all()

    def failure_rate(self) -> float:
        finished = [s for s in self.states.values() if s in FINISHED_STATES]
        failed = [s for s in finished if s in FAILED_STATES]
        return len(failed) / len(finished) if finished else 0.0

    # -- driving -------------------------------------------------------------------------------
    def run(self) -> RolloutResult:
        """Notify wave after wave; stop when a wave's failures pass the threshold."""
        notified_waves = 0
        for wave in self.waves:
            for device in wave:
                self._set(device, "notified")
                self._notified_at[device] = time.monotonic()
                self._notify(device)
            notified_waves += 1
            self._wait_for(wave)
            if self._cancelled:
                return RolloutResult("aborted", dict(self.states), dict(self.details), notified_waves)
            if self.failure_rate() > self.abort_failure_rate:
                return RolloutResult("aborted", dict(self.states), dict(self.details), notified_waves)
        status = "succeeded" if all(s == "active" for s in self.states.values()) else "failed"
        return RolloutResult(status, dict(self.states), dict(self.details), notified_waves)

    def _set(self, device: str, state: str, detail: str | None = None) -> None:
        with self._cond:
            self.states[device] = state
            if detail:
                self.details[device] = detail
        if self._on_change:
            self._on_change(device, state, detail)

    def _wait_for(self, wave: list[str]) -> None:
        with self._cond:
            while not self._cancelled:
                open_devices = [d for d in wave if self.states[d] not in FINISHED_STATES]
                if not open_devices:
                    return
                now = time.monotonic()
                overdue = [d for d in open_devices if now - self._notified_at[d] > self.device_timeout_s]
                for device in overdue:
                    self.states[device] = "timeout"
                    self.details[device] = f"no result within {self.device_timeout_s:.0f} s"
                if overdue:
                    if self._on_change:
                        for device in overdue:
                            self._on_change(device, "timeout", self.details[device])
                    continue
                self._cond.wait(timeout=0.5)

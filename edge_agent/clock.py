"""Clocks as a seam: the monotonic clock in the daemon, a manual one in lock-step tests."""

from __future__ import annotations

import time
from typing import Protocol


class Clock(Protocol):
    """Monotonic seconds; the only notion of time the pure control code sees."""

    def now(self) -> float: ...


class MonotonicClock:
    """The real clock: `time.monotonic()`."""

    def now(self) -> float:
        return time.monotonic()


class ManualClock:
    """A clock that moves only when told to (lock-step runner, unit tests)."""

    def __init__(self, start: float = 0.0) -> None:
        self._t = start

    def now(self) -> float:
        return self._t

    def advance(self, dt: float) -> float:
        if dt < 0:
            raise ValueError(f"cannot move a clock backwards (dt={dt})")
        self._t += dt
        return self._t

    def set(self, t: float) -> None:
        if t < self._t:
            raise ValueError(f"cannot move a clock backwards ({t} < {self._t})")
        self._t = t

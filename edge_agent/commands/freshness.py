"""Stale commands: nothing sent before the latest stop moves the robot after it (DESIGN.md).

A stop's reset only *permits* motion (REQUIREMENTS.md 2): a motion command that was sent before
the latest stop or reset — waiting in the MQTT inbox, behind another command, in a broker or a
store-and-forward bridge — is refused `stale` instead of running after the reset. Two rules, both
applied when the command's turn comes (under the API's execution lock):

- **Epoch** (no clock involved): every stop trip and every reset starts a new stop epoch. A
  transport notes the epoch when a command arrives; a motion command that arrived in an earlier
  epoch is stale, and so is a `reset` that arrived before the latest trip (it was meant for an
  earlier stop). The daemon's start is epoch 0: nothing from before it is in the inbox.
- **`ts`** (the publisher's clock, Unix seconds): a motion command whose `ts` is earlier than the
  latest stop, reset or daemon start (`last_change`) plus `clock_skew_s` is stale; a `reset`
  whose `ts` is earlier than the latest trip plus `clock_skew_s` too. With the publisher's clock
  within `clock_skew_s` of ours, anything published before the cut-off is refused, however long
  it was held on the way; what was published after it is refused only within 2 x clock_skew_s
  of the stop or reset (send it again). The assumption is enforced where it can be: a `ts` more
  than `clock_skew_s` ahead of our clock is refused `clock_skew` (a publisher with a fast clock
  learns it on its first command, not when a stale one slips through).

Motion commands: task.start, resume, manual.enter, manual.jog. `manual.exit`, `task.cancel`,
`status` and `estop` end or observe motion and are never stale.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Protocol

from edge_agent.vocab import ErrorCode

MOTION_COMMANDS = frozenset({"task.start", "resume", "manual.enter", "manual.jog"})
DEFAULT_CLOCK_SKEW_S = 1.0


@dataclass(frozen=True, slots=True)
class Epoch:
    """Where the stop history stood when a command arrived."""

    trips: int  # stop trips since the daemon started
    changes: int  # trips and resets since the daemon started


@dataclass(frozen=True, slots=True)
class Refusal:
    code: ErrorCode
    message: str


class LatchView(Protocol):
    """What the latch's listener hands over (executor.latch.LatchState)."""

    @property
    def latched(self) -> bool: ...

    @property
    def hardware_input(self) -> bool: ...


def _utc(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).isoformat(timespec="milliseconds")


class Freshness:
    """The stop epochs and their wall-clock times; thread-safe (transports and the API read,
    the latch's listener writes)."""

    def __init__(self, clock_skew_s: float = DEFAULT_CLOCK_SKEW_S,
                 wall_clock: Callable[[], float] = time.time) -> None:
        if not clock_skew_s >= 0.0:
            raise ValueError(f"clock_skew_s must be >= 0, got {clock_skew_s}")
        self.clock_skew_s = clock_skew_s
        self._wall = wall_clock
        self._lock = threading.Lock()
        self._trips = self._changes = 0
        started = wall_clock()
        self._last_trip = self._last_change = started  # the daemon's start counts as both

    def epoch(self) -> Epoch:
        with self._lock:
            return Epoch(self._trips, self._changes)

    def note_trip(self) -> None:
        """A stop tripped (or an e-stop was pressed or commanded again while latched)."""
        now = self._wall()
        with self._lock:
            self._trips += 1
            self._changes += 1
            self._last_trip = max(self._last_trip, now)
            self._last_change = max(self._last_change, now)

    def note_reset(self) -> None:
        """The latch was reset: motion sent before now is stale."""
        now = self._wall()
        with self._lock:
            self._changes += 1
            self._last_change = max(self._last_change, now)

    def on_latch(self, state: LatchView, cause: object | None) -> None:
        """The stop latch's listener: a new cause or a renewed button press is a trip, a clear
        latch a reset (a release of the button while latched is neither)."""
        if cause is not None or state.hardware_input:
            self.note_trip()
        elif not state.latched:
            self.note_reset()

    def check(self, command: str, ts: float | None, arrived: Epoch | None) -> Refusal | None:
        """None when `command` may go on to admission; else why it is refused."""
        now = self._wall()
        skew = self.clock_skew_s
        if ts is not None and ts > now + skew:
            return Refusal(ErrorCode.CLOCK_SKEW,
                           f"ts {_utc(ts)} is {ts - now:.3f} s ahead of the daemon's clock "
                           f"(allowed: {skew:g} s); fix the publisher's clock")
        if command not in MOTION_COMMANDS and command != "reset":
            return None
        with self._lock:
            trips, changes = self._trips, self._changes
            last_trip, last_change = self._last_trip, self._last_change
        if command == "reset":
            moved, cutoff, what = (arrived is not None and arrived.trips != trips,
                                   last_trip, "the latest stop")
        else:
            moved, cutoff, what = (arrived is not None and arrived.changes != changes,
                                   last_change, "the latest stop or reset")
        if moved:
            return Refusal(ErrorCode.STALE, f"{command} arrived before {what} and waited "
                           "until after it; not run (send a new command if still wanted)")
        if ts is not None and ts < cutoff + skew:
            return Refusal(ErrorCode.STALE, f"{command} was published (ts {_utc(ts)}) before "
                           f"{what} at {_utc(cutoff)} (allowing {skew:g} s clock skew); "
                           "not run (send a new command if still wanted)")
        return None

"""The guardian's own time: whether this process itself stalled between two inputs to its rules.

The guardian's loop runs its rules at least at every `next_deadline()` (a G_STATE is due every
half deadman time at most), so two inputs further apart than the deadman time mean the process
did not run meanwhile: SIGSTOP, a swap storm, a starved CPU. Whatever the daemon queued in the
socketpair during that gap is read after it as if just sent — a HOLD the daemon's executor sent
when its measurements went stale would re-arm the deadman and let the setpoints queued behind it
through — and a decision taken before the gap must not be written after it. The rules ask here:
- an input more than the deadman time after the previous one, while the daemon's stream moved
  within a deadman time before the gap, trips the deadman first (latched, the hold stream;
  counted in `stalls`);
- the caller reads its clock again just before writing motion (a moving COMMAND, ENABLE(1)) and
  asks `GuardianRules.before_write`: motion decided longer ago than the stall bound (the deadman
  time, or the firmware's HELLO deadman when shorter: it has tripped by then) is not written and
  the deadman trips (`stale_dropped`); and once more after the write (`after_write`): a stall
  that fell between the two may have let it out stale, so `STOP(CAT2, DEADMAN)` follows at once
  and the deadman trips (`stale_written`).
"""

from __future__ import annotations

import math


class OwnTime:
    """When the rules last had an input, and when the daemon last asked for motion."""

    __slots__ = ("last_input", "moved_at")

    def __init__(self, now: float) -> None:
        self.last_input = now  # what the caller writes was decided then
        self.moved_at = -math.inf  # a COMMAND from the daemon asked for motion

    def woke(self, now: float, deadman_s: float) -> bool:
        """An input at `now`. True: it follows a gap longer than the deadman time, and the
        daemon's stream moved within a deadman time before the gap (the robot was moving)."""
        gap = now - self.last_input
        moving = self.moved_at >= self.last_input - deadman_s
        self.last_input = now
        return gap > deadman_s and moving

    def stale(self, now: float, bound_s: float) -> bool:
        """A decision taken at the last input is older than `bound_s` at `now`."""
        return now - self.last_input > bound_s

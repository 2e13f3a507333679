"""The guardian's one waiting timed command (G_AT, docs/PROTOCOL.md §5.2): when it is due, how late.

Pure bookkeeping for `GuardianRules`: it holds at most one COMMAND with its deadline and counts
what happened to it in the rules' counters; the rules decide what a released COMMAND does.
"""

from __future__ import annotations

from edge_agent.link.codec import Command, GAt

# A G_AT deadline is in whole µs: a tick this close to it releases the frame (lock-step time
# reaches a deadline as a sum of float periods, a hair short of it).
DUE_SLACK_S = 2e-6
LATE_RELEASE_S = 0.0005  # a timed frame released this long after its deadline counts as late


class TimedSlot:
    """At most one G_AT frame waiting for its deadline; counts into the rules' `counters`."""

    def __init__(self, counters: dict[str, int]) -> None:
        self.waiting: tuple[float, Command] | None = None
        self.max_release_late_s = 0.0  # the latest a timed frame went out after its deadline
        self._counters = counters

    def due(self, now: float) -> bool:
        """A frame waits and its deadline has come."""
        return self.waiting is not None and now >= self.waiting[0] - DUE_SLACK_S

    def next_deadline(self) -> float | None:
        return None if self.waiting is None else self.waiting[0]

    def admit(self, msg: GAt, now: float, deadman_s: float) -> bool:
        """Let `msg` wait (the slot must be empty); False: refused, due further than the deadman."""
        due = msg.at_us / 1e6
        if due - now > deadman_s + DUE_SLACK_S:
            # Further ahead than the deadman: the stream would have gone quiet by then (the
            # daemon's period is at most half of it, config/checks.py) — a bad clock or a bug.
            self._counters["timed_rejected"] += 1
            return False
        self.waiting = (due, msg.cmd)
        if self.due(now) and now - due > LATE_RELEASE_S:  # arrived after its deadline
            self._counters["timed_arrived_late"] += 1  # the daemon's lateness, not ours
        return True

    def take(self, now: float) -> Command:
        """The waiting COMMAND, released now (counted, its lateness kept)."""
        assert self.waiting is not None
        (due, cmd), self.waiting = self.waiting, None
        late = now - due
        self._counters["timed_released"] += 1
        if late > LATE_RELEASE_S:
            self._counters["timed_late"] += 1
        self.max_release_late_s = max(self.max_release_late_s, late)
        return cmd

    def drop(self) -> None:
        """Forget the waiting frame (a latch, a STOP, an immediate COMMAND, the daemon lost)."""
        if self.waiting is not None:
            self.waiting = None
            self._counters["timed_dropped"] += 1

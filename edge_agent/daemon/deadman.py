"""The daemon's deadman on the link guardian: its stream silent past the deadman time is a stop.

The guardian relays STATUS at the firmware's rate and sends G_STATE at least every half deadman
time (docs/PROTOCOL.md §5.1), so no frame for longer than the deadman time means the guardian —
or this process, stopped by a swap storm or a debugger — stalled: a protective stop, cause
`deadman` (DESIGN.md "deadman trip (daemon or guardian silent)") — when the robot was being
moved: a command computed within a deadman time before the silence began, or during it, asked
for motion (the executor itself holds a few ms into a silence: its measurements went stale). A
silence while the daemon streams holds (idle, start-up work after READY) stops nothing; the
guardian keeps the same rule (PROTOCOL.md §4). The control thread checks every tick, before
the executor computes a setpoint, so a daemon
that wakes up after a stall latches before its first (stale) setpoint. The condition stays
present while the silence lasts (a reset is refused with `cause_present`); the latch, as always,
only clears on reset.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING

from edge_agent.daemon.linkmirror import LinkMirror
from edge_agent.executor.latch import StopLatch
from edge_agent.log import get_logger
from edge_agent.vocab import StopCause

if TYPE_CHECKING:
    from edge_agent.contract.status_parts import LinkWatch

_log = get_logger(__name__)


class GuardianWatch:
    """`check(now)` once per control tick; `close()` at shutdown (silence is expected then)."""

    def __init__(self, mirror: LinkMirror, latch: StopLatch, deadman_s: float,
                 guardian_ready: Callable[[], bool]) -> None:
        self._mirror = mirror
        self._latch = latch
        self.deadman_s = deadman_s
        self._ready = guardian_ready  # a guardian being (re)started is GUARDIAN_LOST's business
        self.silent = False
        self.present = False  # the DEADMAN condition this watch set
        self.moved_at = -math.inf  # when the control thread last computed a moving command
        self.trips = 0
        self.closed = False

    def check(self, now: float) -> None:
        last = self._mirror.last_frame_at
        silent = (not self.closed and last > 0.0 and self._ready()
                  and now - last > self.deadman_s)
        self.silent = silent
        moving = self.moved_at >= last - self.deadman_s
        if silent and moving and not self.present:
            self.present = True
            self.trips += 1
            _log.warning("guardian_silent", silent_ms=round((now - last) * 1e3, 1),
                         deadman_ms=round(self.deadman_s * 1e3, 1))
            self._latch.set_condition(StopCause.DEADMAN, True, now)
        elif not silent and self.present:
            self.present = False
            self._latch.set_condition(StopCause.DEADMAN, False, now)

    def commanded(self, moves: bool, now: float) -> None:
        """The control thread computed a command (`moves`: it asks for motion) at `now`."""
        if moves:
            self.moved_at = now

    def close(self) -> None:
        self.closed = True
        self._mirror.closing = True

    def summary(self) -> LinkWatch:
        """For `status.link.watch`."""
        moved = self.moved_at if math.isfinite(self.moved_at) else None  # JSON has no -inf
        return {"guardian_silent": self.silent, "moved_at": moved, "trips": self.trips,
                "deadman_ms": round(self.deadman_s * 1e3, 1)}

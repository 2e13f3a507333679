"""The daemon's deadman on the link guardian: its stream silent past the deadman time is a stop.

The guardian relays STATUS at the firmware's rate and sends G_STATE at least every half deadman
time (docs/PROTOCOL.md §5.1), so no frame for longer than the deadman time means the guardian —
or this process, stopped by a swap storm or a debugger — stalled: a protective stop, cause
`deadman` (DESIGN.md "deadman trip (daemon or guardian silent)"). The control thread checks it
every tick, before the executor computes a setpoint, so a daemon that wakes up after a stall
latches before its first (stale) setpoint. The condition stays present while the silence lasts
(a reset is refused with `cause_present`); the latch, as always, only clears on reset.
"""

from __future__ import annotations

from collections.abc import Callable

from edge_agent.daemon.linkmirror import LinkMirror
from edge_agent.executor.latch import StopCause, StopLatch
from edge_agent.log import get_logger

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
        self.trips = 0
        self.closed = False

    def check(self, now: float) -> None:
        last = self._mirror.last_frame_at
        silent = (not self.closed and last > 0.0 and self._ready()
                  and now - last > self.deadman_s)
        if silent == self.silent:
            return
        self.silent = silent
        if silent:
            self.trips += 1
            _log.warning("guardian_silent", silent_ms=round((now - last) * 1e3, 1),
                         deadman_ms=round(self.deadman_s * 1e3, 1))
        self._latch.set_condition(StopCause.DEADMAN, silent, now)

    def close(self) -> None:
        self.closed = True
        self._mirror.closing = True

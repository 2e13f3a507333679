"""What a stop does in the daemon: the stop frame first, then the snapshot, then the event.

Every e-stop source (MQTT, the fleet topic, the control socket, SIGUSR1) calls `estop(cause)`;
the link guardian's loss and a failed snapshot write latch a protective stop; the latch's
listener (`on_latch`) sends the matching STOP frame to the guardian, persists the latch and
publishes the `stop` / `stop_cleared` / `stop_update` event. Nothing here clears a stop: only a
`reset` command does (daemon/handlers.py), and it moves nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from time import perf_counter
from typing import TYPE_CHECKING

from edge_agent.clock import Clock
from edge_agent.commands import Freshness
from edge_agent.daemon.control import ControlPath
from edge_agent.executor.latch import LatchState, StopLatch
from edge_agent.link.codec import Stop, StopCategory, StopReason
from edge_agent.log import get_logger
from edge_agent.metrics.tally import ESTOP_REACTION, STOPS
from edge_agent.vocab import EventType, StopCause

if TYPE_CHECKING:
    from edge_agent.contract.events import Event

_log = get_logger(__name__)


class StopPath:
    """The latch's listener and the stop sources' entry points; `closing` once shutting down."""

    def __init__(self, latch: StopLatch, control: ControlPath, clock: Clock,
                 freshness: Freshness, *, save_snapshot: Callable[[], object],
                 publish: Callable[[Event], None],
                 state_changed: Callable[[], None]) -> None:
        self.latch = latch
        self.control = control
        self.clock = clock
        self.freshness = freshness
        self._save_snapshot = save_snapshot
        self._publish = publish
        self._state_changed = state_changed
        self.closing = False  # we stop the guardian ourselves: its exit is not a fault
        self._estop_t0 = 0.0  # an e-stop call in progress (the metrics' reaction histogram)

    def listen(self) -> None:
        """Subscribe to the latch (before the restored state is applied to it)."""
        self.latch.add_listener(self.freshness.on_latch)
        self.latch.add_listener(self.on_latch)

    def estop(self, cause: StopCause) -> None:
        """Any e-stop source: latch (the listener sends the stop frame) — and send it again."""
        self._estop_t0 = perf_counter()
        now = self.clock.now()
        if not self.latch.trip(cause, now):
            self.freshness.note_trip()  # commanded again while latched: a stop all the same
            self.control.send(Stop(StopCategory.CAT0, StopReason.ESTOP_REMOTE))
            ESTOP_REACTION.observe(perf_counter() - self._estop_t0)
        self._estop_t0 = 0.0

    def on_latch(self, state: LatchState, cause: StopCause | None) -> None:
        if cause is not None:
            self.control.send_stop(cause)
            if self._estop_t0:  # an e-stop call: its STOP frame is with the guardian now
                ESTOP_REACTION.observe(perf_counter() - self._estop_t0)
            STOPS.inc(cause.value)
        self._save_snapshot()
        if cause is not None and state.kind is not None:  # a trip: the latch has a kind
            self._publish({"type": EventType.STOP, "kind": state.kind, "cause": cause})
        elif cause is None:
            hw = state.hardware_input
            self._publish({"type": EventType.STOP_CLEARED, "hardware_input": hw}
                          if not state.latched else
                          {"type": EventType.STOP_UPDATE, "hardware_input": hw})
        self._state_changed()

    def on_guardian_down(self, reason: str) -> None:
        if self.closing:
            return  # we stopped it (or a terminal's Ctrl-C reached it): not a fault
        _log.error("guardian_down", reason=reason)
        self.latch.set_condition(StopCause.GUARDIAN_LOST, True, self.clock.now())

    def on_guardian_up(self) -> None:
        self.latch.set_condition(StopCause.GUARDIAN_LOST, False, self.clock.now())

    def on_store_error(self, name: str, exc: BaseException) -> None:
        _log.error("snapshot_write_failed", store=name, error=str(exc))
        self.latch.trip(StopCause.SNAPSHOT_FAILED, self.clock.now())

"""The stop latch: e-stops and protective stops latch here, and only an explicit reset clears them.

This is the daemon's copy of the stop state (the link guardian keeps its own at the wire). Any
thread may trip it (paho's for MQTT e-stop, the link reader for the hardware input, a signal
handler); listeners run after the state changed, outside the lock, and must be quick.
Rules (DESIGN.md "Stop model", REQUIREMENTS.md 1-4):
- an e-stop dominates a protective stop; both latch;
- reset of an e-stop is refused while the hardware input is active;
- reset of a protective stop is refused while its cause is still present;
- a reset only permits motion: `generation` changes on every trip and reset, so the executor can
  drop whatever setpoint it held and wait for a new command.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from edge_agent.errors import EdgeAgentError
from edge_agent.log import get_logger
from edge_agent.vocab import ESTOP_CAUSES, StopCause, StopKind

_log = get_logger(__name__)


class ResetRefused(EdgeAgentError):
    """A reset was refused; `code` is a stable reason (estop_active, cause_present)."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


@dataclass(frozen=True, slots=True)
class LatchState:
    """An immutable view of the latch for the control thread, `state` and snapshots."""

    kind: StopKind | None
    causes: tuple[StopCause, ...]
    first_cause: StopCause | None
    tripped_at: float | None
    hardware_input: bool
    generation: int

    @property
    def latched(self) -> bool:
        return self.kind is not None

    def as_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind.value if self.kind else None,
            "cause": self.first_cause.value if self.first_cause else None,
            "causes": [c.value for c in self.causes],
            "hardware_input": self.hardware_input,
        }


Listener = Callable[[LatchState, StopCause | None], None]


class StopLatch:
    """Thread-safe latch of stop causes with the reset rules of the stop model."""

    def __init__(self) -> None:
        self._lock = threading.RLock()  # re-entrant: a signal handler may trip while held
        self._causes: dict[StopCause, float] = {}
        self._present: set[StopCause] = set()  # protective conditions still true right now
        self._hw_input = False
        self._generation = 0
        self._listeners: list[Listener] = []
        self._state = self._build()

    # -- reading -------------------------------------------------------------------------
    @property
    def state(self) -> LatchState:
        return self._state  # an immutable object swapped atomically: no lock needed

    @property
    def latched(self) -> bool:
        return self._state.kind is not None

    def add_listener(self, fn: Listener) -> None:
        self._listeners.append(fn)

    # -- tripping ------------------------------------------------------------------------
    def trip(self, cause: StopCause, now: float) -> bool:
        """Latch `cause`. Returns True if the cause was new (already-latched causes stay).

        Listeners hear only new causes; a caller that must confirm a repeated stop (an e-stop
        command while already latched) acts on the False it gets back.
        """
        with self._lock:
            new = cause not in self._causes
            if new:
                self._causes[cause] = now
                self._generation += 1
                self._state = self._build()
            state = self._state
        if new:
            self._notify(state, cause)
        return new

    def set_hardware_input(self, active: bool, now: float) -> None:
        """Mirror the physical e-stop input; a press trips, a release clears nothing."""
        with self._lock:
            changed = active != self._hw_input
            self._hw_input = active
            if changed:
                self._state = self._build()
        if active:
            if not self.trip(StopCause.ESTOP_INPUT, now) and changed:
                self._notify(self._state, None)  # pressed again while still latched
        elif changed:
            self._notify(self._state, None)

    def set_condition(self, cause: StopCause, present: bool, now: float) -> None:
        """A protective condition appeared (trips) or went away (allows a later reset)."""
        if present:
            with self._lock:
                self._present.add(cause)
            self.trip(cause, now)
        else:
            with self._lock:
                self._present.discard(cause)

    # -- resetting -----------------------------------------------------------------------
    def check_reset(self) -> None:
        """Raise ResetRefused if a reset would be refused now."""
        with self._lock:
            if self._hw_input:
                raise ResetRefused("estop_active",
                                   "the hardware e-stop input is still active; release it first")
            present = sorted(c.value for c in self._present if c in self._causes)
            if present:
                raise ResetRefused("cause_present",
                                   f"the stop cause is still present: {', '.join(present)}")

    def reset(self, now: float) -> LatchState:
        """Clear every latched cause if allowed (raises ResetRefused otherwise)."""
        with self._lock:
            self.check_reset()
            if not self._causes:
                return self._state
            self._causes.clear()
            self._generation += 1
            self._state = self._build()
            state = self._state
        self._notify(state, None)
        return state

    # -- persistence ---------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        with self._lock:
            return {"causes": {c.value: t for c, t in self._causes.items()}}

    def restore(self, data: Mapping[str, Any], now: float) -> None:
        """Re-latch the causes saved in a snapshot (times are re-based to `now`)."""
        causes = data.get("causes", {}) if isinstance(data, Mapping) else {}
        for name in causes:
            try:
                cause = StopCause(name)
            except ValueError:
                cause = StopCause.UNCLEAN_RESTART  # unknown saved cause: stay stopped anyway
            self.trip(cause, now)
        # A restored protective cause is not known to be present any more: a reset may clear it
        # once the live checks (link up, ...) say so.
        with self._lock:
            self._present.clear()

    # -- internals -----------------------------------------------------------------------
    def _build(self) -> LatchState:
        causes = tuple(sorted(self._causes, key=lambda c: self._causes[c]))
        if not causes:
            kind = None
        elif any(c in ESTOP_CAUSES for c in causes):
            kind = StopKind.ESTOP
        else:
            kind = StopKind.PROTECTIVE
        first = causes[0] if causes else None
        if kind is StopKind.ESTOP:
            first = next(c for c in causes if c in ESTOP_CAUSES)
        return LatchState(kind, causes, first, self._causes[causes[0]] if causes else None,
                          self._hw_input, self._generation)

    def _notify(self, state: LatchState, cause: StopCause | None) -> None:
        for fn in self._listeners:
            try:
                fn(state, cause)
            except Exception:  # a listener must never break the latch
                _log.exception("latch_listener_failed", listener=repr(fn))

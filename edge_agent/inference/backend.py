"""The inference seam: the Backend protocol, request tickets, inference events and decision records.

A backend turns one observation vector (a sequence of floats) into one score per action.
`submit` never blocks on a network: a local backend runs the model on the caller's thread and
returns a completed `Ticket`; a remote backend hands the row to its own worker thread and returns
a pending ticket (or None while the worker is still busy with an earlier request). The router
owns deadlines and fall-through; backends report what happened to them on an `EventBus`.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol, cast

from edge_agent.log import get_logger

if TYPE_CHECKING:
    from edge_agent.contract.events import Event

log = get_logger(__name__)

# numpy stays out of this module: it is on the daemon's start-up path (numpy costs ~100 ms).
Row = Sequence[float]


class EventKind(StrEnum):
    """What an inference event reports (the health monitor maps these onto degradation modes)."""

    BACKEND_UP = "inference_backend_up"  # loaded, or ready again after being down
    BACKEND_DOWN = "inference_backend_down"  # no longer ready (server gone, model unloaded)
    LOAD_FAILED = "inference_load_failed"  # a session or client could not be created
    ATTEMPT_FAILED = "inference_attempt_failed"  # one decision's attempt: error, NaN, deadline
    GPU_UNAVAILABLE = "gpu_unavailable"  # an accelerator was asked for, get_providers() lacks it
    GPU_FAILED = "gpu_failed"  # a run on the accelerator raised; the session moves to CPU
    FALLBACK = "inference_fallback"  # the backend that decides changed
    MODEL_INSTALLED = "model_installed"  # model.update verified and swapped in
    MODEL_REJECTED = "model_rejected"  # model.update refused (hash, load or shape mismatch)
    CACHE_CORRUPT = "model_cache_corrupt"  # a cached model failed verification


@dataclass(frozen=True, slots=True)
class InferenceEvent:
    kind: EventKind
    backend: str
    detail: str
    mono: float

    def as_dict(self) -> Event:
        """The event (edge_agent/contract/events_more.py InferenceFields: `kind` is one of the
        inference EventTypes, tests/test_asyncapi.py checks)."""
        return cast("Event", {"type": self.kind.value, "backend": self.backend,
                              "detail": self.detail, "mono": self.mono})


EventSink = Callable[[InferenceEvent], None]


class EventBus:
    """Fans inference events out to one sink and wakes threads waiting for a backend state.

    The sink runs on whichever thread emits (the control thread included): it must only enqueue.
    """

    def __init__(self, sink: EventSink | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._sink = sink
        self._clock = clock
        self._cond = threading.Condition()
        self.counts: dict[EventKind, int] = {}

    def emit(self, kind: EventKind, backend: str, detail: str = "") -> InferenceEvent:
        ev = InferenceEvent(kind, backend, detail, self._clock())
        with self._cond:
            self.counts[kind] = self.counts.get(kind, 0) + 1
            self._cond.notify_all()
        if self._sink is not None:
            try:
                self._sink(ev)
            except Exception:  # a broken sink must not break inference
                log.exception("inference_event_sink_failed", kind=kind.value)
        return ev

    def poke(self) -> None:
        """Wake waiters without an event (a backend's state changed silently)."""
        with self._cond:
            self._cond.notify_all()

    def wait_until(self, predicate: Callable[[], bool], timeout: float) -> bool:
        """Block (never on the control thread) until predicate() holds or timeout passes."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while not predicate():
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                # bounded wait: a backend may turn ready without emitting (defensive re-check)
                self._cond.wait(min(left, 0.1))
            return True


class Ticket:
    """One request to a backend: completed exactly once with scores or an error."""

    __slots__ = ("_event", "error", "finished", "scores", "started")

    def __init__(self, started: float, pending: bool = False) -> None:
        self.started = started
        self.finished: float | None = None
        self.scores: list[float] | None = None
        self.error: str | None = None
        self._event = threading.Event() if pending else None

    @classmethod
    def completed(cls, started: float, scores: list[float] | None, error: str | None,
                  finished: float) -> Ticket:
        """An already answered ticket (a local backend); no Event is allocated."""
        t = cls.__new__(cls)
        t.started, t.finished, t.scores, t.error, t._event = started, finished, scores, error, None
        return t

    def complete(self, scores: list[float] | None, error: str | None, finished: float) -> None:
        self.scores, self.error, self.finished = scores, error, finished
        if self._event is not None:
            self._event.set()

    @property
    def done(self) -> bool:
        return self.finished is not None

    def wait(self, timeout: float) -> bool:
        if self.finished is not None or self._event is None:
            return self.finished is not None
        return self._event.wait(max(0.0, timeout))


class Backend(Protocol):
    """A policy backend. `submit` must return at once (see the module docstring)."""

    name: str

    def ready(self) -> bool: ...

    def submit(self, row: Row) -> Ticket | None: ...

    def stop(self) -> None: ...


class DecisionRecord(NamedTuple):
    """One decision, as the journal stores it (a NamedTuple: built on the control thread)."""

    mono: float
    state: str
    observation: tuple[float, ...]
    action: str | None  # None: no backend gave a usable answer
    backend: str | None  # the backend whose answer was used
    latency_s: float  # from the request to the decision
    outcome: str  # "ok" (no attempt failed), "fallback", "no_decision"
    attempts: tuple[tuple[str, str], ...]  # (backend, outcome) of every backend tried

    def as_dict(self) -> dict[str, Any]:
        return {"mono": self.mono, "state": self.state, "observation": list(self.observation),
                "action": self.action, "backend": self.backend,
                "latency_ms": round(self.latency_s * 1e3, 4), "outcome": self.outcome,
                "attempts": [list(a) for a in self.attempts]}


DecisionSink = Callable[[DecisionRecord], None]

"""The policy router: the executor's `Policy`, answered by the best backend that answers in time.

Backends are tried in preference order (remote Triton → local ONNX on CUDA or CPU → the cached
last-known-good model on CPU). A backend that is not ready is skipped without waiting. An attempt
that raises, returns NaN/inf or the wrong number of scores, or misses its deadline falls through
to the next backend *for the same decision*: no decision is dropped while any backend works. Each
failed attempt is an `inference_attempt_failed` event, each change of the deciding backend an
`inference_fallback` event; every decision goes to the decision sink (the journal).

Two ways to ask, both for the control thread:
- `decide(obs)` (the executor's `Policy`): waits at most `deadline_s` per remote attempt for the
  worker's answer, then falls through; local backends run inline in microseconds.
- `begin(obs)` then `PendingDecision.poll()` once per control tick: never blocks at all; a remote
  answer is used if it arrived by the deadline, otherwise the local backends decide.

Importing this module imports neither onnxruntime nor tritonclient nor numpy.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, cast

from edge_agent.inference.backend import (
    Backend,
    DecisionRecord,
    DecisionSink,
    EventBus,
    EventKind,
    Ticket,
)
from edge_agent.log import get_logger
from edge_agent.metrics.tally import DECISION_LATENCY
from edge_agent.policy_seam import Action, Observation

if TYPE_CHECKING:
    from edge_agent.contract.status_parts import BackendStatus, RouterStatus

log = get_logger(__name__)
_N_ACTIONS = len(Action)
_ACTIONS = tuple(Action(i) for i in range(_N_ACTIONS))  # output index -> action, looked up
_LABELS = tuple(a.name.lower() for a in _ACTIONS)  # by index: an IntEnum's hash is Python code
_isfinite = math.isfinite


class PendingDecision:
    """One decision in flight; `poll()` advances it without blocking."""

    __slots__ = ("_attempts", "_failed", "_i", "_r", "_ticket", "_ticket_deadline", "action",
                 "backend", "done", "obs", "t0")

    def __init__(self, router: PolicyRouter, obs: Observation, t0: float) -> None:
        self._r = router
        self.obs = obs
        self.t0 = t0
        self._i = 0
        self._ticket: Ticket | None = None
        self._ticket_deadline = 0.0
        self._attempts: list[tuple[str, str]] = []
        self._failed = False
        self.done = False
        self.action: Action | None = None
        self.backend: str | None = None

    def poll(self) -> bool:
        """Advance as far as possible without blocking; True once decided (see `.action`)."""
        if not self.done:
            self._advance(block=False)
        return self.done

    def wait(self) -> Action | None:
        """Advance to the end, waiting at most the deadline of each pending remote attempt."""
        while not self.done:
            self._advance(block=True)
        return self.action

    def _advance(self, block: bool) -> None:
        r = self._r
        backends = r.backends
        while self._i < len(backends):
            b = backends[self._i]
            t = self._ticket
            if t is None:
                if not b.ready():
                    self._next(b.name, "not_ready")
                    continue
                t = b.submit(self.obs.vector)
                if t is None:
                    self._next(b.name, "busy")
                    continue
                self._ticket = t
                if t.finished is None:  # a local backend's ticket comes back answered
                    self._ticket_deadline = r.clock() + r.deadline_s
            if t.finished is None:
                if block:
                    t.wait(self._ticket_deadline - r.clock())
                if not t.done:
                    if r.clock() < self._ticket_deadline:
                        return  # still pending: the caller polls again next tick
                    self._fail(b.name, "deadline", f"no answer within {r.deadline_s * 1e3:g} ms")
                    continue
            assert t.finished is not None
            took = t.finished - t.started
            if t.error is not None:
                self._fail(b.name, "error", t.error)
            elif took > r.deadline_s:
                self._fail(b.name, "deadline",
                           f"answered in {took * 1e3:.2f} ms > {r.deadline_s * 1e3:g} ms")
            elif (action := _action(t.scores)) is None:
                self._fail(b.name, "nan", f"unusable scores {t.scores!r}")
            else:
                self._attempts.append((b.name, "ok"))
                self._finish(action, b.name)
                return
        self._finish(None, None)

    def _next(self, name: str, outcome: str) -> None:
        self._attempts.append((name, outcome))
        self._ticket = None
        self._i += 1

    def _fail(self, name: str, outcome: str, detail: str) -> None:
        self._failed = True
        self._r.bus.emit(EventKind.ATTEMPT_FAILED, name, f"{outcome}: {detail}")
        self._next(name, outcome)

    def _finish(self, action: Action | None, backend: str | None) -> None:
        self.done, self.action, self.backend = True, action, backend
        self._r._record(self, tuple(self._attempts))


def _action(scores: list[float] | None) -> Action | None:
    """Argmax over one finite score per action (the first of equal ones); None for NaN/inf or a
    wrong length."""
    if scores is None or len(scores) != _N_ACTIONS:
        return None
    if not _isfinite(sum(scores)):  # one test for the usual case; a sum can overflow, so check
        for s in scores:             # each value before refusing
            if not _isfinite(s):
                return None
    return _ACTIONS[scores.index(max(scores))]


class PolicyRouter:
    """The executor's `Policy` over backends in preference order (see the module docstring)."""

    def __init__(self, backends: Sequence[Backend], bus: EventBus, *, deadline_s: float,
                 decision_sink: DecisionSink | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if not backends:
            raise ValueError("PolicyRouter needs at least one backend")
        self.backends = tuple(backends)
        self.bus = bus
        self.deadline_s = deadline_s
        self.clock = clock
        self._sink = decision_sink
        self.backend_in_use: str | None = None  # who made the last decision (for `state`)
        self.decisions = 0
        self.fallbacks = 0
        self.no_decisions = 0

    # -- the Policy protocol --------------------------------------------------------------
    def decide(self, obs: Observation) -> Action | None:
        return self.begin(obs).wait()

    def begin(self, obs: Observation) -> PendingDecision:
        """Start a decision; poll the result on later ticks. Non-finite input is no decision."""
        d = PendingDecision(self, obs, self.clock())
        if not math.isfinite(sum(obs.vector)):  # any NaN/inf (cheaper than a per-value test)
            d._attempts.append(("-", "bad_observation"))
            d._finish(None, None)
        else:
            d.poll()
        return d

    # -- readiness ------------------------------------------------------------------------
    def ready(self) -> bool:
        return any(b.ready() for b in self.backends)

    def wait_ready(self, timeout: float) -> bool:
        """Block up to timeout until some backend can decide (a task waits for its model).

        For the command path or a background task, never the control thread.
        """
        return self.bus.wait_until(self.ready, timeout)

    def backend(self, name: str) -> Backend | None:
        """The backend called `name` (triton, local, cached, rule), None when there is none."""
        return next((b for b in self.backends if b.name == name), None)

    def preferred_ready(self) -> str | None:
        """The backend the next decision will try first."""
        return next((b.name for b in self.backends if b.ready()), None)

    # -- bookkeeping ----------------------------------------------------------------------
    def _record(self, d: PendingDecision, attempts: tuple[tuple[str, str], ...]) -> None:
        latency = self.clock() - d.t0
        DECISION_LATENCY.observe(d.backend or "none", latency)  # O(1): the metrics' histogram
        if d.action is None:
            self.no_decisions += 1
            outcome = "no_decision"
        else:
            self.decisions += 1
            # a busy backend is always followed by another attempt: one attempt is no fallback
            failed = d._failed or (len(attempts) > 1 and any(o == "busy" for _, o in attempts))
            outcome = "fallback" if failed else "ok"
            self.fallbacks += failed
            if d.backend != self.backend_in_use:
                if self.backend_in_use is not None:
                    self.bus.emit(EventKind.FALLBACK, d.backend or "-",
                                  f"decisions now from {d.backend} (was {self.backend_in_use})")
                self.backend_in_use = d.backend
        if self._sink is not None:
            # the state as the StrEnum member: it is its value (`.value` is a slow property)
            rec = DecisionRecord(d.t0, d.obs.state, d.obs.vector,
                                 _LABELS[d.action] if d.action is not None else None,
                                 d.backend, latency, outcome, attempts)
            try:
                self._sink(rec)
            except Exception:  # the journal failing must not stop decisions
                log.exception("decision_sink_failed")

    def status(self) -> RouterStatus:
        return {"backend_in_use": self.backend_in_use, "preferred_ready": self.preferred_ready(),
                "decisions": self.decisions, "fallbacks": self.fallbacks,
                "no_decisions": self.no_decisions,
                "backends": [_status(b) for b in self.backends]}

    def stop(self) -> None:
        """Stop every backend; idempotent, never raises."""
        for b in self.backends:
            try:
                b.stop()
            except Exception:
                log.exception("backend_stop_failed", backend=b.name)


def _status(b: Backend) -> BackendStatus:
    fn = getattr(b, "status", None)  # every backend of the daemon has one; test doubles may not
    st = fn() if callable(fn) else {"name": b.name, "ready": b.ready()}
    return cast("BackendStatus", st)


if TYPE_CHECKING:  # mypy proves the router is the executor's Policy
    from edge_agent.policy_seam import Policy

    def _is_policy(router: PolicyRouter) -> Policy:
        return router

"""The last backend: the rule-based reference expert, so that a decision is never dropped.

When every model backend is down (Triton gone, no model file, a session that cannot load) the
router still falls through to this one: always ready, answers on the caller's thread in a few
microseconds, from the same observation vector. Its answers are one-hot scores, so the router
treats them like any model's. The executor's guards still decide whether an `advance` is taken.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from edge_agent.executor.policy import ExpertPolicy
from edge_agent.inference.backend import Row, Ticket
from edge_agent.policy_seam import POLICY_STATES, Action, Observation, Policy

if TYPE_CHECKING:
    from edge_agent.contract.status_parts import RuleBackendStatus

_N_STATES = len(POLICY_STATES)


class RuleBackend:
    """A `Backend` around a `Policy` (default: the expert); named "rule" in `state`."""

    def __init__(self, policy: Policy | None = None, *, name: str = "rule",
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.name = name
        self.policy: Policy = policy if policy is not None else ExpertPolicy()
        self._clock = clock
        self.runs = 0

    def ready(self) -> bool:
        return True

    def submit(self, row: Row) -> Ticket:
        t0 = self._clock()
        hot = row[:_N_STATES]
        if len(row) < _N_STATES or max(hot) < 0.5:
            return Ticket.completed(t0, None, "observation has no running state", self._clock())
        state = POLICY_STATES[max(range(_N_STATES), key=hot.__getitem__)]
        try:
            action = self.policy.decide(Observation(state, tuple(row)))
        except Exception as e:  # a broken rule is one failed attempt, like a broken model
            return Ticket.completed(t0, None, f"{type(e).__name__}: {e}", self._clock())
        scores = [0.0] * len(Action)
        scores[int(action if action is not None else Action.CONTINUE)] = 1.0
        self.runs += 1
        return Ticket.completed(t0, scores, None, self._clock())

    def stop(self) -> None:
        return None

    def status(self) -> RuleBackendStatus:
        return {"name": self.name, "ready": True, "kind": "rule", "runs": self.runs}

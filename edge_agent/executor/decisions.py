"""Asking the policy: the decision rate, the one decision in flight, the decision journal.

`PolicyClient` asks the executor's `Policy` once per decision period while a task runs. An
`AsyncPolicy` (the inference router, which may wait on a remote backend) is never waited for:
`begin` starts a decision, the next ticks `poll` it, and its answer is applied when it comes —
to the attempt it was asked for, or dropped (`stale_decisions`) if that attempt has ended. While
one is in flight the next decision slots are skipped. A policy that raises gives no decision.
What the answer does (advance, retry, abort, re-grasp) is the `TaskDriver`'s business.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from edge_agent.executor.context import DecisionRecord
from edge_agent.executor.records import Counters
from edge_agent.policy_seam import Action, AsyncPolicy, Observation, PendingDecision, Policy


@dataclass(frozen=True, slots=True)
class Decision:
    """A policy's answer, ready to apply: the observation it was asked with and the action
    (None: no decision — the policy failed or answered nothing usable)."""

    obs: Observation
    action: Action | None


@dataclass(frozen=True, slots=True)
class _InFlight:
    pending: PendingDecision
    obs: Observation
    asked_for: object  # the attempt it was asked for (compared by identity)


class PolicyClient:
    """The executor's side of the policy seam (see the module doc)."""

    def __init__(self, policy: Policy, period_s: float, counters: Counters,
                 sink: Callable[[DecisionRecord], None] | None) -> None:
        self._period = period_s
        self._counters = counters
        self._sink = sink
        self._next = 0.0
        self._in_flight: _InFlight | None = None
        self._policy = policy
        self._async: AsyncPolicy | None = policy if isinstance(policy, AsyncPolicy) else None

    @property
    def policy(self) -> Policy:
        return self._policy

    @policy.setter
    def policy(self, policy: Policy) -> None:
        """Swap the policy (the daemon, once its router is ready); the next decision asks it."""
        self._policy = policy
        self._async = policy if isinstance(policy, AsyncPolicy) else None

    def decide_now(self, now: float) -> None:
        """A task starts or resumes: the first decision is due at once."""
        self._next = now

    def poll(self, attempt: object) -> Decision | None:
        """The decision in flight, if it is ready and still for `attempt`."""
        f = self._in_flight
        if f is None:
            return None
        if f.asked_for is not attempt:  # the attempt it was asked for is over
            self._in_flight = None
            self._counters.stale_decisions += 1
            return None
        try:
            done = f.pending.poll()
            action = f.pending.action if done else None
        except Exception:  # a broken backend is an inference failure, not a crash
            done, action = True, None
        if not done:
            return None
        self._in_flight = None
        return Decision(f.obs, action)

    def ask_if_due(self, now: float, attempt: object, observe: Callable[[], Observation]
                   ) -> Decision | None:
        """Ask for a decision when one is due (and none is in flight); the answer when it
        came at once, else None."""
        if now < self._next:
            return None
        self._next = now + self._period
        if self._in_flight is not None:
            return None  # the previous decision is still in flight: this slot is skipped
        obs = observe()
        if self._async is None:
            try:
                return Decision(obs, self._policy.decide(obs))
            except Exception:  # a broken policy is an inference failure, not a crash
                return Decision(obs, None)
        try:
            pending = self._async.begin(obs)
            if pending.poll():
                return Decision(obs, pending.action)
        except Exception:
            return Decision(obs, None)
        self._in_flight = _InFlight(pending, obs, attempt)
        return None

    def journal(self, now: float, obs: Observation, action: Action | None,
                accepted: bool) -> None:
        """One decision for the decision sink (the journal), with whether it was accepted."""
        if self._sink is not None:
            self._sink({"t": now, "state": obs.state.value, "observation": obs.vector,
                        "action": action.name.lower() if action is not None else None,
                        "accepted": accepted})

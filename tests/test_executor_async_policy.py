"""A policy that answers later (the inference router with a remote backend) never blocks a tick.

The executor asks `begin(obs)`; a decision still in flight is polled on the next ticks and
applied when it comes. Here the expert's answer arrives only after a few ticks — as a Triton
round trip would at 200 Hz — and the pick-and-place task still succeeds on the lock-step rig.
"""

from __future__ import annotations

from edge_agent.executor.policy import ExpertPolicy
from edge_agent.policy_seam import Action, Observation
from edge_agent.robot import load_robot
from hil.episodes import DEFAULT_ROBOT, run_episode

ROBOT = load_robot(DEFAULT_ROBOT)


class _Late:
    """One decision that is done after `after` polls (the router's PendingDecision shape)."""

    def __init__(self, owner: LatePolicy, action: Action | None, after: int) -> None:
        self.owner, self.answer, self.left = owner, action, after
        self.action: Action | None = None
        self.done = False

    def poll(self) -> bool:
        self.owner.polls += 1
        if not self.done:
            if self.left <= 0:
                self.done, self.action = True, self.answer
            self.left -= 1
        return self.done


class LatePolicy:
    def __init__(self, after: int) -> None:
        self.expert = ExpertPolicy()
        self.after = after
        self.begun = self.polls = 0
        self.in_flight: _Late | None = None
        self.overlapped = 0

    def begin(self, obs: Observation) -> _Late:
        if self.in_flight is not None and not self.in_flight.done:
            self.overlapped += 1  # the executor must not start a second one meanwhile
        self.begun += 1
        self.in_flight = _Late(self, self.expert.decide(obs), self.after)
        return self.in_flight

    def decide(self, obs: Observation) -> Action | None:  # the Policy protocol; unused here
        raise AssertionError("the executor must use begin() when the policy has it")


def test_late_answers_are_polled_on_later_ticks_and_the_task_still_succeeds() -> None:
    policy = LatePolicy(after=3)  # answered on the 4th poll: ~15 ms at 200 Hz
    r = run_episode(ROBOT, 4242, policy=policy)
    assert r.success, r
    assert policy.begun > 20
    assert policy.polls >= 4 * policy.begun - 4  # each one polled until it was done
    assert policy.overlapped == 0


def test_an_immediate_answer_is_applied_in_the_same_tick() -> None:
    policy = LatePolicy(after=0)
    r = run_episode(ROBOT, 4243, policy=policy)
    assert r.success, r
    assert policy.polls == policy.begun

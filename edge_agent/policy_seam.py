"""The policy seam: what the executor asks a policy and what a policy answers, below both.

Every decision tick the executor builds one `Observation` (a fixed-layout float vector, fields
and units in `OBS_FIELDS`, filled by name through `OBS_INDEX`) and asks a `Policy` for an
`Action`. A policy answers now (`Policy.decide`) or, when it may have to wait for a remote
backend, starts a `PendingDecision` (`AsyncPolicy.begin`) that the control thread polls once per
tick without blocking. The same vector is what a trained ONNX policy consumes: it outputs one
score per `Action` in enum order, and `action_from_scores` maps them back, NaN meaning "no
decision". The executor (executor/) and the inference layer (inference/) both import this module;
it imports only the vocabulary.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import IntEnum
from typing import Protocol, runtime_checkable

from edge_agent.vocab import State


class Action(IntEnum):
    """The policy's discrete actions; the integer is the index of an ONNX model's output."""

    CONTINUE = 0  # keep the current controller
    ADVANCE = 1  # move to the next state (accepted only when the sub-goal's guard holds)
    RETRY_ALTERNATIVE = 2  # give up this attempt now and retry with the next alternative
    ABORT = 3  # controlled hold, task aborted (always accepted)


@dataclass(frozen=True, slots=True)
class ObsField:
    name: str
    unit: str
    doc: str


POLICY_STATES = (State.APPROACH, State.GRASP, State.LIFT, State.TRANSFER, State.RELEASE,
                 State.RETREAT)
OBS_FIELDS: tuple[ObsField, ...] = (
    *(ObsField(f"state_{s.value}", "1", f"one-hot: the running state is {s.value}")
      for s in POLICY_STATES),
    ObsField("attempt_elapsed_s", "s", "time since the running attempt started"),
    ObsField("attempt_elapsed_frac", "1", "attempt_elapsed_s / the state's L1 timeout"),
    ObsField("attempt_index", "1", "0 for the first attempt of the sub-goal, 1, 2 for retries"),
    ObsField("tool_err_m", "m", "distance of the tool centre to the state's final target "
             "(0 in gripper states)"),
    ObsField("tool_err_tol", "1", "tool_err_m / tool_tolerance_m, capped at 100"),
    ObsField("joint_speed_rad_s", "rad/s", "largest measured |joint velocity|"),
    ObsField("gripper_opening_m", "m", "finger opening"),
    ObsField("gripper_speed_m_s", "m/s", "finger opening rate over the last decision period"),
    ObsField("grip_force_n", "N", "measured grip force"),
    ObsField("grip_force_err_n", "N", "grip_force_n - the grip force target"),
    ObsField("grip_force_rate_n_s", "N/s", "grip force rate over the last decision period"),
    ObsField("grip_in_band_s", "s", "how long the grip force has been inside the band"),
    ObsField("gripper_limit_frac", "1", "the attempt's finger current limit / current_max_a"),
    ObsField("gripper_current_of_limit", "1", "measured finger current / the attempt's limit"),
    ObsField("subgoal_met", "1", "1 when the state's guard holds now, else 0"),
    ObsField("predicted", "1", "1 when a channel this state uses is Kalman-predicted"),
    ObsField("l3_frac", "1", "consecutive failed attempts / the L3 threshold"),
    ObsField("part_lost_hold", "1", "1 while the task holds after a lost part (the re-grasp "
             "window), else 0"),
    ObsField("part_lost_elapsed_frac", "1", "time in the re-grasp window / regrasp_window_s "
             "(0 outside it)"),
    ObsField("regrasp_ok", "1", "1 when the machine's re-grasp guard holds now (the lost part "
             "seen at rest, reachable, budgets left), else 0"),
)
OBS_INDEX = {f.name: i for i, f in enumerate(OBS_FIELDS)}
OBS_DIM = len(OBS_FIELDS)
_N_MEASURED = OBS_DIM - len(POLICY_STATES)  # every field but the one-hot state


@dataclass(frozen=True, slots=True)
class Observation:
    """One decision's input: the vector plus the state it was built in."""

    state: State
    vector: tuple[float, ...]

    @classmethod
    def of(cls, state: State, fields: Mapping[str, float]) -> Observation:
        """Fill the vector by name: the one-hot of `state` and every other field of `OBS_FIELDS`
        from `fields` (KeyError for an unknown name, ValueError when one is missing)."""
        v = [0.0] * OBS_DIM
        if state in POLICY_STATES:
            v[OBS_INDEX[f"state_{state.value}"]] = 1.0
        for name, x in fields.items():
            v[OBS_INDEX[name]] = x
        if len(fields) != _N_MEASURED:
            missing = [f.name for f in OBS_FIELDS[len(POLICY_STATES):] if f.name not in fields]
            raise ValueError(f"observation fields missing: {missing}")
        return cls(state, tuple(v))

    def get(self, name: str) -> float:
        return self.vector[OBS_INDEX[name]]

    def as_dict(self) -> dict[str, float]:
        return {f.name: v for f, v in zip(OBS_FIELDS, self.vector, strict=True)}


class Policy(Protocol):
    """Proposes an action per decision tick; None means no decision (counted as a failure)."""

    def decide(self, obs: Observation) -> Action | None: ...


class PendingDecision(Protocol):
    """One decision in flight: `poll()` advances it without blocking and says whether it is
    decided; then `action` is the answer (None: no decision)."""

    @property
    def action(self) -> Action | None: ...

    def poll(self) -> bool: ...


@runtime_checkable
class AsyncPolicy(Policy, Protocol):
    """A policy that may wait on a remote backend: the executor never waits for it, it
    `begin`s a decision and polls it on the next ticks (the inference router is one)."""

    def begin(self, obs: Observation) -> PendingDecision: ...


def action_from_scores(scores: Sequence[float]) -> Action | None:
    """Argmax over one score per Action; None when any score is NaN or the length is wrong."""
    if len(scores) != len(Action):
        return None
    best, best_i = -math.inf, -1
    for i, s in enumerate(scores):
        if s != s:  # NaN
            return None
        if s > best:
            best, best_i = s, i
    return Action(best_i) if best_i >= 0 else None

"""The policy seam: the observation vector, the discrete actions, a rule-based expert, a baseline.

Every decision tick the executor builds one `Observation` (a fixed-layout float vector, fields
and units in `OBS_FIELDS`) and asks a `Policy` for an `Action`. The same vector is what a trained
ONNX policy consumes (inference/ wraps it behind this protocol; the executor never imports
onnxruntime): an ONNX policy outputs one score per `Action` in enum order, and
`action_from_scores` maps them back, NaN meaning "no decision". `ExpertPolicy` is the reference
expert that generates training data; `AlwaysAdvancePolicy` is the trivial baseline.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from enum import IntEnum
from typing import Protocol

from edge_agent.executor.tasks import State


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
_I_ELAPSED = OBS_INDEX["attempt_elapsed_s"]
_I_SPEED = OBS_INDEX["gripper_speed_m_s"]
_I_FORCE = OBS_INDEX["grip_force_n"]
_I_FERR = OBS_INDEX["grip_force_err_n"]
_I_FRATE = OBS_INDEX["grip_force_rate_n_s"]
_I_MET = OBS_INDEX["subgoal_met"]
_I_AT_LIMIT = OBS_INDEX["gripper_current_of_limit"]
_I_LOST = OBS_INDEX["part_lost_hold"]
_I_REGRASP_OK = OBS_INDEX["regrasp_ok"]


@dataclass(frozen=True, slots=True)
class Observation:
    """One decision's input: the vector plus the state it was built in."""

    state: State
    vector: tuple[float, ...]

    def get(self, name: str) -> float:
        return self.vector[OBS_INDEX[name]]

    def as_dict(self) -> dict[str, float]:
        return {f.name: v for f, v in zip(OBS_FIELDS, self.vector, strict=True)}


class Policy(Protocol):
    """Proposes an action per decision tick; None means no decision (counted as a failure)."""

    def decide(self, obs: Observation) -> Action | None: ...


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


@dataclass(frozen=True, slots=True)
class ExpertPolicy:
    """Rule-based reference expert: advance when the sub-goal holds, give up a stalled grip early,
    re-grasp a dropped part once the machine would accept it.

    A grip in contact whose force is below the band while the finger motor already draws its
    current limit, and no longer rises, cannot reach the band at this limit: proposing
    `retry_alternative` starts the next alternative (a higher limit) without waiting for the
    L1 timeout. In the hold after a lost part, `retry_alternative` (re-grasp) is proposed as
    soon as `regrasp_ok` says the part lies still within reach; until then the expert waits
    (`continue`), and the window running out fails the task.
    """

    stall_after_s: float = 0.3
    contact_force_n: float = 1.0
    stall_rate_n_s: float = 2.0
    at_limit: float = 0.9
    band_n: float = 1.0

    def decide(self, obs: Observation) -> Action | None:
        v = obs.vector
        if v[_I_LOST] >= 0.5:
            return Action.RETRY_ALTERNATIVE if v[_I_REGRASP_OK] >= 0.5 else Action.CONTINUE
        if v[_I_MET] >= 0.5:
            return Action.ADVANCE
        if (obs.state is State.GRASP and v[_I_ELAPSED] >= self.stall_after_s
                and v[_I_FORCE] >= self.contact_force_n and v[_I_FERR] < -self.band_n
                and v[_I_AT_LIMIT] >= self.at_limit and abs(v[_I_FRATE]) < self.stall_rate_n_s
                and abs(v[_I_SPEED]) < 1e-3):
            return Action.RETRY_ALTERNATIVE
        return Action.CONTINUE


class AlwaysAdvancePolicy:
    """Baseline: always propose `advance`; the guards alone decide (refusals are counted)."""

    def decide(self, obs: Observation) -> Action | None:
        return Action.ADVANCE

"""The executor's own policies: the rule-based expert and the always-advance baseline.

Both answer the `policy_seam.Policy` protocol (the observation layout, the actions and the
asynchronous decision are declared there, below the executor and the inference layer). The
expert is the reference that generates training data and the router's last-resort backend;
`AlwaysAdvancePolicy` is the trivial baseline.
"""

from __future__ import annotations

from dataclasses import dataclass

from edge_agent.policy_seam import OBS_INDEX, Action, Observation
from edge_agent.vocab import State

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

"""The policy's observation of the running attempt, filled field by field by name. Pure.

The layout, units and meaning of every field are `policy_seam.OBS_FIELDS`; `observe` computes
each one from the attempt, the measurement and the controllers, and `Observation.of` places it
by name (a field missing or misnamed here is an error, not a silent zero).
"""

from __future__ import annotations

from edge_agent.executor.controllers import Measured
from edge_agent.executor.faults import FaultPolicy
from edge_agent.executor.records import Attempt
from edge_agent.executor.state_control import StateControl
from edge_agent.executor.tasks import ExecutorConfig, State
from edge_agent.policy_seam import Observation


def observe(now: float, m: Measured, state: State, att: Attempt,
            prev: tuple[float, float, float], control: StateControl, cfg: ExecutorConfig,
            current_max_a: float, faults: FaultPolicy, *, subgoal_met: bool, predicted: bool,
            regrasp_ok: bool) -> Observation:
    """The observation at `now`; `prev` is (t, gripper opening, grip force) at the previous
    decision (the rates are taken over that span)."""
    elapsed = now - att.started
    err = control.goal_error(m)
    t0, pos0, f0 = prev
    span = now - t0
    limit = control.grip_limit_a
    lost_at = att.part_lost_at
    return Observation.of(state, {
        "attempt_elapsed_s": elapsed,
        "attempt_elapsed_frac": elapsed / att.timeout_s,
        "attempt_index": float(att.number - 1),
        "tool_err_m": err,
        "tool_err_tol": min(100.0, err / cfg.tool_tolerance_m),
        "joint_speed_rad_s": m.joint_speed,
        "gripper_opening_m": m.gripper_pos,
        "gripper_speed_m_s": (m.gripper_pos - pos0) / span if span > 0 else 0.0,
        "grip_force_n": m.gripper_force,
        "grip_force_err_n": m.gripper_force - cfg.grip_force_n,
        "grip_force_rate_n_s": (m.gripper_force - f0) / span if span > 0 else 0.0,
        "grip_in_band_s": now - att.in_band_since if att.in_band_since is not None else 0.0,
        "gripper_limit_frac": limit / current_max_a,
        "gripper_current_of_limit": m.gripper_current / limit,
        "subgoal_met": 1.0 if subgoal_met else 0.0,
        "predicted": 1.0 if predicted else 0.0,
        "l3_frac": faults.l3_count / faults.l3_threshold,
        "part_lost_hold": 1.0 if lost_at is not None else 0.0,
        "part_lost_elapsed_frac": ((now - lost_at) / cfg.regrasp_window_s
                                   if lost_at is not None else 0.0),
        "regrasp_ok": 1.0 if regrasp_ok else 0.0,
    })

"""The re-grasp after a lost part: the machine's guard on a policy's proposal. Pure.

A lost part (an extension of DESIGN.md's executor; models/README.md "Re-grasp"): the failed
attempt is counted as always (L3 + 1, PART_LOST has no L2 alternative), then instead of ending
the task at once the runner holds (joints hold, gripper holds, nothing moves) for
`regrasp_window_s` and keeps asking the policy. Only `retry_alternative` can continue the task,
and only when the machine's re-grasp guard holds (`TaskRunner.regrasp_verdict`, built from the
checks here): the camera sees the part lying still on the table since it was lost (fresh
samples taken after the loss), every point of the new task path is inside the workspace and
reachable, the fingers hold nothing, the lost sub-goal's attempt budget and the task's re-grasp
cap (`max_regrasps`) are not spent. Then the task restarts at the approach to the measured pose
— new sub-goals, counted as attempts as always. Refused proposals are counted
(`regrasp_refused`); any other proposal, no decision or the window running out ends the task
`failed` in a controlled hold, exactly as before.
"""

from __future__ import annotations

import math

from edge_agent.executor.controllers import Measured, Vec3
from edge_agent.executor.monitor import ObjectEstimate
from edge_agent.executor.tasks import ExecutorConfig


def regrasp_blocker(cfg: ExecutorConfig, m: Measured, *, regrasps: int, predicted: bool,
                    attempts_spent: str, l3_reached: bool) -> str:
    """Why the budgets or the arm forbid a re-grasp now ("" when they allow it).
    `attempts_spent` is the message when the lost sub-goal's attempts are spent, else ""."""
    if regrasps >= cfg.max_regrasps:
        return f"re-grasp cap reached ({regrasps} of {cfg.max_regrasps})"
    if attempts_spent:
        return attempts_spent
    if l3_reached:
        return "L3 threshold reached"
    if predicted:
        return "joint positions are predicted"
    if not (m.gripper_force < cfg.part_lost_force_n and math.isfinite(m.gripper_pos)):
        return "the fingers are not free (force on them, or no gripper reading)"
    return ""


def part_at_rest(cfg: ExecutorConfig, objects: ObjectEstimate, now: float, since: float,
                 table_z_m: float) -> tuple[Vec3 | None, str]:
    """The part's measured position when the camera has seen it lying still on the table from
    samples taken after `since` (host time) and the newest is fresh; else (None, why not)."""
    last = objects.last_arrival()
    if last is None or not now - last <= cfg.regrasp_pose_max_age_s:
        return None, "object pose stale"
    pose = objects.at_rest(since, cfg.regrasp_rest_samples, cfg.regrasp_rest_tol_m)
    if pose is None:
        return None, "object not seen at rest since the part was lost"
    if pose[2] - table_z_m > cfg.regrasp_max_height_m:
        return None, f"object {pose[2] - table_z_m:.3f} m above the table"
    return pose, ""

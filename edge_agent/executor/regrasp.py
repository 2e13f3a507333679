"""The re-grasp after a lost part: the machine's guard on a policy's proposal. Pure.

A lost part (an extension of DESIGN.md's executor; models/README.md "Re-grasp"): the failed
attempt is counted as always (L3 + 1, PART_LOST has no L2 alternative), then instead of ending
the task at once the driver holds (joints hold, gripper holds, nothing moves) for
`regrasp_window_s` and keeps asking the policy. Only `retry_alternative` can continue the task,
and only when the machine's re-grasp guard holds (`regrasp_target` below, which the driver's
`regrasp_verdict` caches per tick): the camera sees the part lying still on the table since it
was lost (fresh samples taken after the loss), every point of the new task path is inside the
workspace and reachable, the fingers hold nothing, the lost sub-goal's attempt budget and the
task's re-grasp cap (`max_regrasps`) are not spent. Then the task restarts at the approach to
the measured pose — new sub-goals, counted as attempts as always. Refused proposals are counted
(`regrasp_refused`); any other proposal, no decision or the window running out ends the task
`failed` in a controlled hold, exactly as before.
"""

from __future__ import annotations

import math

from edge_agent.executor.controllers import Measured, Vec3
from edge_agent.executor.faults import FaultPolicy
from edge_agent.executor.kinematics import ArmKinematics, IKFailure
from edge_agent.executor.monitor import ObjectEstimate
from edge_agent.executor.paths import task_points
from edge_agent.executor.records import Attempt, TaskProgress
from edge_agent.executor.tasks import ExecutorConfig, StateSpec
from edge_agent.robot import RobotDescription


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


class RegraspGuard:
    """The machine's re-grasp guard (`verdict`), evaluated at most once per tick."""

    def __init__(self, cfg: ExecutorConfig, robot: RobotDescription, kin: ArmKinematics) -> None:
        self._cfg = cfg
        self._kin = kin
        self._table_z_m = robot.table_z_m
        try:
            self._camera_latency_s = robot.sensor("object_pose").latency_s
        except KeyError:
            self._camera_latency_s = 0.0
        self._cache: tuple[float, Vec3 | None, str] | None = None

    def verdict(self, now: float, faults: FaultPolicy, task: TaskProgress | None,
                spec: StateSpec | None, att: Attempt | None, m: Measured | None, *,
                predicted: bool, objects: ObjectEstimate) -> tuple[Vec3 | None, str]:
        """(the part's measured position, "") when a re-grasp may start now, else (None, why
        not); the first answer at `now` is kept for the rest of the tick."""
        c = self._cache
        if c is not None and c[0] == now:
            return c[1], c[2]
        if task is None or spec is None or att is None or m is None or att.part_lost_at is None:
            target, why = None, "no lost part to re-grasp"
        else:
            target, why = regrasp_target(self._cfg, self._kin, faults, task, spec, att, m,
                                         now=now, predicted=predicted, objects=objects,
                                         camera_latency_s=self._camera_latency_s,
                                         table_z_m=self._table_z_m)
        self._cache = (now, target, why)
        return target, why


def regrasp_target(cfg: ExecutorConfig, kin: ArmKinematics, faults: FaultPolicy,
                   task: TaskProgress, spec: StateSpec, att: Attempt, m: Measured, *,
                   now: float, predicted: bool, objects: ObjectEstimate,
                   camera_latency_s: float, table_z_m: float) -> tuple[Vec3 | None, str]:
    """The machine's re-grasp guard for a part lost in attempt `att` at `spec`: (the part's
    measured position, "") when a re-grasp may start now, else (None, why not)."""
    if spec.regrasp_to is None:
        return None, f"a part lost in {spec.state.value} is not re-grasped"
    f = faults
    why = regrasp_blocker(cfg, m, regrasps=task.regrasps, predicted=predicted,
                          attempts_spent=(f"{spec.state.value}: {f.attempt} attempts spent"
                                          if f.attempt >= f.max_attempts else ""),
                          l3_reached=f.l3_count >= f.l3_threshold)
    if why:
        return None, why
    lost_at = att.part_lost_at
    assert lost_at is not None
    lost_since = att.low_force_since if att.low_force_since is not None else lost_at
    pose, why = part_at_rest(cfg, objects, now, lost_since + camera_latency_s, table_z_m)
    if pose is None:
        return None, why
    for pt in task_points(task.spec, pose, task.place_xyz, cfg):
        sol = kin.inverse(pt, q_seed=m.q)
        if isinstance(sol, IKFailure):
            return None, f"{sol.reason.value}: {sol.message}"
    return pose, ""

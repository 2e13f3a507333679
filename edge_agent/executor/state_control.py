"""The controllers of the running attempt: at most one tool path and one grip, and the command.

A motion state runs one deterministic controller (tasks.py `ControllerKind`): `StateControl`
builds it when an attempt starts — the tool path planned through IK with the alternative's gain
scale, the grip with the alternative's finger current limit (a retry closes again from the force
held now) — and composes the command frame every tick. A stop, a lost part or the end of the
task drops both; `hold` is the frame that moves nothing. `subgoal_met` is the guard on
`advance`, judged from the path, the grip and the measurement.
"""

from __future__ import annotations

from edge_agent.executor.controllers import (
    GripController,
    Measured,
    PathController,
    PathTuning,
    plan_path,
)
from edge_agent.executor.faults import gain_scale, gripper_current_limit
from edge_agent.executor.kinematics import ArmKinematics, IKFailure
from edge_agent.executor.paths import path_waypoints
from edge_agent.executor.records import Attempt, TaskProgress
from edge_agent.executor.tasks import (
    Alternative,
    ControllerKind,
    ExecutorConfig,
    GripperAction,
    StateSpec,
    SubGoal,
)
from edge_agent.link.codec import Command, GripperMode, Mode
from edge_agent.robot import RobotDescription

SETTLED_RAD_S = 0.05  # joints slower than this count as settled at a target


class StateControl:
    """The path and grip controllers of the running attempt (see the module doc)."""

    def __init__(self, robot: RobotDescription, kin: ArmKinematics, cfg: ExecutorConfig) -> None:
        self._robot = robot
        self._kin = kin
        self._cfg = cfg
        self._tuning = PathTuning(speed_fraction=cfg.speed_fraction,
                                  waypoint_tolerance_m=cfg.waypoint_tolerance_m)
        g = robot.gripper
        self._open_cmd = (GripperMode.POSITION, g.stroke_max_m, g.current_nominal_a)
        self.open_min_m = g.stroke_max_m - cfg.gripper_open_margin_m  # "opened" from here on
        self.path: PathController | None = None
        self.grip: GripController | None = None

    def start(self, spec: StateSpec, m: Measured, task: TaskProgress,
              alt: Alternative | None) -> IKFailure | None:
        """Build the controllers of a new attempt at `spec`; the IK failure when its path cannot
        be planned. Records the grip's current limit in `task`."""
        self.path = None
        cfg = self._cfg
        if spec.controller is ControllerKind.JOINT_POSITION:
            plan = plan_path(self._kin, m.q, m.tool_xyz,
                             path_waypoints(spec.path, task.object_xyz, task.place_xyz, cfg),
                             cfg.path_step_m)
            if isinstance(plan, IKFailure):
                return plan
            self.path = PathController(self._robot, plan, self._tuning, gain_scale(alt))
            self.path.start(m.q)
        if spec.controller is ControllerKind.GRIPPER_FORCE:
            g = self._robot.gripper
            limit = gripper_current_limit(alt, g.current_nominal_a, g.current_max_a)
            retry = self.grip is not None
            self.grip = GripController(self._robot, cfg.grip_force_n, limit)
            if retry and m.gripper_force >= self.grip.tuning.contact_force_n:
                # Close again from the force held now, not from the bare target: lowering the
                # setpoint first would loosen the grip the retry is meant to strengthen.
                self.grip.start_bumpless(m.gripper_current, m.gripper_force)
            task.grip_limit_a = limit
        elif spec.gripper is GripperAction.OPEN:
            self.grip = None
            task.grip_limit_a = None
        return None

    def hold_grip(self, m: Measured, limit_a: float | None) -> float:
        """Carry on gripping from the force held now (a resume while carrying), at `limit_a`
        (None: the nominal limit); the limit applied."""
        self.grip = GripController(self._robot, self._cfg.grip_force_n,
                                   limit_a if limit_a is not None
                                   else self._robot.gripper.current_nominal_a)
        self.grip.start_bumpless(m.gripper_current, m.gripper_force)
        return self.grip.current_limit_a

    def subgoal_met(self, spec: StateSpec, att: Attempt, m: Measured, now: float) -> bool:
        """The guard of `advance`: the sub-goal of `spec` holds now (never in a re-grasp hold)."""
        c, sg, p = self._cfg, spec.sub_goal, self.path
        if att.part_lost_at is not None:
            return False
        if sg is SubGoal.GRIP_IN_BAND:
            return att.in_band_since is not None and now - att.in_band_since >= c.grip_dwell_s
        if sg is SubGoal.GRIPPER_OPENED:
            return m.gripper_pos >= self.open_min_m and m.gripper_force <= c.released_force_n
        if p is None or not p.at_last_point or m.joint_speed > SETTLED_RAD_S:
            return False
        if p.goal_error(m) > c.tool_tolerance_m:
            return False
        if sg is SubGoal.TOOL_AT_TARGET:
            return m.gripper_pos >= self.open_min_m
        if sg is SubGoal.CARRY_AT_TARGET:
            return m.gripper_force >= c.part_lost_force_n
        return True

    def drop(self) -> None:
        """Forget every setpoint and integrator (a stop, a lost part, the task's end)."""
        self.path = None
        self.grip = None

    def goal_error(self, m: Measured) -> float:
        """The tool's distance to the path's final target (0 without a path)."""
        return self.path.goal_error(m) if self.path is not None else 0.0

    @property
    def grip_limit_a(self) -> float:
        """The finger current limit of the grip (the nominal one without a grip)."""
        return self.grip.current_limit_a if self.grip else self._robot.gripper.current_nominal_a

    def compose(self, spec: StateSpec, m: Measured, dt: float) -> Command:
        """This tick's command frame for a state running `spec`."""
        if self.path is not None:
            mode, q = Mode.POSITION, self.path.update(m, dt)
        else:
            mode, q = Mode.HOLD, m.q
        if spec.gripper is GripperAction.OPEN:
            return Command(mode, q, *self._open_cmd)
        if self.grip is not None:
            return Command(mode, q, GripperMode.FORCE, self.grip.update(m.gripper_force, dt),
                           self.grip.current_limit_a)
        return Command(mode, q, GripperMode.HOLD, 0.0, 0.0)

    def hold(self, m: Measured | None) -> Command:
        """Joints hold the measured position; the gripper keeps its opening and force."""
        q = m.q if m is not None else self._robot.home
        return Command(Mode.HOLD, q, GripperMode.HOLD, 0.0, 0.0)

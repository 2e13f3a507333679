"""The pick-and-place task as data: states, sub-goals, L1 timeouts, controllers, L2 alternatives.

Nothing here runs: `machine.py` builds the `transitions` machine from these tables, `driver.py`
walks them, `faults.py` applies the attempt budget. The states themselves are vocabulary
(`vocab.State`, re-exported here). Changing the task (a new state, another alternative, a
different timeout) is a change to these tables and `ExecutorConfig`, not to code.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from types import MappingProxyType

from edge_agent.vocab import State as State  # the machine's states are vocabulary (vocab.py)


class ControllerKind(StrEnum):
    """The one deterministic controller a state runs."""

    HOLD = "hold"  # joints hold the measured position
    JOINT_POSITION = "joint_position"  # position PID in joint space toward IK targets
    GRIPPER_FORCE = "gripper_force"  # force PID on the gripper, joints hold
    GRIPPER_OPEN = "gripper_open"  # gripper position to fully open, joints hold
    JOG = "jog"  # manual velocity jog


class SubGoal(StrEnum):
    """What must hold for `advance` to be accepted (the transition's guard)."""

    TOOL_AT_TARGET = "tool_at_target"  # tool error < tool_tolerance_m, gripper open
    GRIP_IN_BAND = "grip_in_band"  # grip force within grip_force_n ± band for grip_dwell_s
    CARRY_AT_TARGET = "carry_at_target"  # tool at target and the part still gripped
    GRIPPER_OPENED = "gripper_opened"  # fingers open and no force left
    TOOL_CLEAR = "tool_clear"  # tool at the retreat target


class Precondition(StrEnum):
    """What `resume` rechecks before re-entering an interrupted state."""

    NONE = "none"
    PART_GRIPPED = "part_gripped"


class PathKind(StrEnum):
    """Which tool path a motion state follows (see `executor.plan`)."""

    NONE = "none"
    TO_GRASP = "to_grasp"  # above the object, then straight down to it
    LIFT = "lift"  # straight up from the object
    TO_PLACE = "to_place"  # over to above the place pose, then down to it
    RETREAT = "retreat"  # straight up from the place pose


class GripperAction(StrEnum):
    """What the gripper does while a state runs."""

    OPEN = "open"  # position: fully open
    GRIP = "grip"  # force: hold the part at the grip force


class FailureKind(StrEnum):
    """Why an attempt failed (the key of the alternatives table)."""

    NOT_CONVERGED = "not_converged"  # tool did not reach its target in time
    GRIP_WEAK = "grip_weak"  # grip force stayed below the band
    GRIP_STRONG = "grip_strong"  # grip force above the band
    PART_LOST = "part_lost"  # the gripped part is gone
    NOT_RELEASED = "not_released"  # the fingers did not open / force did not drop
    POLICY_RETRY = "policy_retry"  # the policy asked for retry_alternative, nothing measured


class AltKind(StrEnum):
    """An L2 alternative: a change applied for one attempt and undone afterwards."""

    RETRY = "retry"  # the same settings again
    RAISE_GRIPPER_CURRENT = "raise_gripper_current"  # value: factor on the nominal current
    SCALE_GAINS = "scale_gains"  # value: factor on the joint PID gains (and speed)


@dataclass(frozen=True, slots=True)
class Alternative:
    kind: AltKind
    value: float = 1.0

    @property
    def name(self) -> str:
        if self.kind is AltKind.RETRY:
            return self.kind.value
        return f"{self.kind.value}x{self.value:g}"


@dataclass(frozen=True, slots=True)
class StateSpec:
    """One motion state of a task."""

    state: State
    controller: ControllerKind
    sub_goal: SubGoal
    timeout_s: float  # L1 default; ExecutorConfig.l1_timeouts_s overrides
    next: State
    path: PathKind
    gripper: GripperAction
    precondition: Precondition
    alternatives: Mapping[FailureKind, tuple[Alternative, ...]]
    # A part lost in this state may be re-grasped from this state (a policy proposal the
    # machine's guard must accept, never an L2 rule); None: a lost part fails the task.
    regrasp_to: State | None = None

    def alternatives_for(self, kind: FailureKind) -> tuple[Alternative, ...]:
        return self.alternatives.get(kind, ())


@dataclass(frozen=True, slots=True)
class TaskSpec:
    name: str
    states: tuple[StateSpec, ...]

    @property
    def first(self) -> State:
        return self.states[0].state

    def spec(self, state: State) -> StateSpec:
        for s in self.states:
            if s.state is state:
                return s
        raise KeyError(state)

    def has(self, state: State) -> bool:
        return any(s.state is state for s in self.states)


def _alts(table: Mapping[FailureKind, tuple[Alternative, ...]]
          ) -> Mapping[FailureKind, tuple[Alternative, ...]]:
    return MappingProxyType(dict(table))


_SLOWER = (Alternative(AltKind.SCALE_GAINS, 0.5), Alternative(AltKind.SCALE_GAINS, 0.25))
_RETRY = (Alternative(AltKind.RETRY),)
# Grip: the k-th failed close raises the finger current limit (capped by the description).
_STRONGER = (Alternative(AltKind.RAISE_GRIPPER_CURRENT, 1.5),
             Alternative(AltKind.RAISE_GRIPPER_CURRENT, 2.5))

PICK_PLACE = TaskSpec("pick_place", (
    StateSpec(State.APPROACH, ControllerKind.JOINT_POSITION, SubGoal.TOOL_AT_TARGET, 6.0,
              State.GRASP, PathKind.TO_GRASP, GripperAction.OPEN, Precondition.NONE,
              _alts({FailureKind.NOT_CONVERGED: _SLOWER, FailureKind.POLICY_RETRY: _SLOWER})),
    StateSpec(State.GRASP, ControllerKind.GRIPPER_FORCE, SubGoal.GRIP_IN_BAND, 2.0,
              State.LIFT, PathKind.NONE, GripperAction.GRIP, Precondition.NONE,
              _alts({FailureKind.GRIP_WEAK: _STRONGER, FailureKind.POLICY_RETRY: _STRONGER,
                     FailureKind.GRIP_STRONG: _RETRY})),
    StateSpec(State.LIFT, ControllerKind.JOINT_POSITION, SubGoal.CARRY_AT_TARGET, 4.0,
              State.TRANSFER, PathKind.LIFT, GripperAction.GRIP, Precondition.PART_GRIPPED,
              _alts({FailureKind.NOT_CONVERGED: _SLOWER, FailureKind.POLICY_RETRY: _SLOWER}),
              regrasp_to=State.APPROACH),
    StateSpec(State.TRANSFER, ControllerKind.JOINT_POSITION, SubGoal.CARRY_AT_TARGET, 6.0,
              State.RELEASE, PathKind.TO_PLACE, GripperAction.GRIP, Precondition.PART_GRIPPED,
              _alts({FailureKind.NOT_CONVERGED: _SLOWER, FailureKind.POLICY_RETRY: _SLOWER}),
              regrasp_to=State.APPROACH),
    StateSpec(State.RELEASE, ControllerKind.GRIPPER_OPEN, SubGoal.GRIPPER_OPENED, 1.5,
              State.RETREAT, PathKind.NONE, GripperAction.OPEN, Precondition.NONE,
              _alts({FailureKind.NOT_RELEASED: _RETRY, FailureKind.POLICY_RETRY: _RETRY})),
    StateSpec(State.RETREAT, ControllerKind.JOINT_POSITION, SubGoal.TOOL_CLEAR, 4.0,
              State.IDLE, PathKind.RETREAT, GripperAction.OPEN, Precondition.NONE,
              _alts({FailureKind.NOT_CONVERGED: _SLOWER, FailureKind.POLICY_RETRY: _SLOWER})),
))
# PART_LOST has no alternative on purpose: a part that fell is not picked up again blindly. The
# rules never re-grasp; after a lost part the executor holds for `regrasp_window_s`, and only a
# policy's `retry_alternative` that the re-grasp guard accepts (the camera sees the part at rest,
# reachable, budgets left: driver.TaskDriver.regrasp_allowed) goes back to `regrasp_to`.

TASKS: Mapping[str, TaskSpec] = MappingProxyType({PICK_PLACE.name: PICK_PLACE})
MOTION_STATES = frozenset(s.state for s in PICK_PLACE.states)


def _default_timeouts() -> Mapping[str, float]:
    return MappingProxyType({s.state.value: s.timeout_s for s in PICK_PLACE.states})


@dataclass(frozen=True, slots=True)
class ExecutorConfig:
    """Numbers of the executor: sub-goals, timeouts, budgets, thresholds. SI units."""

    tool_tolerance_m: float = 0.002  # sub-goal: tool error at the final target
    waypoint_tolerance_m: float = 0.010  # passing an intermediate waypoint
    # 10 N (not 5 N): the rig's weak_close severity ranges are defined for a 10 N grasp target
    # (recoverable = fails at the nominal finger current, succeeds at the maximum).
    grip_force_n: float = 10.0
    grip_force_band_n: float = 1.0
    grip_dwell_s: float = 0.10  # force inside the band this long before the grip counts
    part_lost_force_n: float = 3.0  # below this while carrying, the part is gone
    released_force_n: float = 1.0
    gripper_open_margin_m: float = 0.004  # "open" = within this of stroke_max
    l1_timeouts_s: Mapping[str, float] = field(default_factory=_default_timeouts)
    max_attempts: int = 3
    l3_threshold: int = 5
    collision_current_factor: float = 1.5
    # expected current never below this × current_max_a: 0.5 keeps the start of a loaded
    # transfer (seen at 45 % of the elbow's limit on the pty rig) from reading as a collision,
    # while a table hit (95 %) still trips at 1.5 × 0.5 = 75 %
    collision_floor_fraction: float = 0.5
    collision_baseline_tau_s: float = 0.5
    collision_persist_s: float = 0.02
    decision_hz: float = 20.0
    diagnostic_window_s: float = 5.0
    diagnostic_sample_hz: float = 50.0
    approach_clearance_m: float = 0.08
    lift_height_m: float = 0.10
    retreat_height_m: float = 0.08
    path_step_m: float = 0.01  # straight segments near the part are solved every this long
    place_press_m: float = 0.003  # place this much below the pick height: set down, not dropped
    default_place_xy_m: tuple[float, float] = (0.30, -0.30)
    speed_fraction: float = 0.6  # task motion at this fraction of the joint speed limits
    manual_speed_fraction: float = 0.25
    manual_cartesian_speed_m_s: float = 0.05
    jog_ttl_max_ms: int = 200
    jog_loss_trips: bool = True  # a moving jog stream that expires is a protective stop
    # After a lost part: hold this long for the policy's re-grasp proposal (0: fail at once).
    regrasp_window_s: float = 0.5
    max_regrasps: int = 1  # re-grasps per task
    # The re-grasp guard's "at rest": at least this many camera samples taken after the part
    # was lost, each within regrasp_rest_tol_m of their mean (the camera's noise is ~2 mm per
    # axis), the newest no older than regrasp_pose_max_age_s, the part's centre at most
    # regrasp_max_height_m above the table.
    regrasp_rest_samples: int = 6
    regrasp_rest_tol_m: float = 0.010
    regrasp_pose_max_age_s: float = 0.15
    regrasp_max_height_m: float = 0.05

    def timeout(self, state: State, default: float) -> float:
        return float(self.l1_timeouts_s.get(state.value, default))

    def check(self) -> ExecutorConfig:
        """Raise ValueError naming the first bad value; returns self."""
        positive = ("tool_tolerance_m", "waypoint_tolerance_m", "grip_force_n",
                    "grip_force_band_n", "collision_current_factor", "decision_hz",
                    "diagnostic_window_s", "diagnostic_sample_hz", "path_step_m",
                    "speed_fraction", "manual_speed_fraction", "manual_cartesian_speed_m_s")
        for name in positive:
            if not getattr(self, name) > 0:
                raise ValueError(f"executor.{name} must be > 0, got {getattr(self, name)}")
        for name in ("regrasp_rest_tol_m", "regrasp_pose_max_age_s", "regrasp_max_height_m"):
            if not getattr(self, name) > 0:
                raise ValueError(f"executor.{name} must be > 0, got {getattr(self, name)}")
        if not (self.regrasp_window_s >= 0 and math.isfinite(self.regrasp_window_s)):
            raise ValueError(f"executor.regrasp_window_s must be a finite number >= 0, got "
                             f"{self.regrasp_window_s}")
        if self.max_regrasps < 0 or self.regrasp_rest_samples < 1:
            raise ValueError("executor.max_regrasps must be >= 0 and "
                             "executor.regrasp_rest_samples >= 1")
        if self.max_attempts < 1 or self.l3_threshold < 1:
            raise ValueError("executor.max_attempts and executor.l3_threshold must be >= 1")
        if not 0 < self.jog_ttl_max_ms <= 200:
            raise ValueError("executor.jog_ttl_max_ms must be within 1..200")
        for k, v in self.l1_timeouts_s.items():
            if not v > 0:
                raise ValueError(f"executor.l1_timeouts_s.{k} must be > 0, got {v}")
        return self

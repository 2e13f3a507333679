"""The deterministic per-state controllers: tool paths in joint space, the grip, the release.

- `PathController` (approach, lift, transfer, retreat): a position PID in joint space
  (`pid.JointPositionController`) toward IK targets along a planned tool path. FREE segments go
  straight to the IK of their end point; LINEAR segments (near the part) are sampled every
  `path_step_m`, solved once at planning time, and followed with a carrot a little ahead of the
  tool, so the descent onto the part is a straight line rather than a joint-space arc.
- `GripController` (grasp, and kept alive while carrying): a force PID that trims the
  firmware's grip-force setpoint from the force sensor, inside the attempt's finger current
  limit. It trims only after contact (no wind-up while the fingers close through air) and can
  start bumplessly from the force the gripper holds now (resume after a stop).
- Release is a gripper position command (fully open) with the joints held.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum

from edge_agent.executor.kinematics import ArmKinematics, IKFailure
from edge_agent.executor.pid import PID, JointGains, JointPositionController
from edge_agent.robot import RobotDescription
from edge_agent.sensors.readings import Snapshot, Source

Vec3 = tuple[float, float, float]
_NAN = float("nan")


@dataclass(frozen=True, slots=True)
class Measured:
    """What the controllers read from one sensor snapshot (tool = FK of the measured q)."""

    q: tuple[float, ...]
    dq: tuple[float, ...]
    current: tuple[float, ...]
    gripper_pos: float
    gripper_force: float
    gripper_current: float
    tool: tuple[float, float, float, float]

    @property
    def tool_xyz(self) -> Vec3:
        return (self.tool[0], self.tool[1], self.tool[2])

    @property
    def joint_speed(self) -> float:
        return max(abs(v) for v in self.dq) if self.dq else 0.0


def measure(kin: ArmKinematics, snap: Snapshot) -> Measured | None:
    """The controllers' view of a SensorHub snapshot; None when the joint positions are unusable
    (never received, not finite, or stale past their prediction bound)."""
    q = snap.q
    n = len(kin.lower)
    if len(q) != n or snap.q_source is Source.STALE or not all(math.isfinite(v) for v in q):
        return None
    dq = snap.dq if len(snap.dq) == n else (0.0,) * n
    cur = snap.currents if len(snap.currents) == n else (_NAN,) * n
    gp, gf, gc = snap.gripper_pos, snap.gripper_force, snap.gripper_current
    return Measured(q, dq, cur, _NAN if gp is None else gp, _NAN if gf is None else gf,
                    _NAN if gc is None else gc, kin.forward(q))


class SegmentKind(Enum):
    FREE = "free"
    LINEAR = "linear"


@dataclass(frozen=True, slots=True)
class Segment:
    kind: SegmentKind
    end: Vec3
    points: tuple[Vec3, ...]  # LINEAR: samples along the line, the end included; FREE: (end,)
    qs: tuple[tuple[float, ...], ...]  # IK of every point


@dataclass(frozen=True, slots=True)
class PathPlan:
    segments: tuple[Segment, ...]

    @property
    def goal(self) -> Vec3:
        return self.segments[-1].end

    @property
    def goal_q(self) -> tuple[float, ...]:
        return self.segments[-1].qs[-1]


def plan_path(kin: ArmKinematics, start_q: Sequence[float], start_xyz: Vec3,
              waypoints: Sequence[tuple[SegmentKind, Vec3]], step_m: float
              ) -> PathPlan | IKFailure:
    """Solve the IK of every point of a path (tool pointing down); the first failure is returned."""
    seed = tuple(start_q)
    here = start_xyz
    segments: list[Segment] = []
    for kind, end in waypoints:
        if kind is SegmentKind.LINEAR:
            n = max(1, math.ceil(math.dist(here, end) / step_m))
            points = tuple(_lerp(here, end, (i + 1) / n) for i in range(n))
        else:
            points = (end,)
        qs: list[tuple[float, ...]] = []
        for p in points:
            sol = kin.inverse(p, q_seed=seed)
            if isinstance(sol, IKFailure):
                return sol
            qs.append(sol)
            seed = sol
        segments.append(Segment(kind, end, points, tuple(qs)))
        here = end
    return PathPlan(tuple(segments))


def _lerp(a: Vec3, b: Vec3, f: float) -> Vec3:
    return (a[0] + (b[0] - a[0]) * f, a[1] + (b[1] - a[1]) * f, a[2] + (b[2] - a[2]) * f)


@dataclass(frozen=True, slots=True)
class PathTuning:
    kp: float = 4.0  # setpoint velocity per rad of error (1/s)
    speed_fraction: float = 0.6  # of each joint's velocity limit
    lookahead_m: float = 0.015  # carrot distance ahead of the tool on LINEAR segments
    waypoint_tolerance_m: float = 0.010


class PathController:
    """Follows a PathPlan with a joint-space position PID; `update` gives the joint setpoint."""

    def __init__(self, robot: RobotDescription, plan: PathPlan, tuning: PathTuning,
                 gain_scale: float = 1.0) -> None:
        self.plan = plan
        self.tuning = tuning
        scale = max(0.05, min(1.0, gain_scale))
        self._jpc = JointPositionController(
            robot, JointGains(kp=tuning.kp * scale),
            speed_scale=max(0.01, min(1.0, tuning.speed_fraction * scale)))
        self._seg = 0
        self._idx = 0  # carrot index within the segment's points

    def start(self, q: Sequence[float]) -> tuple[float, ...]:
        """Begin from the measured pose, every integrator cleared."""
        self._seg = 0
        self._idx = 0
        return self._jpc.reset(q)

    @property
    def at_last_point(self) -> bool:
        seg = self.plan.segments
        return self._seg == len(seg) - 1 and self._idx == len(seg[-1].points) - 1

    def update(self, m: Measured, dt: float) -> tuple[float, ...]:
        segs = self.plan.segments
        tool = m.tool_xyz
        seg = segs[self._seg]
        tol = self.tuning.waypoint_tolerance_m
        # Move the carrot on: along a LINEAR segment while it is within the lookahead, and to
        # the next segment once the present one's end is reached.
        while True:
            last = len(seg.points) - 1
            if (seg.kind is SegmentKind.LINEAR and self._idx < last
                    and math.dist(tool, seg.points[self._idx]) < self.tuning.lookahead_m):
                self._idx += 1
                continue
            if (self._idx == last and self._seg < len(segs) - 1
                    and math.dist(tool, seg.end) < tol):
                self._seg += 1
                self._idx = 0
                seg = segs[self._seg]
                continue
            break
        return self._jpc.update(seg.qs[self._idx], m.q, dt)

    def goal_error(self, m: Measured) -> float:
        return math.dist(m.tool_xyz, self.plan.goal)


@dataclass(frozen=True, slots=True)
class GripTuning:
    kp: float = 0.3  # N of setpoint per N of force error
    ki: float = 15.0  # N/s per N: settles even a weak grip (30 % strength) within ~0.5 s
    contact_force_n: float = 1.0  # trim only above this measured force (after contact)


class GripController:
    """Grip-force PID: setpoint = target + trim(force error), capped by the current limit."""

    def __init__(self, robot: RobotDescription, target_n: float, current_limit_a: float,
                 tuning: GripTuning = GripTuning()) -> None:
        g = robot.gripper
        self.force_min, self.force_max = g.force_min_n, g.force_max_n
        self.force_per_amp = g.force_max_n / g.current_max_a
        self.target_n = min(max(target_n, g.force_min_n), g.force_max_n)
        self.current_limit_a = min(max(current_limit_a, g.current_min_a), g.current_max_a)
        self.tuning = tuning
        self._pid = PID(tuning.kp, tuning.ki,
                        output_limits=(g.force_min_n - self.target_n,
                                       g.force_max_n - self.target_n))
        self.setpoint_n = self.target_n

    def reset(self) -> None:
        self._pid.reset()
        self.setpoint_n = self.target_n

    def start_bumpless(self, gripper_current_a: float, force_n: float) -> None:
        """Continue from the force the gripper holds now (its motor current), not from zero."""
        held = gripper_current_a * self.force_per_amp
        if not math.isfinite(held):  # no current reading: the measured force is a lower bound
            held = force_n if math.isfinite(force_n) else self.target_n
        held = min(max(held, self.force_min), self.force_max)
        self._pid.set_auto_mode(False)
        self._pid.set_auto_mode(True, last_output=held - self.target_n)
        self.setpoint_n = held

    def update(self, force_n: float, dt: float) -> float:
        """The grip force setpoint (N) for this tick."""
        if not math.isfinite(force_n):
            return self.setpoint_n  # no measurement: keep the last command
        if force_n < self.tuning.contact_force_n and self._pid.last_output <= 0.0:
            self._pid.reset()  # closing through air: nothing to trim yet
            trim = 0.0
        else:
            trim = self._pid.update(self.target_n, force_n, dt)
        self.setpoint_n = min(max(self.target_n + trim, self.force_min), self.force_max)
        return self.setpoint_n

    def in_band(self, force_n: float, band_n: float) -> bool:
        return abs(force_n - self.target_n) <= band_n

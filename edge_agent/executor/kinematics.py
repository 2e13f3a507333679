"""Forward and inverse kinematics of a yaw + planar-pitch arm (edge-arm-4), pure float math.

The chain this module accepts, checked when an `ArmKinematics` is built (ConfigError otherwise):
joint 1 turns about z at the base and its link rises to the shoulder; joints 2..4 turn about y,
in one vertical plane, with link lengths L2, L3 and then the wrist link plus the tool offset (T).
The tool pitch is q2 + q3 + q4 (radians above the horizontal; -pi/2 = tool pointing down), so a
target (x, y, z) plus a pitch has a closed-form solution: up to two elbow branches for each of
the two base yaws (facing the target, or facing away and reaching back over the top).

Expected failures are values (`IKFailure`), not exceptions: `out_of_workspace` when the target is
outside the description's workspace box, `unreachable` when it is beyond reach or no branch lies
inside the joint limits.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Literal

from edge_agent.errors import ConfigError
from edge_agent.robot import RobotDescription

TOOL_DOWN = -math.pi / 2
Elbow = Literal["up", "down"]
_TWO_PI = 2 * math.pi
_REACH_EPS = 1e-12  # |cos q3| may exceed 1 by rounding alone at full stretch


class IKFailureReason(StrEnum):
    OUT_OF_WORKSPACE = "out_of_workspace"
    UNREACHABLE = "unreachable"


@dataclass(frozen=True, slots=True)
class IKFailure:
    """Why a target has no solution; `reason` is the error code users see."""

    reason: IKFailureReason
    message: str


@dataclass(frozen=True, slots=True)
class ArmKinematics:
    """The validated geometry and limits of the arm; build once, call many times."""

    base: tuple[float, float, float]
    shoulder_height: float
    upper_arm: float
    forearm: float
    tool: float
    lower: tuple[float, ...]
    upper: tuple[float, ...]
    speed: tuple[float, ...]
    home: tuple[float, ...]
    robot: RobotDescription

    @classmethod
    def of(cls, robot: RobotDescription) -> ArmKinematics:
        """Check that `robot` is a yaw + three-pitch chain and capture its numbers."""
        src = robot.source or None
        axes = tuple(j.axis for j in robot.joints)
        if axes != ("z", "y", "y", "y"):
            raise ConfigError("joints", list(axes), "kinematics supports a z (yaw) joint "
                              "then three y (pitch) joints", src)
        if any(abs(a) > 1e-12 for a in robot.base_rpy_rad):
            raise ConfigError("base.rpy_rad", list(robot.base_rpy_rad),
                              "kinematics supports an upright, unrotated base only", src)
        for i in (1, 2):
            if robot.joints[i].link_length_m <= 0:
                raise ConfigError(f"joints[{i}].link_length_m", robot.joints[i].link_length_m,
                                  "upper arm and forearm must have a length > 0", src)
        js = robot.joints
        return cls(
            base=robot.base_xyz_m,
            shoulder_height=js[0].link_length_m,
            upper_arm=js[1].link_length_m,
            forearm=js[2].link_length_m,
            tool=js[3].link_length_m + robot.tool_offset_m,
            lower=tuple(j.position_min_rad for j in js),
            upper=tuple(j.position_max_rad for j in js),
            speed=tuple(j.velocity_max_rad_s for j in js),
            home=robot.home,
            robot=robot,
        )

    def forward(self, q: Sequence[float]) -> tuple[float, float, float, float]:
        """Tool centre (x, y, z) in the base frame's parent and tool pitch, for joint angles q."""
        if len(q) != 4:
            raise ValueError(f"expected 4 joint angles, got {len(q)}")
        q1, q2, q3, q4 = q
        a23 = q2 + q3
        pitch = a23 + q4
        l2, l3, t = self.upper_arm, self.forearm, self.tool
        r = l2 * math.cos(q2) + l3 * math.cos(a23) + t * math.cos(pitch)
        h = l2 * math.sin(q2) + l3 * math.sin(a23) + t * math.sin(pitch)
        bx, by, bz = self.base
        return (bx + r * math.cos(q1), by + r * math.sin(q1), bz + self.shoulder_height + h, pitch)

    def jacobian(self, q: Sequence[float]) -> tuple[tuple[float, ...], ...]:
        """d(x, y, z, pitch)/dq as four rows of four."""
        q1, q2, q3, q4 = q
        a2, a23, a234 = q2, q2 + q3, q2 + q3 + q4
        l2, l3, t = self.upper_arm, self.forearm, self.tool
        c = (l2 * math.cos(a2), l3 * math.cos(a23), t * math.cos(a234))
        s = (l2 * math.sin(a2), l3 * math.sin(a23), t * math.sin(a234))
        r = c[0] + c[1] + c[2]
        # d r / d q_k and d h / d q_k for k = 2, 3, 4: each angle moves every link after it.
        dr = (-(s[0] + s[1] + s[2]), -(s[1] + s[2]), -s[2])
        dh = (c[0] + c[1] + c[2], c[1] + c[2], c[2])
        c1, s1 = math.cos(q1), math.sin(q1)
        return (
            (-r * s1, dr[0] * c1, dr[1] * c1, dr[2] * c1),
            (r * c1, dr[0] * s1, dr[1] * s1, dr[2] * s1),
            (0.0, dh[0], dh[1], dh[2]),
            (0.0, 1.0, 1.0, 1.0),
        )

    def tool_error(self, q: Sequence[float], target_xyz: Sequence[float]) -> float:
        """Distance (m) between the tool centre at q and a target point."""
        x, y, z, _ = self.forward(q)
        return math.dist((x, y, z), target_xyz)

    def within_limits(self, q: Sequence[float]) -> bool:
        return all(lo <= v <= hi for v, lo, hi in zip(q, self.lower, self.upper, strict=True))

    def inverse(self, xyz: Sequence[float], *, pitch: float = TOOL_DOWN, elbow: Elbow = "up",
                q_seed: Sequence[float] | None = None) -> tuple[float, ...] | IKFailure:
        """Joint angles that put the tool centre at xyz with the given pitch, or why not.

        Every branch inside the joint limits is a candidate. With `q_seed` the one that the
        slowest joint reaches soonest from the seed wins; without it the preferred `elbow`
        wins, then the one closest to home.
        """
        if len(xyz) != 3:
            raise ValueError(f"expected a 3-D target, got {len(xyz)} values")
        if not math.isfinite(pitch):
            raise ValueError(f"pitch must be finite, got {pitch}")
        ws = self.robot.workspace
        if not (ws.min_m[0] <= xyz[0] <= ws.max_m[0] and ws.min_m[1] <= xyz[1] <= ws.max_m[1]
                and ws.min_m[2] <= xyz[2] <= ws.max_m[2]):
            return IKFailure(IKFailureReason.OUT_OF_WORKSPACE,
                             f"target {tuple(xyz)} is outside the workspace box "
                             f"{ws.min_m}..{ws.max_m}")
        seed = tuple(q_seed) if q_seed is not None else self.home
        if len(seed) != 4:
            raise ValueError(f"expected a 4-joint seed, got {len(seed)}")
        dx, dy = xyz[0] - self.base[0], xyz[1] - self.base[1]
        h = xyz[2] - self.base[2] - self.shoulder_height
        r = math.hypot(dx, dy)
        yaw = math.atan2(dy, dx) if r > 1e-12 else seed[0]
        # Wrist centre in the arm plane relative to the shoulder, with r signed by the facing.
        cp, sp = math.cos(pitch), math.sin(pitch)
        l2, l3 = self.upper_arm, self.forearm
        found: list[tuple[float, float, float, float, Elbow]] = []
        in_reach = False
        for facing in (1.0, -1.0):
            a = facing * r - self.tool * cp
            b = h - self.tool * sp
            d = (a * a + b * b - l2 * l2 - l3 * l3) / (2 * l2 * l3)
            if abs(d) > 1 + _REACH_EPS:
                continue
            in_reach = True
            base_q3 = math.acos(max(-1.0, min(1.0, d)))
            q1 = yaw if facing > 0 else yaw + math.pi
            for q3 in (-base_q3, base_q3):
                q2 = math.atan2(b, a) - math.atan2(l3 * math.sin(q3), l2 + l3 * math.cos(q3))
                q4 = pitch - q2 - q3
                up = math.sin(q3) * (1.0 if a >= 0 else -1.0) <= 0
                f = self._fit_all((q1, q2, q3, q4), seed)
                if f is not None:
                    found.append((f[0], f[1], f[2], f[3], "up" if up else "down"))
                if base_q3 == 0.0:
                    break  # straight arm: both branches are the same pose
        if not found:
            why = "inside the joint limits" if in_reach else "within reach of the arm"
            return IKFailure(IKFailureReason.UNREACHABLE,
                             f"no solution for {tuple(xyz)} at pitch {pitch:.3f} rad is {why}")
        if q_seed is not None:
            # min() by motion time, written out: this runs for every point of a planned path
            # on the control thread (the first of equal times wins, as with min()).
            sp0, sp1, sp2, sp3 = self.speed
            s0, s1, s2, s3 = seed
            best, best_t = found[0], math.inf
            for i, c in enumerate(found):
                t = max(abs(c[0] - s0) / sp0, abs(c[1] - s1) / sp1, abs(c[2] - s2) / sp2,
                        abs(c[3] - s3) / sp3)
                if i == 0 or t < best_t:
                    best, best_t = c, t
        else:
            best = min(found, key=lambda c: (c[4] != elbow, self._motion_time(c[:4], self.home)))
        return best[:4]

    def _fit_all(self, q: Sequence[float], seed: Sequence[float]) -> tuple[float, ...] | None:
        lo, hi = self.lower, self.upper
        f0 = _fit(q[0], lo[0], hi[0], seed[0])
        if f0 is None:
            return None
        f1 = _fit(q[1], lo[1], hi[1], seed[1])
        if f1 is None:
            return None
        f2 = _fit(q[2], lo[2], hi[2], seed[2])
        if f2 is None:
            return None
        f3 = _fit(q[3], lo[3], hi[3], seed[3])
        if f3 is None:
            return None
        return (f0, f1, f2, f3)

    def _motion_time(self, q: Sequence[float], start: Sequence[float]) -> float:
        sp = self.speed
        return max(abs(q[0] - start[0]) / sp[0], abs(q[1] - start[1]) / sp[1],
                   abs(q[2] - start[2]) / sp[2], abs(q[3] - start[3]) / sp[3])


def _fit(theta: float, lo: float, hi: float, seed: float) -> float | None:
    """theta + 2*pi*k inside [lo, hi] closest to seed, or None when no turn of theta fits."""
    v = theta - _TWO_PI * math.floor((theta - lo) / _TWO_PI)  # the lowest turn >= lo
    if v > hi:
        return None
    best = v
    v += _TWO_PI
    if v > hi:  # the usual case: limits narrower than a turn, one candidate
        return best
    while v <= hi:  # only when the limits span more than one turn
        if abs(v - seed) < abs(best - seed):
            best = v
        v += _TWO_PI
    return best


# Convenience forms taking the description directly (each call re-validates: a few µs; hot loops
# keep an ArmKinematics).


def _kin(robot: RobotDescription | ArmKinematics) -> ArmKinematics:
    return robot if isinstance(robot, ArmKinematics) else ArmKinematics.of(robot)


def forward(robot: RobotDescription | ArmKinematics,
            q: Sequence[float]) -> tuple[float, float, float, float]:
    """Tool centre (x, y, z) and tool pitch for joint angles q."""
    return _kin(robot).forward(q)


def inverse(robot: RobotDescription | ArmKinematics, xyz: Sequence[float], *,
            tool_down: bool = True, pitch: float | None = None, elbow: Elbow = "up",
            q_seed: Sequence[float] | None = None) -> tuple[float, ...] | IKFailure:
    """Joint angles for a tool target, or an IKFailure (`out_of_workspace` / `unreachable`).

    The pitch is `pitch` when given, else pointing down (`tool_down`), else the seed's (or
    home's) current tool pitch — "move there keeping the tool's orientation".
    """
    kin = _kin(robot)
    if pitch is None:
        pitch = TOOL_DOWN if tool_down else sum((q_seed or kin.home)[1:4])
    return kin.inverse(xyz, pitch=pitch, elbow=elbow, q_seed=q_seed)


def jacobian(robot: RobotDescription | ArmKinematics,
             q: Sequence[float]) -> tuple[tuple[float, ...], ...]:
    """d(x, y, z, pitch)/dq."""
    return _kin(robot).jacobian(q)


def tool_error(robot: RobotDescription | ArmKinematics, q: Sequence[float],
               target_xyz: Sequence[float]) -> float:
    """Distance (m) between the tool centre at q and target_xyz."""
    return _kin(robot).tool_error(q, target_xyz)

"""The joint and gripper limits the link guardian clamps every forwarded COMMAND to.

Pure values from the robot description; `clamp` returns the command itself when it is within
the limits, a clamped copy otherwise, and None when it cannot be used (wrong joint count, a
non-finite value) so the guardian sends a hold instead.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from edge_agent.link.messages import Command, GripperMode, Mode
from edge_agent.robot import RobotDescription

__all__ = ["Limits"]


@dataclass(frozen=True, slots=True)
class Limits:
    """The limits the guardian clamps commands to, from the robot description."""

    q_min: tuple[float, ...]
    q_max: tuple[float, ...]
    stroke_min_m: float
    stroke_max_m: float
    force_min_n: float
    force_max_n: float
    current_min_a: float
    current_max_a: float

    @classmethod
    def from_robot(cls, robot: RobotDescription) -> Limits:
        g = robot.gripper
        return cls(tuple(j.position_min_rad for j in robot.joints),
                   tuple(j.position_max_rad for j in robot.joints),
                   g.stroke_min_m, g.stroke_max_m, g.force_min_n, g.force_max_n,
                   g.current_min_a, g.current_max_a)

    @property
    def n_joints(self) -> int:
        return len(self.q_min)

    def hold(self) -> Command:
        """A full hold; the gripper cap stays at its maximum so a held part is not dropped."""
        return Command(Mode.HOLD, (0.0,) * self.n_joints, GripperMode.HOLD, 0.0,
                       self.current_max_a, 0)

    def clamp(self, cmd: Command) -> Command | None:
        """`cmd` within the limits (the same object if nothing changed); None if unusable."""
        values = (*cmd.q, cmd.gripper_setpoint, cmd.gripper_current_limit)
        if len(cmd.q) != self.n_joints or not all(math.isfinite(v) for v in values):
            return None
        q = tuple(min(max(v, lo), hi) for v, lo, hi in zip(cmd.q, self.q_min, self.q_max,
                                                            strict=True))
        sp, cur = cmd.gripper_setpoint, cmd.gripper_current_limit
        if cmd.gripper_mode == GripperMode.POSITION:
            sp = min(max(sp, self.stroke_min_m), self.stroke_max_m)
        elif cmd.gripper_mode == GripperMode.FORCE:
            sp = min(max(sp, self.force_min_n), self.force_max_n)
        if cmd.gripper_mode == GripperMode.HOLD:
            cur = min(max(cur, 0.0), self.current_max_a)
        elif cur != 0.0:  # 0 asks the firmware for the nominal current, which is within limits
            cur = min(max(cur, self.current_min_a), self.current_max_a)
        if q == cmd.q and sp == cmd.gripper_setpoint and cur == cmd.gripper_current_limit:
            return cmd
        return Command(cmd.mode, q, cmd.gripper_mode, sp, cur, cmd.ttl_ms)

"""Joint physics of the simulated arm: delayed first-order servos, limits, currents, the table.

Pure: `Arm.step(t_us, dt)` advances true joint state by one firmware tick. Positions here are
*true* joint angles; the firmware converts to and from encoder readings (which carry a hidden
offset). The model per joint:

- a reference pipeline: every new reference (a setpoint, or "hold where you are") takes effect
  `transport_delay_s` after it was handed over, as on the real arm;
- servo: v_des = clamp((ref - q) / tau, ±velocity_max); the acceleration toward v_des is bounded
  by accel_max (what the current limit allows); drives off: joints brake to rest;
- current = k_acc·ddq + k_vel·dq + gravity (horizontal lever) + payload + collision, clamped to the
  joint's current_max (a clamp sets the over-current mask);
- the table: the tool centre below the table plane raises the pitch joints' current sharply, and
  motion deeper than max_penetration_m is blocked. An injected `collision` blocks every joint.

Pure Python floats on purpose: for 4 joints this is faster than numpy and the lock-step runner
needs ~10 µs per tick.
"""

from __future__ import annotations

import math
from collections import deque

from edge_agent.errors import ConfigError
from edge_agent.robot import RobotDescription
from hil.sim.config import RigConfig

HOLD_HERE = None  # a pipeline entry meaning "hold the position the joint has when this applies"


class Kinematics:
    """Forward kinematics of a yaw joint followed by a planar chain of pitch joints."""

    def __init__(self, robot: RobotDescription) -> None:
        axes = [j.axis for j in robot.joints]
        if len(axes) < 2 or axes[0] != "z" or any(a != "y" for a in axes[1:]):
            raise ConfigError("joints", axes, "the rig simulates a z (yaw) joint followed by "
                              "y (pitch) joints", robot.source)
        self.base = robot.base_xyz_m
        self.height = robot.joints[0].link_length_m
        self.lengths = tuple(j.link_length_m for j in robot.joints[1:])
        self.tool = robot.tool_offset_m

    def tool_pose(self, q: list[float]) -> tuple[float, float, float, float]:
        """(x, y, z, pitch) of the tool centre; pitch = -pi/2 means pointing straight down."""
        phi = 0.0
        r = 0.0
        z = self.height
        for length, qi in zip(self.lengths, q[1:], strict=True):
            phi += qi
            r += length * math.cos(phi)
            z += length * math.sin(phi)
        r += self.tool * math.cos(phi)
        z += self.tool * math.sin(phi)
        return (self.base[0] + r * math.cos(q[0]), self.base[1] + r * math.sin(q[0]),
                self.base[2] + z, phi)

    def tool_down_ik(self, x: float, y: float, z: float) -> list[float] | None:
        """True joint angles putting the tool centre at (x, y, z) pointing down (elbow up), for a
        yaw + three pitch joints chain; None when out of reach. A test and scenario helper."""
        if len(self.lengths) != 3:
            return None
        l2, l3, _ = self.lengths
        dx, dy = x - self.base[0], y - self.base[1]
        r = math.hypot(dx, dy)
        zz = z - self.base[2] + self.tool - self.height
        d = (r * r + zz * zz - l2 * l2 - l3 * l3) / (2 * l2 * l3)
        if not -1.0 <= d <= 1.0:
            return None
        q3 = -math.acos(d)
        q2 = math.atan2(zz, r) - math.atan2(l3 * math.sin(q3), l2 + l3 * math.cos(q3))
        return [math.atan2(dy, dx), q2, q3, -math.pi / 2 - q2 - q3]

    def levers(self, q: list[float]) -> list[float]:
        """dz/dq per joint (0 for the yaw joint): the horizontal lever gravity acts on."""
        n = len(q)
        out = [0.0] * n
        phis = []
        phi = 0.0
        for qi in q[1:]:
            phi += qi
            phis.append(phi)
        acc = self.tool * math.cos(phis[-1])
        for k in range(n - 1, 0, -1):
            acc += self.lengths[k - 1] * math.cos(phis[k - 1])
            out[k] = acc
        return out


class Arm:
    """True joint state and the servo/brake dynamics of every joint."""

    def __init__(self, robot: RobotDescription, rig: RigConfig, q0: tuple[float, ...]) -> None:
        self.kin = Kinematics(robot)
        self.n = robot.n_joints
        self.table_z = robot.table_z_m
        self.vmax = [j.velocity_max_rad_s for j in robot.joints]
        self.imax = [j.current_max_a for j in robot.joints]
        self.amax = list(rig.motor_accel_max_rad_s2)
        self.k_acc = list(rig.motor_current_per_accel_a)
        self.k_vel = list(rig.motor_current_per_velocity_a)
        self.k_grav = list(rig.motor_gravity_current_a_per_m)
        self.k_payload = list(rig.motor_payload_current_a_per_m)
        self.inv_tau = 1.0 / max(rig.motor_time_constant_s, 1e-6)
        self.brake_tau = max(rig.motor_brake_time_constant_s, 1e-6)
        self.delay_us = round(rig.motor_transport_delay_s * 1e6)
        self.coll_frac = rig.collision_current_fraction
        self.coll_depth = max(rig.collision_full_depth_m, 1e-9)
        self.max_pen = rig.collision_max_penetration_m
        self.q = list(q0)
        self.dq = [0.0] * self.n
        self.ddq = [0.0] * self.n
        self.current = [0.0] * self.n
        self.ref = list(q0)
        self.enabled = False
        self.payload = False
        self.blocked_fraction = 0.0  # injected collision: >0 blocks every joint
        self.overcurrent_mask = 0
        self.penetration_m = 0.0
        self.tool = self.kin.tool_pose(self.q)
        self.resting = False  # at the reference with zero velocity: step() has nothing to do
        self._servo = [(i, self.vmax[i], self.amax[i]) for i in range(self.n)]
        self._pending: deque[tuple[int, list[float] | None]] = deque()

    # ------------------------------------------------------------------ references

    def set_reference(self, now_us: int, target: list[float] | None) -> None:
        """Hand the servos a new reference (true angles, or HOLD_HERE), applied after the delay."""
        self._pending.append((now_us + self.delay_us, target))

    def enable(self) -> None:
        """Power the drives, holding the measured position: never a stale setpoint."""
        self._pending.clear()
        self.ref = list(self.q)
        self.enabled = True
        self.resting = False

    def disable(self) -> None:
        """Cut drive power (category 0): references are forgotten, joints brake."""
        self._pending.clear()
        self.enabled = False
        self.resting = False

    def hold_now(self) -> None:
        """Hold the present position at once (firmware-internal hold, no pipeline)."""
        self._pending.clear()
        self.ref = list(self.q)
        self.resting = False

    # ------------------------------------------------------------------ dynamics

    def step(self, t_us: int, dt: float) -> None:
        pending = self._pending
        while pending and pending[0][0] <= t_us:
            target = pending.popleft()[1]
            self.ref = list(self.q) if target is None else target
            self.resting = False
        if self.resting and self.blocked_fraction <= 0.0:
            return  # at rest (at the reference, or braked): nothing moves, nothing to recompute
        q, dq, ddq, ref = self.q, self.dq, self.ddq, self.ref
        q_old = q[:]
        if self.blocked_fraction > 0.0:
            for i in range(self.n):
                ddq[i] = -dq[i] / dt
                dq[i] = 0.0
        elif self.enabled:
            inv_tau, still = self.inv_tau, True
            for i, vm, am in self._servo:
                v = (ref[i] - q[i]) * inv_tau
                if v > vm:
                    v = vm
                elif v < -vm:
                    v = -vm
                a = (v - dq[i]) / dt
                if a > am:
                    a = am
                elif a < -am:
                    a = -am
                ddq[i] = a
                v = dq[i] + a * dt
                dq[i] = v
                q[i] += v * dt
                if still and (v > 1e-7 or v < -1e-7 or a > 1e-4 or a < -1e-4):
                    still = False
            if still and all(abs(r - x) < 1e-8 for r, x in zip(ref, q, strict=True)):
                self.resting = True
                for i in range(self.n):
                    dq[i] = ddq[i] = 0.0
        else:
            k = 1.0 / (self.brake_tau + dt)
            for i in range(self.n):
                a = -dq[i] * k
                ddq[i] = a
                dq[i] += a * dt
                q[i] += dq[i] * dt
            if all(-1e-9 < v < 1e-9 for v in dq):
                self.resting = True
                for i in range(self.n):
                    dq[i] = ddq[i] = 0.0
        tool = self.kin.tool_pose(q)
        depth = self.table_z - tool[2]
        if depth > self.max_pen and tool[2] < self.tool[2]:
            # The table does not give way: undo the pitch joints' step.
            for i in range(1, self.n):
                q[i] = q_old[i]
                dq[i] = 0.0
            tool = self.kin.tool_pose(q)
            depth = self.table_z - tool[2]
        self.tool = tool
        self.penetration_m = depth if depth > 0.0 else 0.0

    def currents(self) -> list[float]:
        """Joint currents now (computed when reported: only STATUS and events observe them);
        also updates `overcurrent_mask`."""
        cur, imax = self.current, self.imax
        if not self.enabled:
            for i in range(self.n):
                cur[i] = 0.0
            self.overcurrent_mask = 0
            return cur
        levers = self.kin.levers(self.q)
        depth = self.penetration_m
        hit = min(1.0, depth / self.coll_depth) * self.coll_frac if depth > 0.0 else 0.0
        mask = 0
        for i in range(self.n):
            lever = levers[i]
            c = self.k_acc[i] * self.ddq[i] + self.k_vel[i] * self.dq[i] + self.k_grav[i] * lever
            if self.payload:
                c += self.k_payload[i] * lever
            if hit > 0.0 and lever != 0.0:
                # The servo pushes the tool down into the table: current against dz/dq.
                c -= math.copysign(hit * imax[i], lever)
            if self.blocked_fraction > 0.0:
                err = self.ref[i] - self.q[i]
                c += math.copysign(self.blocked_fraction * imax[i], err if err != 0.0 else c)
            if c > imax[i]:
                c, mask = imax[i], mask | (1 << i)
            elif c < -imax[i]:
                c, mask = -imax[i], mask | (1 << i)
            cur[i] = c
        self.overcurrent_mask = mask
        return cur

"""The parallel gripper and the cube on the table: fingers, motor current, contact, grasp.

Pure: `Gripper.step(dt, tool, obj)` advances one firmware tick. The model:

- fingers move toward their target opening with a first-order response capped at speed_max;
- force appears only in contact with the object: the fingers straddled the cube (tool centre within
  grasp_xy_tolerance_m of the cube, at its height, pointing down) and closed to its width;
- in contact, force = force_per_amp · motor_current · (1 - weak_severity), force_per_amp =
  force_max_n / current_max_a; the motor current is the mode's demand capped by the command's
  current limit (clamped by the firmware to the description's range);
- the object is grasped once the force reaches grasp_force_min_n, then follows the tool; below
  that force (or while a `slip` fault is active) a lifted object drops to the table. Every drop
  is counted with its cause: `slip` (the injected fault), `weak` (the grip force fell below
  grasp_force_min_n), `release` (the fingers were commanded open with the part in the air).
"""

from __future__ import annotations

import math

from edge_agent.link.codec import GripperMode
from edge_agent.robot import RobotDescription
from hil.sim.config import RigConfig


class WorldObject:
    """The cube: true centre position, whether it is held, and its offset from the tool."""

    def __init__(self, xyz: tuple[float, float, float], size: float, table_z: float) -> None:
        self.xyz = list(xyz)
        self.size = size
        self.rest_z = table_z + size / 2.0
        self.grasped = False
        self.offset = (0.0, 0.0, 0.0)
        self.drops = 0
        self.drop_causes: dict[str, int] = {}  # slip | weak | release -> count

    def place(self, xyz: tuple[float, float, float] | list[float]) -> None:
        self.grasped = False
        self.xyz = [float(xyz[0]), float(xyz[1]), max(float(xyz[2]), self.rest_z)]

    def drop(self, cause: str) -> None:
        """Fall out of the fingers onto the table below (`cause`: slip | weak | release)."""
        self.grasped = False
        self.xyz[2] = self.rest_z
        self.drops += 1
        self.drop_causes[cause] = self.drop_causes.get(cause, 0) + 1

    @property
    def lifted(self) -> bool:
        return self.xyz[2] > self.rest_z + 0.001


class Gripper:
    """Finger opening, motor current and the force sensor's true force."""

    def __init__(self, robot: RobotDescription, rig: RigConfig) -> None:
        g = robot.gripper
        self.w_min, self.w_max = g.stroke_min_m, g.stroke_max_m
        self.i_min, self.i_max, self.i_nom = g.current_min_a, g.current_max_a, g.current_nominal_a
        self.speed_max = g.speed_max_m_s
        self.force_max = g.force_max_n
        self.force_per_amp = g.force_max_n / g.current_max_a
        self.inv_tau = 1.0 / max(rig.gripper_time_constant_s, 1e-6)
        self.free_current = rig.gripper_free_current_a
        self.k_speed = rig.gripper_current_per_speed_a
        self.stiffness = rig.gripper_contact_stiffness_n_m
        self.squeeze_gain = rig.gripper_squeeze_gain_a_per_m
        self.grasp_min = rig.gripper_grasp_force_min_n
        self.xy_tol = rig.gripper_grasp_xy_tolerance_m
        self.tilt_tol = rig.gripper_grasp_tilt_tolerance_rad
        self.opening = g.stroke_max_m
        self.speed = 0.0
        self.force = 0.0
        self.current = 0.0
        self.mode = GripperMode.HOLD
        self.setpoint = self.opening
        self.current_limit = self.i_nom
        self.contact = False
        self.straddling = False
        self.weak_severity = 0.0
        self.slip = False
        self.settled = False  # free fingers at their target with a steady current

    def command(self, mode: GripperMode, setpoint: float, current_limit: float) -> None:
        """Apply a gripper command (setpoint and limit already clamped by the firmware)."""
        self.settled = False
        if mode == GripperMode.HOLD:
            if self.mode != GripperMode.HOLD:
                self.setpoint = self.opening
            self.mode = mode
            return
        self.mode = mode
        self.setpoint = setpoint
        self.current_limit = current_limit

    def hold(self) -> None:
        """Keep the present opening and force (a held part is not dropped)."""
        self.command(GripperMode.HOLD, 0.0, self.current_limit)

    def firmware_command(self, mode: GripperMode, setpoint: float, current_limit: float) -> bool:
        """A COMMAND's gripper part as the firmware applies it: the setpoint clamped to the
        stroke (POSITION) or the force range (FORCE), the current limit (0: nominal) to the
        motor's range; True when anything was clamped (the LIMIT_CLAMPED event's gripper bit)."""
        if mode == GripperMode.HOLD:
            self.hold()
            return False
        lim = current_limit or self.i_nom
        lo, hi = ((self.w_min, self.w_max) if mode == GripperMode.POSITION
                  else (0.0, self.force_max))
        sp = min(max(setpoint, lo), hi)
        lim_c = min(max(lim, self.i_min), self.i_max)
        self.command(mode, sp, lim_c)
        return sp != setpoint or lim_c != lim

    def _in_zone(self, tool: tuple[float, float, float, float], obj: WorldObject) -> bool:
        half = obj.size / 2.0
        return (math.hypot(tool[0] - obj.xyz[0], tool[1] - obj.xyz[1]) <= self.xy_tol
                and abs(tool[2] - obj.xyz[2]) <= half
                and abs(tool[3] + math.pi / 2.0) <= self.tilt_tol)

    def _demand(self) -> float:
        """Motor current the present mode asks for once the fingers are blocked."""
        if self.mode == GripperMode.FORCE:
            want = self.setpoint / self.force_per_amp
        elif self.mode == GripperMode.POSITION:
            want = self.squeeze_gain * (self.opening - self.setpoint)
        else:
            return self.current
        return max(0.0, min(want, self.current_limit))

    def step(self, dt: float, tool: tuple[float, float, float, float], obj: WorldObject) -> None:
        if (self.settled and not self.contact and not self.straddling and not obj.grasped
                and abs(tool[2] - obj.xyz[2]) > obj.size):
            return  # fingers at rest, far from the cube: nothing can change this tick
        k = dt * self.inv_tau
        if k > 1.0:
            k = 1.0
        if obj.grasped:
            if self.slip and obj.lifted:
                obj.drop("slip")
                self.contact = self.straddling = False
        elif self._in_zone(tool, obj):
            if self.opening > obj.size:
                self.straddling = True
        else:
            self.straddling = False
            self.contact = False
        releasing = (self.mode == GripperMode.POSITION and self.setpoint > obj.size) or (
            self.mode == GripperMode.FORCE and self.setpoint <= 0.0)
        if self.contact and releasing:
            self.contact = False
            self.force = 0.0
            if obj.grasped:
                obj.grasped = False
                if obj.lifted:
                    obj.drop("release")
        if self.contact:
            self.current += (self._demand() - self.current) * k
            target_f = self.force_per_amp * self.current * (1.0 - self.weak_severity)
            self.force += (target_f - self.force) * k
            self.speed = 0.0
            self.opening = obj.size - self.force / self.stiffness
            if not obj.grasped and self.force >= self.grasp_min:
                obj.grasped = True
                obj.offset = (obj.xyz[0] - tool[0], obj.xyz[1] - tool[1], obj.xyz[2] - tool[2])
            elif obj.grasped and self.force < self.grasp_min and obj.lifted:
                obj.drop("weak")
                self.contact = self.straddling = False
                self.force = 0.0
        else:
            self._move_free(dt, k, obj)
        if obj.grasped:
            off = obj.offset
            obj.xyz[0], obj.xyz[1] = tool[0] + off[0], tool[1] + off[1]
            obj.xyz[2] = max(tool[2] + off[2], obj.rest_z)

    def _move_free(self, dt: float, k: float, obj: WorldObject) -> None:
        self.force = 0.0
        if self.mode == GripperMode.POSITION:
            target = min(max(self.setpoint, self.w_min), self.w_max)
        elif self.mode == GripperMode.FORCE:
            target = self.w_min if self.setpoint > 0.0 else self.w_max
        else:
            target = self.setpoint
        v = (target - self.opening) * self.inv_tau
        v = max(-self.speed_max, min(self.speed_max, v))
        w = self.opening + v * dt
        if abs(target - w) < 1e-7:
            w, v = target, 0.0
        if self.straddling and w <= obj.size < self.opening:
            w, v = obj.size, 0.0
            self.contact = True
        w = min(max(w, self.w_min), self.w_max)
        self.speed = v
        self.opening = w
        before = self.current
        if w <= self.w_min + 1e-6 and v <= 0.0 and self.mode != GripperMode.HOLD:
            # Fingers closed on nothing: the motor pushes against its end stop.
            want = max(self._demand() if self.mode == GripperMode.FORCE else 0.0,
                       self.free_current)
            self.current += (want - self.current) * k
            if abs(want - self.current) < 1e-6:
                self.current = want
        else:
            self.current = self.free_current + self.k_speed * abs(v) if v != 0.0 else 0.0
        self.settled = v == 0.0 and self.current == before

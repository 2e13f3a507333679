"""PID control in the style of simple-pid, and the joint position controller built on it.

`PID` is the textbook loop with the safeguards a robot needs: the integral is kept in output
units and clamped, and it stops growing while the output is saturated in the error's direction
(anti-windup); the derivative acts on the measurement, so a setpoint step gives no kick; an
optional first-order low-pass smooths the derivative; `reset()` forgets everything and
`set_auto_mode()` switches back to automatic without a bump. Time is always passed in (`dt`).

`JointPositionController` turns an IK target into a smooth stream of joint position setpoints for
the firmware's position loop (the path states run it through `controllers.PathController`; the
grip's force PID is `controllers.GripController`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from edge_agent.robot import RobotDescription

Limits = tuple[float | None, float | None]


def _clamp(v: float, lo: float | None, hi: float | None) -> float:
    if hi is not None and v > hi:
        return hi
    if lo is not None and v < lo:
        return lo
    return v


def _check_dt(dt: float) -> None:
    if not (math.isfinite(dt) and dt >= 0):
        raise ValueError(f"dt must be a finite number >= 0, got {dt}")


class PID:
    """One PID loop: `update(setpoint, measurement, dt)` returns the clamped output."""

    def __init__(self, kp: float, ki: float = 0.0, kd: float = 0.0, *,
                 output_limits: Limits = (None, None), integral_limits: Limits | None = None,
                 derivative_tau_s: float = 0.0) -> None:
        self.set_gains(kp, ki, kd)
        if derivative_tau_s < 0:
            raise ValueError(f"derivative_tau_s must be >= 0, got {derivative_tau_s}")
        self.derivative_tau_s = derivative_tau_s
        self.output_limits = output_limits
        self.integral_limits = integral_limits  # None: the output limits
        self._auto = True
        self.reset()

    def set_gains(self, kp: float, ki: float, kd: float) -> None:
        """Change gains without a bump (the integral is stored in output units)."""
        if not all(math.isfinite(g) and g >= 0 for g in (kp, ki, kd)):
            raise ValueError(f"gains must be finite and >= 0, got {(kp, ki, kd)}")
        self.kp, self.ki, self.kd = kp, ki, kd

    @property
    def output_limits(self) -> Limits:
        return self._out_limits

    @output_limits.setter
    def output_limits(self, limits: Limits) -> None:
        lo, hi = limits
        if lo is not None and hi is not None and lo > hi:
            raise ValueError(f"lower output limit {lo} is above the upper one {hi}")
        self._out_limits = limits

    def reset(self) -> None:
        """Forget the integral, the derivative memory and the last output."""
        self._integral = 0.0
        self._derivative = 0.0
        self._last_measurement: float | None = None
        self._last_output = 0.0
        self.components = (0.0, 0.0, 0.0)

    @property
    def auto_mode(self) -> bool:
        return self._auto

    @property
    def last_output(self) -> float:
        return self._last_output

    def set_auto_mode(self, enabled: bool, last_output: float | None = None) -> None:
        """Switch automatic control on/off; switching on starts from `last_output` (bumpless)."""
        if enabled and not self._auto:
            self.reset()
            if last_output is not None:
                self._integral = self._clamp_integral(last_output)
                self._last_output = _clamp(last_output, *self._out_limits)
        self._auto = enabled

    def _clamp_integral(self, v: float) -> float:
        lim = self.integral_limits if self.integral_limits is not None else self._out_limits
        return _clamp(v, *lim)

    def update(self, setpoint: float, measurement: float, dt: float) -> float:
        """One step of `dt` seconds; dt == 0 (or manual mode) returns the last output unchanged."""
        _check_dt(dt)
        if not (math.isfinite(setpoint) and math.isfinite(measurement)):
            raise ValueError(f"setpoint and measurement must be finite ({setpoint}, {measurement})")
        if not self._auto or dt == 0:
            return self._last_output
        error = setpoint - measurement
        p = self.kp * error
        if self._last_measurement is None or self.kd == 0:
            d_raw = 0.0
        else:
            d_raw = -self.kd * (measurement - self._last_measurement) / dt
        alpha = dt / (self.derivative_tau_s + dt)
        d = self._derivative + alpha * (d_raw - self._derivative)
        integral = self._clamp_integral(self._integral + self.ki * error * dt)
        lo, hi = self._out_limits
        raw = p + integral + d
        # Conditional integration: while saturated, integrate only what pulls out of saturation.
        if (hi is not None and raw > hi and integral > self._integral) or (
                lo is not None and raw < lo and integral < self._integral):
            integral = self._integral
        self._integral = integral
        self._derivative = d
        self._last_measurement = measurement
        self.components = (p, integral, d)
        self._last_output = _clamp(p + integral + d, lo, hi)
        return self._last_output


@dataclass(frozen=True, slots=True)
class JointGains:
    """Gains of one joint's loop; its output is the setpoint's velocity (rad/s).

    kp (1/s) pulls the setpoint toward the target; ki (1/s²) integrates the *measured* error and
    so removes a steady offset of the drive (sag); kd (dimensionless) damps with the measured
    velocity. ki = 0 by default: the firmware tracks position, and an integrator is what lets a
    setpoint run past the target.
    """

    kp: float = 4.0
    ki: float = 0.0
    kd: float = 0.0
    derivative_tau_s: float = 0.0


class JointPositionController:
    """Joint-space PIDs that move a position setpoint toward a target, rate- and limit-bound.

    One two-degree-of-freedom PID per joint gives the setpoint's velocity: the proportional part
    acts on (target - setpoint), so the setpoint glides to the target and stops there even when
    the arm lags or is blocked; the integral and derivative parts act on the measured position.
    Each tick the setpoint moves by at most velocity_max * speed_scale * dt, stays inside the
    joint's position limits, and stays within `max_following_error_rad` of the measured position
    when it can. Every bound is the PID's output limit that tick, so nothing winds up against it.
    """

    def __init__(self, robot: RobotDescription,
                 gains: JointGains | Sequence[JointGains] = JointGains(), *,
                 speed_scale: float = 1.0, max_following_error_rad: float | None = 0.2) -> None:
        self._joints = robot.joints
        self._pids = [PID(0.0) for _ in self._joints]  # the I and D parts; P is applied here
        self._kp = [0.0] * len(self._joints)
        self.set_gains(gains)
        self.speed_scale = speed_scale
        if max_following_error_rad is not None and max_following_error_rad <= 0:
            raise ValueError("max_following_error_rad must be > 0 (or None)")
        self.max_following_error_rad = max_following_error_rad
        self._setpoint: tuple[float, ...] | None = None

    def set_gains(self, gains: JointGains | Sequence[JointGains]) -> None:
        per_joint = [gains] * len(self._joints) if isinstance(gains, JointGains) else list(gains)
        if len(per_joint) != len(self._joints):
            raise ValueError(f"expected {len(self._joints)} joint gains, got {len(per_joint)}")
        for i, (pid, g) in enumerate(zip(self._pids, per_joint, strict=True)):
            if not (math.isfinite(g.kp) and g.kp >= 0):
                raise ValueError(f"kp must be finite and >= 0, got {g.kp}")
            self._kp[i] = g.kp
            pid.set_gains(0.0, g.ki, g.kd)
            pid.derivative_tau_s = g.derivative_tau_s

    @property
    def speed_scale(self) -> float:
        return self._speed_scale

    @speed_scale.setter
    def speed_scale(self, scale: float) -> None:
        if not 0 < scale <= 1:
            raise ValueError(f"speed_scale must lie in (0, 1], got {scale}")
        self._speed_scale = scale
        for pid, j in zip(self._pids, self._joints, strict=True):
            v = j.velocity_max_rad_s * scale
            pid.integral_limits = (-v, v)

    @property
    def setpoint(self) -> tuple[float, ...] | None:
        """The last commanded position (None before the first reset/update)."""
        return self._setpoint

    def reset(self, measured_q: Sequence[float]) -> tuple[float, ...]:
        """Start from the measured pose with every integrator cleared; returns that setpoint."""
        self._check(measured_q, "measured_q")
        for pid in self._pids:
            pid.reset()
        self._setpoint = tuple(j.clamp(v) for j, v in zip(self._joints, measured_q, strict=True))
        return self._setpoint

    def update(self, target_q: Sequence[float], measured_q: Sequence[float],
               dt: float) -> tuple[float, ...]:
        """The next position setpoint; the first call after construction starts from measured_q."""
        _check_dt(dt)
        self._check(target_q, "target_q")
        self._check(measured_q, "measured_q")
        prev = self._setpoint if self._setpoint is not None else self.reset(measured_q)
        if dt == 0:
            return prev
        lead = self.max_following_error_rad
        out = []
        for j, pid, kp, sp, target, meas in zip(self._joints, self._pids, self._kp, prev,
                                                target_q, measured_q, strict=True):
            step = j.velocity_max_rad_s * self._speed_scale * dt
            hard_lo = max(j.position_min_rad, sp - step)
            hard_hi = min(j.position_max_rad, sp + step)
            lo, hi = hard_lo, hard_hi
            if lead is not None:
                lo, hi = max(lo, meas - lead), min(hi, meas + lead)
                if lo > hi:  # the leash is out of reach this tick: head for it at full speed
                    lo = hi = hard_hi if meas - lead > hard_hi else hard_lo
            goal = j.clamp(target)
            v_ref = min(kp, 1.0 / dt) * (goal - sp)  # never step past the goal, even at kp*dt > 1
            pid.output_limits = ((lo - sp) / dt - v_ref, (hi - sp) / dt - v_ref)
            v = v_ref + pid.update(goal, meas, dt)
            out.append(min(max(sp + v * dt, lo, hard_lo), hi, hard_hi))
        self._setpoint = tuple(out)
        return self._setpoint

    def converged(self, target_q: Sequence[float], measured_q: Sequence[float],
                  tol_rad: float) -> bool:
        """True when every measured joint is within tol_rad of its (limit-clamped) target."""
        return all(abs(j.clamp(t) - m) <= tol_rad
                   for j, t, m in zip(self._joints, target_q, measured_q, strict=True))

    def _check(self, q: Sequence[float], what: str) -> None:
        if len(q) != len(self._joints) or not all(math.isfinite(v) for v in q):
            raise ValueError(f"{what} must be {len(self._joints)} finite angles, got {tuple(q)}")

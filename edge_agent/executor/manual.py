"""Manual jogging: joint or cartesian velocity at reduced speed, with the jog stream as a deadman.

Each `jog` carries a velocity and a `ttl_ms` (≤ 200); the velocity applies until the ttl runs out.
An expired jog stops the motion (the executor holds); if the stream died while moving, that is
"jog stream lost" and the executor trips a protective stop. Speeds are capped at
`speed_fraction` of each joint's limit (cartesian: `cartesian_speed_m_s`, tool pitch kept), the
setpoint stays on a short leash to the measured position, and every new stream starts from the
measured pose — never from an old setpoint.

Limits (DESIGN.md: jog stays inside the workspace box and inside soft limits): each joint's
setpoint stays `soft_limit_margin_rad` inside its position limits, and a step that would take the
tool centre out of the workspace box — shrunk by `box_margin_m`, the room a servo needs to stop
behind its setpoint — is not taken. Either way a pose already outside (after a task, a power
cycle) may only move back in: never further out, and never pulled in by a jump.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from enum import StrEnum

from edge_agent.executor.kinematics import ArmKinematics
from edge_agent.robot import RobotDescription


class JogFrame(StrEnum):
    JOINT = "joint"  # rad/s per joint
    CARTESIAN = "cartesian"  # m/s of the tool centre (x, y, z), tool pitch kept


class JogController:
    """Integrates jog velocities into joint position setpoints."""

    def __init__(self, robot: RobotDescription, kin: ArmKinematics, speed_fraction: float = 0.25,
                 cartesian_speed_m_s: float = 0.05, leash_rad: float = 0.05,
                 box_margin_m: float = 0.005) -> None:
        self.joints = robot.joints
        self.kin = kin
        self.soft = robot.soft_limits()
        ws = robot.workspace
        self.box_min = tuple(v + box_margin_m for v in ws.min_m)
        self.box_max = tuple(v - box_margin_m for v in ws.max_m)
        self.vmax = tuple(j.velocity_max_rad_s * speed_fraction for j in robot.joints)
        self.cart_speed = cartesian_speed_m_s
        self.leash = leash_rad
        self._frame = JogFrame.JOINT
        self._v: tuple[float, ...] | None = None
        self._expires = -math.inf
        self._setpoint: tuple[float, ...] | None = None
        self.moving = False

    def stop(self) -> None:
        """Forget the stream and the setpoint (idempotent)."""
        self._v = None
        self._setpoint = None
        self.moving = False
        self._expires = -math.inf

    def command(self, now: float, frame: JogFrame, velocity: Sequence[float],
                ttl_ms: int) -> str | None:
        """Take one jog message; returns why it is refused, or None."""
        want = len(self.joints) if frame is JogFrame.JOINT else 3
        if len(velocity) != want or not all(math.isfinite(v) for v in velocity):
            return f"a {frame.value} jog needs {want} finite velocities"
        if not 0 < ttl_ms <= 200:
            return f"ttl_ms must be within 1..200, got {ttl_ms}"
        if frame is JogFrame.JOINT:
            # Scale the whole vector so the direction of motion is kept.
            ratio = max(abs(v) / m for v, m in zip(velocity, self.vmax, strict=True))
            s = 1.0 / ratio if ratio > 1.0 else 1.0
            v = tuple(x * s for x in velocity)
        else:
            norm = math.sqrt(sum(x * x for x in velocity))
            s = self.cart_speed / norm if norm > self.cart_speed else 1.0
            v = tuple(x * s for x in velocity)
        self._frame = frame
        self._v = v
        self._expires = now + ttl_ms / 1000.0
        return None

    def update(self, now: float, q: Sequence[float], dt: float) -> tuple[tuple[float, ...] | None,
                                                                         bool]:
        """(the setpoint, or None = hold) and whether a moving stream was just lost."""
        if self._v is None:
            return None, False
        if now >= self._expires:
            lost = self.moving
            self.stop()
            return None, lost
        qdot = self._joint_rates(q) if self._frame is JogFrame.CARTESIAN else self._v
        self.moving = any(abs(v) > 1e-9 for v in qdot)
        sp = self._setpoint if self._setpoint is not None else tuple(q)
        out = []
        for j, (lo, hi), s, v, meas in zip(self.joints, self.soft, sp, qdot, q, strict=True):
            nxt = min(max(s + v * dt, meas - self.leash), meas + self.leash)
            if nxt > hi:  # past the soft limit: no further out than the setpoint already was
                nxt = max(hi, min(nxt, s))
            elif nxt < lo:
                nxt = min(lo, max(nxt, s))
            out.append(j.clamp(nxt))
        new = tuple(out)
        if self._outside(new) > 0.0 and self._outside(new) >= self._outside(sp) - 1e-9:
            new = sp  # out of the box, and not on the way back in: hold this step
        self._setpoint = new
        return new, False

    def _outside(self, q: Sequence[float]) -> float:
        """How far the tool centre at `q` is outside the (shrunk) workspace box, m (L1)."""
        x, y, z, _ = self.kin.forward(q)
        out = 0.0
        for v, lo, hi in zip((x, y, z), self.box_min, self.box_max, strict=True):
            if v < lo:
                out += lo - v
            elif v > hi:
                out += v - hi
        return out

    def _joint_rates(self, q: Sequence[float]) -> tuple[float, ...]:
        assert self._v is not None
        jac = self.kin.jacobian(q)
        rhs = [self._v[0], self._v[1], self._v[2], 0.0]  # keep the tool pitch
        sol = _solve4([list(r) for r in jac], rhs)
        if sol is None:
            return (0.0,) * len(self.joints)  # singular pose: do not guess
        ratio = max(abs(v) / m for v, m in zip(sol, self.vmax, strict=True))
        s = 1.0 / ratio if ratio > 1.0 else 1.0
        return tuple(v * s for v in sol)


def _solve4(a: list[list[float]], b: list[float]) -> tuple[float, ...] | None:
    """Gaussian elimination with partial pivoting; None when (nearly) singular."""
    n = len(b)
    for c in range(n):
        p = max(range(c, n), key=lambda r: abs(a[r][c]))
        if abs(a[p][c]) < 1e-6:
            return None
        a[c], a[p] = a[p], a[c]
        b[c], b[p] = b[p], b[c]
        for r in range(c + 1, n):
            f = a[r][c] / a[c][c]
            for k in range(c, n):
                a[r][k] -= f * a[c][k]
            b[r] -= f * b[c]
    x = [0.0] * n
    for r in range(n - 1, -1, -1):
        x[r] = (b[r] - sum(a[r][k] * x[k] for k in range(r + 1, n))) / a[r][r]
    return tuple(x)

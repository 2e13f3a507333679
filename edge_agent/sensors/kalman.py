"""Kalman estimators for the sensor channels with `on_loss = "predict"` (closed form, plain Python).

Kinematic channels (unit m or rad: object pose, joint encoders) use a constant-velocity model,
the others (wrist force) a constant-position random walk — a force does not keep its trend.
`ChannelEstimator` is a linear Kalman filter (filterpy's `KalmanFilter` equations) with
explicit time, stepped in closed form per axis (the model is block-diagonal per axis; see the
class): `predict(now)`, `update(z, now)` with `z=None` meaning "no measurement", public `x` and
`P`, `predicted_for_s` and `exceeds_bound()` (predicted past the channel's predict_max_s: the
caller stops).

filterpy (and with it scipy, 143 MB installed) is not a runtime dependency: only the tests use
it, as the reference the closed form is checked against. Neither numpy nor anything else heavy is
imported with this module or by building an estimator: the closed form runs on plain floats, so
the hub builds its estimators with itself and predicts from the first frame. Only reading `x` or
`P` (the state as matrices, for tests and tools) imports numpy. `state()` hands out an immutable
`EstimatorState` that other threads extrapolate in plain Python without touching the filter.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from edge_agent.robot import RobotDescription, SensorChannel

if TYPE_CHECKING:
    import numpy as np

Model = Literal["cv", "cp"]
_KINEMATIC_UNITS = ("m", "rad")
# Process noise spectral density per unit: acceleration for "cv" ((unit/s²)² s), rate for "cp";
# and the prior std of the velocity at the first measurement ("cv").
_DEFAULT_Q = {"m": 0.01, "rad": 4.0, "N": 400.0, "A": 25.0}
_DEFAULT_V0_STD = {"m": 0.5, "rad": 2.0}
_THIRD = 1.0 / 3.0  # the dt³/3 of the "cv" process noise


@dataclass(frozen=True, slots=True)
class EstimatorTuning:
    """Model and noise of one channel's filter."""

    model: Model
    q: float  # process noise spectral density (see _DEFAULT_Q)
    v0_std: float = 1.0  # prior std of the velocity at the first measurement ("cv" only)
    # Predictions use a velocity only where it is this many of its stds away from zero: a
    # camera's noisy velocity would otherwise make a part lying still drift.
    velocity_gate: float = 2.0

    @staticmethod
    def default(channel: SensorChannel) -> EstimatorTuning:
        model: Model = "cv" if channel.unit in _KINEMATIC_UNITS else "cp"
        q = _DEFAULT_Q.get(channel.unit, (10 * max(channel.noise_std, 1e-6)) ** 2)
        return EstimatorTuning(model, q, v0_std=_DEFAULT_V0_STD.get(channel.unit, 1.0))


@dataclass(frozen=True, slots=True)
class EstimatorState:
    """An immutable copy of one filter's posterior; extrapolates itself in plain Python."""

    channel: str
    model: Model
    t: float  # time the posterior is for (host monotonic, s)
    t_measured: float  # time of the last measurement; -inf if none
    pos: tuple[float, ...]
    vel: tuple[float, ...]  # zeros for "cp"
    var_pos: tuple[float, ...]
    cov_pos_vel: tuple[float, ...]
    var_vel: tuple[float, ...]
    q: float
    predict_max_s: float
    velocity_gate: float = 0.0

    @property
    def measured(self) -> bool:
        return self.t_measured > -math.inf

    def value_at(self, now: float) -> tuple[float, ...]:
        """The predicted value at `now`, moving only along significant velocities."""
        dt = max(0.0, now - self.t)
        g2 = self.velocity_gate ** 2
        return tuple(p + v * dt if v * v > g2 * vv else p
                     for p, v, vv in zip(self.pos, self.vel, self.var_vel, strict=True))

    def std_at(self, now: float) -> tuple[float, ...]:
        dt = max(0.0, now - self.t)
        if self.model == "cp":
            return tuple(math.sqrt(p + self.q * dt) for p in self.var_pos)
        grow = self.q * dt ** 3 / 3
        return tuple(math.sqrt(max(0.0, p + 2 * dt * c + dt * dt * v + grow))
                     for p, c, v in zip(self.var_pos, self.cov_pos_vel, self.var_vel, strict=True))

    def predicted_for(self, now: float) -> float:
        return now - self.t_measured

    def exceeds_bound(self, now: float) -> bool:
        return self.predicted_for(now) > self.predict_max_s


class ChannelEstimator:
    """One channel's Kalman filter with explicit time; single-threaded (its owner's thread).

    The model is filterpy's `KalmanFilter` (H = [I 0], R = noise_std² I, F(dt) = I + dt D,
    Q(dt) = q (dt³ Q3 + dt² Q2 + dt Q1)), built here. Every one of those matrices, and the
    diagonal prior, is block-diagonal per axis, so the filter is n independent 2-state ("cv")
    or 1-state ("cp") filters: the cross-axis covariances stay exactly zero. `predict` and
    `update` therefore run filterpy's equations (F P Fᵀ + Q; the Joseph-form update with
    K = P Hᵀ S⁻¹) in closed form per axis on plain floats — a few µs instead of ~60 µs of small
    numpy matrices on the link reader thread; tests/test_kalman.py checks the result against
    filterpy itself. `x` and `P` assemble the state as filterpy lays it out (fresh arrays).
    """

    def __init__(self, channel: SensorChannel, tuning: EstimatorTuning | None = None) -> None:
        self.channel = channel
        self.tuning = tuning or EstimatorTuning.default(channel)
        n = channel.dim
        self._n = n
        self._cv = self.tuning.model == "cv"
        # per-axis measurement variance: filterpy's R = noise_std² I (its diagonal)
        self._r: list[float] = [max(channel.noise_std, 1e-9) ** 2] * n
        self._q = self.tuning.q
        self._v0_var = self.tuning.v0_std ** 2
        # Per axis: position, velocity ("cv"), and the 2x2 covariance [[pp, pc], [pc, pv]].
        self._xp = [0.0] * n
        self._xv = [0.0] * n
        self._pp = [1.0] * n  # filterpy's prior P = I, until the first measurement
        self._pc = [0.0] * n
        self._pv = [1.0] * n
        self.t: float | None = None
        self.t_measured = -math.inf

    @property
    def x(self) -> np.ndarray[Any, Any]:
        """State estimate: positions, then velocities for "cv" (a new array)."""
        import numpy as np

        return np.array(self._xp + self._xv if self._cv else self._xp, dtype=float)

    @property
    def P(self) -> np.ndarray[Any, Any]:  # filterpy's name
        """State covariance (a new array; the cross-axis terms are exactly zero)."""
        import numpy as np

        n = self._n
        if not self._cv:
            return np.diag(np.array(self._pp, dtype=float))
        idx = np.arange(n)
        P = np.zeros((2 * n, 2 * n))
        P[idx, idx] = self._pp
        P[idx, idx + n] = self._pc
        P[idx + n, idx] = self._pc
        P[idx + n, idx + n] = self._pv
        return P

    @property
    def predicted_for_s(self) -> float:
        """Seconds from the last measurement to the estimator's current time; inf if none."""
        return math.inf if self.t is None else self.t - self.t_measured

    def exceeds_bound(self) -> bool:
        """Predicted longer than the channel's predict_max_s (or never measured)."""
        return self.predicted_for_s > self.channel.predict_max_s

    def predict(self, now: float) -> None:
        """Advance the estimate to `now` without a measurement (no-op if now is not later)."""
        if self.t is None or not self.measured:
            self.t = now if self.t is None else max(self.t, now)
            return
        dt = now - self.t
        if dt <= 0:
            return
        q = self._q
        pp = self._pp
        if self._cv:
            # F P Fᵀ + Q with F = [[1, dt], [0, 1]], Q = q [[dt³/3, dt²/2], [dt²/2, dt]].
            q3, q2, q1 = (q * dt ** 3) * _THIRD, (q * dt * dt) * 0.5, q * dt
            xv, pc, pv = self._xv, self._pc, self._pv
            self._xp = [p + dt * v for p, v in zip(self._xp, xv, strict=True)]
            cdv = [c + dt * v for c, v in zip(pc, pv, strict=True)]
            self._pp = [p + dt * c + dt * cv + q3 for p, c, cv in zip(pp, pc, cdv, strict=True)]
            self._pc = [cv + q2 for cv in cdv]
            self._pv = [v + q1 for v in pv]
        else:
            q1 = q * dt
            self._pp = [p + q1 for p in pp]
        self.t = now

    @property
    def measured(self) -> bool:
        return self.t_measured > -math.inf

    def update(self, z: Sequence[float] | None, now: float) -> None:
        """Predict to `now`, then correct with z; z=None is a predict-only step.

        A measurement older than the estimate's time is applied at the estimate's time (the
        filter never runs backwards; the hub feeds it in time order).
        """
        if z is None or not self._cv or not self.measured:
            self.predict(now)
        elif self.t is not None and now > self.t:
            # The "cv" predict below, fused into the update's per-axis loop (the hub's 100 Hz
            # step on the link reader thread); the same arithmetic as predict().
            if len(z) != self._n:
                raise ValueError(f"{self.channel.name}: expected {self._n} values, got {len(z)}")
            self._predict_update_cv([float(v) for v in z], now)
            return
        if z is None:
            return
        if len(z) != self._n:
            raise ValueError(f"{self.channel.name}: expected {self._n} values, got {len(z)}")
        zz = [float(v) for v in z]
        n = self._n
        if not self.measured:
            self._xp = zz
            self._xv = [0.0] * n
            self._pp = list(self._r)
            self._pc = [0.0] * n
            self._pv = [self._v0_var if self._cv else 0.0] * n
        elif self._cv:
            xp, xv, pp, pc, pv, r = self._xp, self._xv, self._pp, self._pc, self._pv, self._r
            for i in range(n):
                p, c, v, ri = pp[i], pc[i], pv[i], r[i]
                si = 1.0 / (p + ri)
                kp, kv = p * si, c * si
                y = zz[i] - xp[i]
                xp[i] += kp * y
                xv[i] += kv * y
                # Joseph form: (I - K H) P (I - K H)ᵀ + K R Kᵀ.
                a = 1.0 - kp
                pp[i] = a * p * a + kp * ri * kp
                pc[i] = a * c - a * p * kv + kp * ri * kv
                pv[i] = (kv * p - c) * kv - kv * c + v + kv * ri * kv
        else:
            xp, pp, r = self._xp, self._pp, self._r
            for i in range(n):
                p, ri = pp[i], r[i]
                k = p * (1.0 / (p + ri))
                xp[i] += k * (zz[i] - xp[i])
                a = 1.0 - k
                pp[i] = a * p * a + k * ri * k
        self.t_measured = self.t if self.t is not None else now

    def _predict_update_cv(self, zz: list[float], now: float) -> None:
        """predict(now) then the "cv" correction with zz, one loop over the axes."""
        assert self.t is not None
        dt = now - self.t
        q = self._q
        q3, q2, q1 = (q * dt ** 3) * _THIRD, (q * dt * dt) * 0.5, q * dt
        xp, xv, pp, pc, pv, r = self._xp, self._xv, self._pp, self._pc, self._pv, self._r
        for i in range(self._n):
            c0, v0, ri = pc[i], pv[i], r[i]
            cdv = c0 + dt * v0
            p = pp[i] + dt * c0 + dt * cdv + q3
            c = cdv + q2
            v = v0 + q1
            si = 1.0 / (p + ri)
            kp, kv = p * si, c * si
            y = zz[i] - (xp[i] + dt * xv[i])
            xp[i] = xp[i] + dt * xv[i] + kp * y
            xv[i] += kv * y
            a = 1.0 - kp
            pp[i] = a * p * a + kp * ri * kp
            pc[i] = a * c - a * p * kv + kp * ri * kv
            pv[i] = (kv * p - c) * kv - kv * c + v + kv * ri * kv
        self.t = now
        self.t_measured = now

    def state(self) -> EstimatorState:
        """An immutable copy of the posterior for other threads."""
        n = self._n
        cv = self._cv
        zeros = (0.0,) * n
        return EstimatorState(
            channel=self.channel.name,
            model=self.tuning.model,
            t=self.t if self.t is not None else -math.inf,
            t_measured=self.t_measured,
            pos=tuple(self._xp),
            vel=tuple(self._xv) if cv else zeros,
            var_pos=tuple(self._pp),
            cov_pos_vel=tuple(self._pc) if cv else zeros,
            var_vel=tuple(self._pv) if cv else zeros,
            q=self._q,
            predict_max_s=self.channel.predict_max_s,
            velocity_gate=self.tuning.velocity_gate if cv else 0.0,
        )


class EstimatorBank:
    """One ChannelEstimator per `on_loss = "predict"` channel of a robot."""

    def __init__(self, estimators: Mapping[str, ChannelEstimator]) -> None:
        self._by_name = dict(estimators)

    @classmethod
    def create(cls, robot: RobotDescription,
               tuning: Mapping[str, EstimatorTuning] | None = None) -> EstimatorBank:
        """Build the estimators (plain Python: neither filterpy nor numpy is imported)."""
        tuning = tuning or {}
        unknown = set(tuning) - {s.name for s in robot.sensors if s.on_loss == "predict"}
        if unknown:
            raise ValueError(f"tuning for channels that are not predicted: {sorted(unknown)}")
        return cls({s.name: ChannelEstimator(s, tuning.get(s.name))
                    for s in robot.sensors if s.on_loss == "predict"})

    def get(self, name: str) -> ChannelEstimator | None:
        return self._by_name.get(name)

    def __contains__(self, name: object) -> bool:
        return name in self._by_name

    def __iter__(self) -> Iterator[str]:
        return iter(self._by_name)

    def __len__(self) -> int:
        return len(self._by_name)

"""Kalman estimators for the sensor channels with `on_loss = "predict"` (filterpy, loaded lazily).

Kinematic channels (unit m or rad: object pose, joint encoders) use a constant-velocity model,
the others (wrist force) a constant-position random walk — a force does not keep its trend.
`ChannelEstimator` wraps `filterpy.kalman.KalmanFilter` with explicit time: `predict(now)`,
`update(z, now)` with `z=None` meaning "no measurement", public `x` and `P`, `predicted_for_s`
and `exceeds_bound()` (predicted past the channel's predict_max_s: the caller stops).

filterpy pulls in scipy (~600 ms), so neither it nor numpy is imported with this module: the
first `ChannelEstimator` (normally `EstimatorBank.create`, in the background after READY) does.
`state()` hands out an immutable `EstimatorState` that other threads extrapolate in plain
Python without touching the filter.
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
    """One channel's Kalman filter with explicit time; single-threaded (its owner's thread)."""

    def __init__(self, channel: SensorChannel, tuning: EstimatorTuning | None = None) -> None:
        # Heavy imports, here and not at the top: only when an estimator is really built.
        import numpy
        from filterpy.kalman import KalmanFilter

        self.channel = channel
        self.tuning = tuning or EstimatorTuning.default(channel)
        n = channel.dim
        self._n = n
        self._np: Any = numpy
        dim_x = 2 * n if self.tuning.model == "cv" else n
        kf = KalmanFilter(dim_x=dim_x, dim_z=n)
        kf.H = numpy.zeros((n, dim_x))
        kf.H[:, :n] = numpy.eye(n)
        kf.R = numpy.eye(n) * max(channel.noise_std, 1e-9) ** 2
        self._kf: Any = kf
        # F(dt) = I + dt*D and Q(dt) = q*(dt^3*Q3 + dt^2*Q2 + dt*Q1): constant parts built once.
        eye, zero = numpy.eye(n), numpy.zeros((n, n))
        if self.tuning.model == "cv":
            self._eye = numpy.eye(2 * n)
            self._d = numpy.block([[zero, eye], [zero, zero]])
            self._q3 = numpy.block([[eye / 3, zero], [zero, zero]])
            self._q2 = numpy.block([[zero, eye / 2], [eye / 2, zero]])
            self._q1 = numpy.block([[zero, zero], [zero, eye]])
        else:
            self._eye, self._d = eye, zero
            self._q3, self._q2, self._q1 = zero, zero, eye
        self.t: float | None = None
        self.t_measured = -math.inf

    @property
    def x(self) -> np.ndarray[Any, Any]:
        """State estimate: positions, then velocities for "cv" (a copy)."""
        return self._kf.x.ravel().copy()  # type: ignore[no-any-return]

    @property
    def P(self) -> np.ndarray[Any, Any]:  # filterpy's name
        """State covariance (a copy)."""
        return self._kf.P.copy()  # type: ignore[no-any-return]

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
        q = self.tuning.q
        noise = (q * dt ** 3) * self._q3 + (q * dt * dt) * self._q2 + (q * dt) * self._q1
        self._kf.predict(F=self._eye + dt * self._d, Q=noise)
        self.t = now

    @property
    def measured(self) -> bool:
        return self.t_measured > -math.inf

    def update(self, z: Sequence[float] | None, now: float) -> None:
        """Predict to `now`, then correct with z; z=None is a predict-only step.

        A measurement older than the estimate's time is applied at the estimate's time (the
        filter never runs backwards; the hub feeds it in time order).
        """
        self.predict(now)
        if z is None:
            return
        if len(z) != self._n:
            raise ValueError(f"{self.channel.name}: expected {self._n} values, got {len(z)}")
        np = self._np
        zz = np.asarray(z, dtype=float)
        if not self.measured:
            n = self._n
            if self.tuning.model == "cv":
                self._kf.x = np.concatenate([zz, np.zeros(n)]).reshape(-1, 1)
                self._kf.P = np.diag([self._kf.R[0, 0]] * n + [self.tuning.v0_std ** 2] * n)
            else:
                self._kf.x = zz.reshape(-1, 1)
                self._kf.P = self._kf.R.copy()
        else:
            self._kf.update(zz.reshape(-1, 1))
        self.t_measured = self.t if self.t is not None else now

    def state(self) -> EstimatorState:
        """An immutable copy of the posterior for other threads."""
        n = self._n
        x = self._kf.x.ravel().tolist()
        diag = self._kf.P.diagonal().tolist()
        cross = self._kf.P.diagonal(n).tolist()
        cv = self.tuning.model == "cv"
        zeros = (0.0,) * n
        return EstimatorState(
            channel=self.channel.name,
            model=self.tuning.model,
            t=self.t if self.t is not None else -math.inf,
            t_measured=self.t_measured,
            pos=tuple(x[:n]),
            vel=tuple(x[n:2 * n]) if cv else zeros,
            var_pos=tuple(diag[:n]),
            cov_pos_vel=tuple(cross) if cv else zeros,
            var_vel=tuple(diag[n:]) if cv else zeros,
            q=self.tuning.q,
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
        """Build the estimators (this is the call that imports filterpy and scipy)."""
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

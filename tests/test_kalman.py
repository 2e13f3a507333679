"""Kalman estimators: tracking, prediction through dropouts, bounds, no filterpy at run time
(filterpy is the dev extra's reference the closed form is checked against)."""

from __future__ import annotations

import dataclasses
import math
import random
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from edge_agent.robot import RobotDescription, SensorChannel, load_robot
from edge_agent.sensors.kalman import (
    ChannelEstimator,
    EstimatorBank,
    EstimatorState,
    EstimatorTuning,
)

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def robot() -> RobotDescription:
    return load_robot(REPO / "configs" / "robot" / "edge-arm-4.toml")


def _track(est: ChannelEstimator, truth: Callable[[float], tuple[float, ...]],
           rng: random.Random, t0: float, t1: float, rate: float, noise: float) -> float:
    """Feed noisy samples of truth(t) from t0 to t1; return the last sample time."""
    t = t0
    n = round((t1 - t0) * rate)
    for k in range(n + 1):
        t = t0 + k / rate
        est.update([v + rng.gauss(0.0, noise) for v in truth(t)], t)
    return t


def test_bank_builds_one_estimator_per_predicted_channel(robot: RobotDescription) -> None:
    bank = EstimatorBank.create(robot)
    assert set(bank) == {"joint_encoders", "wrist_force", "object_pose"}
    assert len(bank) == 3 and "joint_currents" not in bank
    obj, force, enc = bank.get("object_pose"), bank.get("wrist_force"), bank.get("joint_encoders")
    assert obj is not None and force is not None and enc is not None
    assert obj.tuning.model == "cv" and enc.tuning.model == "cv" and force.tuning.model == "cp"
    assert enc.x.shape == (8,) and obj.x.shape == (6,) and force.x.shape == (1,)
    with pytest.raises(ValueError):
        EstimatorBank.create(robot, {"joint_currents": EstimatorTuning("cp", 1.0)})


def test_tracks_a_moving_object_and_predicts_through_a_dropout(robot: RobotDescription) -> None:
    est = ChannelEstimator(robot.sensor("object_pose"))
    rng = random.Random(42)
    p0, vel = (0.30, 0.10, 0.05), (0.10, -0.05, 0.02)

    def truth(t: float) -> tuple[float, ...]:
        return tuple(p + v * t for p, v in zip(p0, vel, strict=True))

    t = _track(est, truth, rng, 0.0, 4.0, rate=30.0, noise=0.002)
    assert math.dist(est.x[:3], truth(t)) < 0.004  # better than 2 sigma of one sample
    vel_std = np.sqrt(np.diag(est.P)[3:])
    assert all(abs(e - v) < 3 * s for e, v, s in zip(est.x[3:], vel, vel_std, strict=True))
    assert all(s < 0.05 for s in vel_std)
    state = est.state()
    # Half a second without measurements: the estimate keeps moving, the last sample does not.
    for k in range(1, 16):
        est.update(None, t + k / 30.0)
    later = t + 0.5
    predicted_error = math.dist(est.x[:3], truth(later))
    hold_error = math.dist(state.pos, truth(later))
    assert predicted_error < 0.5 * hold_error
    assert all(predicted_error < 3 * s for s in state.std_at(later))
    assert est.predicted_for_s == pytest.approx(0.5) and not est.exceeds_bound()
    est.predict(t + robot.sensor("object_pose").predict_max_s + 0.01)
    assert est.exceeds_bound()
    # A measurement ends the prediction.
    est.update(truth(t + 1.1), t + 1.1)
    assert est.predicted_for_s == 0.0 and not est.exceeds_bound()


def test_force_is_not_extrapolated(robot: RobotDescription) -> None:
    est = ChannelEstimator(robot.sensor("wrist_force"))
    t = _track(est, lambda t: (20.0 * t,), random.Random(1), 0.0, 0.5, rate=1000.0, noise=0.05)
    assert est.x[0] == pytest.approx(10.0, abs=0.2)
    est.predict(t + 0.4)
    assert est.x[0] == pytest.approx(10.0, abs=0.2)  # constant position: no trend
    assert est.P[0, 0] > 0.1  # but the uncertainty grows


def test_state_extrapolates_like_the_filter(robot: RobotDescription) -> None:
    channel = robot.sensor("joint_encoders")
    tuning = dataclasses.replace(EstimatorTuning.default(channel), velocity_gate=0.0)
    est = ChannelEstimator(channel, tuning)
    _track(est, lambda t: (0.5 * t, -t, 0.2, 1.5 * t), random.Random(5), 0.0, 0.2, 1000.0, 1e-4)
    state = est.state()
    assert isinstance(state, EstimatorState) and state.measured
    est.predict(state.t + 0.008)
    assert state.value_at(state.t + 0.008) == pytest.approx(tuple(est.x[:4]), abs=1e-12)
    assert state.std_at(state.t + 0.008) == pytest.approx(np.sqrt(np.diag(est.P)[:4]), rel=1e-9)
    assert state.predicted_for(state.t + 0.008) == pytest.approx(est.predicted_for_s)
    assert est.x[4:] == pytest.approx((0.5, -1.0, 0.0, 1.5), abs=0.1)
    assert not state.exceeds_bound(state.t + 0.009) and state.exceeds_bound(state.t + 0.011)


def test_a_still_object_is_not_made_to_drift(robot: RobotDescription) -> None:
    """The velocity of a still part is noise; predictions ignore an insignificant velocity."""
    drift, gated = [], []
    for seed in range(20):
        est = ChannelEstimator(robot.sensor("object_pose"))
        t = _track(est, lambda t: (0.3, 0.1, 0.02), random.Random(seed), 0.0, 3.0, 30.0, 0.002)
        state = est.state()
        est.predict(t + 1.0)
        drift.append(math.dist(est.x[:3], (0.3, 0.1, 0.02)))
        gated.append(math.dist(state.value_at(t + 1.0), (0.3, 0.1, 0.02)))
    assert sorted(gated)[-3] < 0.01  # 17 of 20 within 1 cm after a second
    assert sum(gated) < 0.5 * sum(drift)


def test_never_measured_is_past_any_bound(robot: RobotDescription) -> None:
    est = ChannelEstimator(robot.sensor("object_pose"))
    assert est.predicted_for_s == math.inf and est.exceeds_bound()
    est.predict(5.0)
    assert est.exceeds_bound() and not est.state().measured


def test_time_never_runs_backwards(robot: RobotDescription) -> None:
    est = ChannelEstimator(robot.sensor("wrist_force"))
    est.update([1.0], 1.0)
    est.predict(2.0)
    est.update([3.0], 1.5)  # older than the estimate: applied at t = 2.0
    assert est.t == 2.0 and est.predicted_for_s == 0.0
    with pytest.raises(ValueError):
        est.update([1.0, 2.0], 2.1)


def _imports_after(code: str) -> set[str]:
    out = subprocess.run(
        [sys.executable, "-c", code + "\nimport sys\n"
         "print(' '.join(m for m in ('filterpy', 'scipy', 'numpy') if m in sys.modules))"],
        cwd=REPO, capture_output=True, text=True, timeout=60, check=True)
    return set(out.stdout.split())


def test_importing_the_hub_or_kalman_module_does_not_import_filterpy() -> None:
    loaded = _imports_after("import edge_agent.sensors.hub, edge_agent.sensors.kalman")
    assert not loaded & {"filterpy", "scipy"}, loaded


def test_a_hub_with_its_estimators_imports_neither_filterpy_nor_numpy() -> None:
    """The hub builds its estimators at construction (the daemon's start-up path): the closed
    form is plain Python; reading the state as matrices (`x`, `P`) imports numpy, never filterpy
    (not installed on a robot: it is the tests' reference, pyproject's dev extra)."""
    robot = "load_robot('configs/robot/edge-arm-4.toml')"
    loaded = _imports_after(
        "from edge_agent.robot import load_robot\n"
        "from edge_agent.sensors.hub import SensorHub\n"
        f"hub = SensorHub({robot})\n"
        "from edge_agent.sensors.kalman import EstimatorBank\n"
        f"EstimatorBank.create({robot}).get('object_pose').update([0.1, 0.2, 0.3], 1.0)")
    assert not loaded & {"filterpy", "scipy", "numpy"}, loaded
    loaded = _imports_after(
        "from edge_agent.robot import load_robot\n"
        "from edge_agent.sensors.kalman import EstimatorBank\n"
        f"est = EstimatorBank.create({robot}).get('object_pose')\n"
        "est.update([0.1, 0.2, 0.3], 1.0)\nest.predict(1.1)\nest.x, est.P")
    assert "numpy" in loaded and not loaded & {"filterpy", "scipy"}, loaded


class _FilterpyReference:
    """The estimator as filterpy runs it (matrix predict/update): what the closed form equals."""

    def __init__(self, channel: SensorChannel, tuning: EstimatorTuning) -> None:
        from filterpy.kalman import KalmanFilter

        n = channel.dim
        self.n, self.tuning, self.cv = n, tuning, tuning.model == "cv"
        dim_x = 2 * n if self.cv else n
        self.kf = kf = KalmanFilter(dim_x=dim_x, dim_z=n)
        kf.H = np.zeros((n, dim_x))
        kf.H[:, :n] = np.eye(n)
        kf.R = np.eye(n) * max(channel.noise_std, 1e-9) ** 2
        eye, zero = np.eye(n), np.zeros((n, n))
        if self.cv:
            self.eye, self.d = np.eye(2 * n), np.block([[zero, eye], [zero, zero]])
            self.q3 = np.block([[eye / 3, zero], [zero, zero]])
            self.q2 = np.block([[zero, eye / 2], [eye / 2, zero]])
            self.q1 = np.block([[zero, zero], [zero, eye]])
        else:
            self.eye, self.d, self.q3, self.q2, self.q1 = eye, zero, zero, zero, eye
        self.t: float | None = None
        self.measured = False

    def update(self, z: list[float] | None, now: float) -> None:
        kf = self.kf
        if self.t is None or not self.measured:
            self.t = now if self.t is None else max(self.t, now)
        elif now > self.t:
            dt, q = now - self.t, self.tuning.q
            noise = (q * dt ** 3) * self.q3 + (q * dt * dt) * self.q2 + (q * dt) * self.q1
            kf.predict(F=self.eye + dt * self.d, Q=noise)
            self.t = now
        if z is None:
            return
        zz = np.asarray(z, dtype=float)
        if not self.measured:
            if self.cv:
                kf.x = np.concatenate([zz, np.zeros(self.n)]).reshape(-1, 1)
                kf.P = np.diag([kf.R[0, 0]] * self.n + [self.tuning.v0_std ** 2] * self.n)
            else:
                kf.x = zz.reshape(-1, 1)
                kf.P = kf.R.copy()
            self.measured = True
        else:
            kf.update(zz.reshape(-1, 1))


@pytest.mark.parametrize("name", ["joint_encoders", "object_pose", "wrist_force"])
def test_closed_form_equals_filterpy(robot: RobotDescription, name: str) -> None:
    """The per-axis closed form is filterpy's KalmanFilter, to 1e-9, through dropouts, irregular
    steps, repeated and out-of-order times, and a state read at every step."""
    channel = robot.sensor(name)
    tuning = EstimatorTuning.default(channel)
    est, ref = ChannelEstimator(channel, tuning), _FilterpyReference(channel, tuning)
    rng = random.Random(hash(name) & 0xFFFF)
    period = 1.0 / channel.rate_hz
    t = 0.0
    np.testing.assert_allclose(est.x, ref.kf.x.ravel())
    np.testing.assert_allclose(est.P, ref.kf.P)
    for k in range(3000):
        r = rng.random()
        t += period * (rng.choice((1, 1, 1, 2, 10)) if r > 0.02 else -0.5)  # some go backwards
        if 1000 <= k < 1200 or r < 0.1:  # a long dropout and scattered missing samples
            z = None
        else:
            z = [math.sin(t * (i + 1)) + rng.gauss(0.0, channel.noise_std + 1e-3)
                 for i in range(channel.dim)]
        est.update(z, t)
        ref.update(z, t)
        np.testing.assert_allclose(est.x, ref.kf.x.ravel(), rtol=1e-9, atol=1e-12)
        np.testing.assert_allclose(est.P, ref.kf.P, rtol=1e-9, atol=1e-15)
        assert est.t == ref.t
    state = est.state()
    n = channel.dim
    P = ref.kf.P
    assert state.pos == pytest.approx(tuple(ref.kf.x.ravel()[:n]), rel=1e-9)
    assert state.var_pos == pytest.approx(tuple(P.diagonal()[:n]), rel=1e-9)
    if tuning.model == "cv":
        assert state.vel == pytest.approx(tuple(ref.kf.x.ravel()[n:]), rel=1e-9, abs=1e-12)
        assert state.cov_pos_vel == pytest.approx(tuple(P.diagonal(n)), rel=1e-9, abs=1e-15)
        assert state.var_vel == pytest.approx(tuple(P.diagonal()[n:]), rel=1e-9)

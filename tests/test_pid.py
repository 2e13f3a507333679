"""PID loop and joint position controller, on simple simulated plants."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from edge_agent.executor.kinematics import ArmKinematics, IKFailure
from edge_agent.executor.pid import (
    PID,
    JointGains,
    JointPositionController,
)
from edge_agent.robot import RobotDescription, load_robot

ROBOT = load_robot(Path(__file__).resolve().parents[1] / "configs" / "robot" / "edge-arm-4.toml")


def _first_order(y: float, u: float, tau: float, dt: float) -> float:
    return y + (u - y) * dt / tau


# --------------------------------------------------------------------------- PID


def test_step_response_converges_without_steady_error() -> None:
    pid = PID(2.0, 1.5, 0.05, output_limits=(-10.0, 10.0))
    y, dt = 0.0, 0.01
    trace = []
    for _ in range(1500):
        y = _first_order(y, pid.update(1.0, y, dt), tau=0.5, dt=dt)
        trace.append(y)
    assert abs(trace[-1] - 1.0) < 1e-3
    assert max(trace) < 1.2  # a modest overshoot, not an oscillation


def test_no_windup_after_a_long_saturation() -> None:
    pid = PID(1.0, 2.0, output_limits=(-1.0, 1.0))
    y, dt = 0.0, 0.01
    for _ in range(10_000):  # 100 s asking for 5 from a plant that tops out at 1
        u = pid.update(5.0, y, dt)
        y = _first_order(y, u, tau=0.2, dt=dt)
    assert u == 1.0
    assert pid.components[1] <= 1.0
    # The setpoint drops below the measurement: the output leaves saturation at once.
    u = pid.update(0.5, y, dt)
    assert u < 1.0
    steps_high = 0
    for _ in range(500):
        u = pid.update(0.5, y, dt)
        y = _first_order(y, u, tau=0.2, dt=dt)
        steps_high += u >= 1.0
    assert steps_high == 0 and abs(y - 0.5) < 0.01


def test_integral_does_not_grow_while_the_proportional_term_saturates() -> None:
    pid = PID(1.0, 2.0, output_limits=(-1.0, 1.0))
    y = 0.0
    for _ in range(2000):
        y = _first_order(y, pid.update(5.0, y, 0.01), tau=0.2, dt=0.01)
    assert pid.components[1] == 0.0  # conditional integration: saturated from the first step
    trace = []
    for _ in range(1000):
        y = _first_order(y, pid.update(0.5, y, 0.01), tau=0.2, dt=0.01)
        trace.append(y)
    assert abs(trace[-1] - 0.5) < 0.01


def test_integral_is_clamped_to_its_own_limits() -> None:
    pid = PID(0.0, 10.0, output_limits=(-5.0, 5.0), integral_limits=(-0.5, 0.5))
    for _ in range(1000):
        out = pid.update(1.0, 0.0, 0.01)
    assert out == 0.5 and pid.components[1] == 0.5


def test_setpoint_step_gives_no_derivative_kick() -> None:
    pid = PID(1.0, 0.0, 5.0)
    assert pid.update(0.0, 0.0, 0.01) == 0.0
    assert pid.update(1.0, 0.0, 0.01) == pytest.approx(1.0)  # only kp * error
    # A measurement step does act: -kd * dmeas/dt.
    assert pid.update(1.0, 0.1, 0.01) == pytest.approx(0.9 - 5.0 * 0.1 / 0.01)


def test_derivative_low_pass_smooths_a_measurement_step() -> None:
    raw, smooth = PID(0.0, 0.0, 1.0), PID(0.0, 0.0, 1.0, derivative_tau_s=0.09)
    for pid in (raw, smooth):
        pid.update(0.0, 0.0, 0.01)
    kick_raw, kick_smooth = raw.update(0.0, 0.1, 0.01), smooth.update(0.0, 0.1, 0.01)
    assert kick_raw == pytest.approx(-10.0) and kick_smooth == pytest.approx(-1.0)
    assert smooth.update(0.0, 0.1, 0.01) == pytest.approx(-0.9)  # decays with the filter


def test_reset_clears_integral_and_derivative_memory() -> None:
    pid = PID(1.0, 1.0, 1.0)
    for k in range(100):
        pid.update(1.0, k * 0.001, 0.01)
    pid.reset()
    assert pid.last_output == 0.0 and pid.components == (0.0, 0.0, 0.0)
    # The first step after a reset is proportional plus one step of integral: no derivative.
    assert pid.update(1.0, 0.5, 0.01) == pytest.approx(0.5 + 0.5 * 0.01)


def test_manual_mode_and_bumpless_return() -> None:
    pid = PID(1.0, 1.0)
    out = pid.update(1.0, 0.0, 0.1)
    pid.set_auto_mode(False)
    assert pid.update(5.0, -5.0, 0.1) == out  # manual: the loop does not run
    pid.set_auto_mode(True, last_output=0.7)
    assert pid.update(2.0, 2.0, 0.1) == pytest.approx(0.7)  # continues from the manual output


def test_gain_change_is_bumpless() -> None:
    pid = PID(1.0, 2.0)
    for _ in range(50):
        out = pid.update(1.0, 1.0 - 0.001, 0.01)
    before = pid.update(1.0, 1.0, 0.01)
    pid.set_gains(1.0, 10.0, 0.0)
    assert pid.update(1.0, 1.0, 0.01) == pytest.approx(before)
    assert out == pytest.approx(before, abs=0.01)


def test_bad_inputs_are_refused() -> None:
    pid = PID(1.0, 1.0)
    assert pid.update(1.0, 0.0, 0.0) == 0.0  # dt == 0: nothing happens
    for bad in (-0.01, math.nan, math.inf):
        with pytest.raises(ValueError):
            pid.update(1.0, 0.0, bad)
    with pytest.raises(ValueError):
        pid.update(math.nan, 0.0, 0.01)
    with pytest.raises(ValueError):
        PID(-1.0)
    with pytest.raises(ValueError):
        PID(1.0, output_limits=(1.0, -1.0))


# --------------------------------------------------------------------------- joint controller


class Firmware:
    """A position-tracking drive: first-order lag, velocity limit, optional sag and blocking."""

    def __init__(self, robot: RobotDescription, q: tuple[float, ...], tau: float = 0.03,
                 sag: float = 0.0) -> None:
        self.robot, self.q, self.tau, self.sag = robot, list(q), tau, sag
        self.blocked = False

    def step(self, setpoint: tuple[float, ...], dt: float) -> tuple[float, ...]:
        if not self.blocked:
            for i, j in enumerate(self.robot.joints):
                v = (setpoint[i] - self.sag - self.q[i]) / self.tau
                v = max(-j.velocity_max_rad_s, min(j.velocity_max_rad_s, v))
                self.q[i] += v * dt
        return tuple(self.q)


def _ik(target: tuple[float, float, float]) -> tuple[float, ...]:
    q = ArmKinematics.of(ROBOT).inverse(target)
    assert not isinstance(q, IKFailure)
    return q


def _run(ctrl: JointPositionController, fw: Firmware, target_q: tuple[float, ...],
         ticks: int, dt: float = 0.005) -> list[tuple[float, ...]]:
    meas = tuple(fw.q)
    out = []
    for _ in range(ticks):
        meas = fw.step(ctrl.update(target_q, meas, dt), dt)
        out.append(meas)
    return out


def test_joint_controller_reaches_an_ik_target() -> None:
    kin = ArmKinematics.of(ROBOT)
    target_xyz = (0.42, -0.15, 0.05)
    target_q = _ik(target_xyz)
    fw = Firmware(ROBOT, ROBOT.home)
    ctrl = JointPositionController(ROBOT, JointGains(kp=4.0, kd=0.05))
    trace = _run(ctrl, fw, target_q, ticks=1200)  # 6 s at 200 Hz
    assert kin.tool_error(trace[-1], target_xyz) < 1e-4
    assert ctrl.converged(target_q, trace[-1], tol_rad=1e-4)
    for i in range(4):  # no joint overshoots its target by more than a hair
        start, goal = ROBOT.home[i], target_q[i]
        sign = 1 if goal >= start else -1
        assert max(sign * (q[i] - goal) for q in trace) < 0.01


def test_joint_controller_removes_a_steady_tracking_offset() -> None:
    target_q = _ik((0.35, 0.2, 0.15))
    fw = Firmware(ROBOT, ROBOT.home, sag=0.03)  # the drive settles 0.03 rad short
    ctrl = JointPositionController(ROBOT, JointGains(kp=4.0, ki=4.0))
    trace = _run(ctrl, fw, target_q, ticks=2000)
    assert max(abs(a - b) for a, b in zip(trace[-1], target_q, strict=True)) < 1e-4


@pytest.mark.parametrize("ki, overshoot", [(0.0, 1e-9), (4.0, 0.2)])
def test_blocked_arm_does_not_build_a_far_setpoint(ki: float, overshoot: float) -> None:
    target_q = _ik((0.45, 0.25, 0.05))
    fw = Firmware(ROBOT, ROBOT.home)
    ctrl = JointPositionController(ROBOT, JointGains(kp=4.0, ki=ki),
                                   max_following_error_rad=0.2)
    fw.blocked = True
    _run(ctrl, fw, target_q, ticks=1000)
    sp = ctrl.setpoint
    assert sp is not None
    assert max(abs(a - b) for a, b in zip(sp, ROBOT.home, strict=True)) <= 0.2 + 1e-12
    fw.blocked = False  # released: it moves on to the target without a wound-up overshoot
    trace = _run(ctrl, fw, target_q, ticks=1500)
    assert ctrl.converged(target_q, trace[-1], tol_rad=1e-4)
    for i in range(4):
        sign = 1 if target_q[i] >= ROBOT.home[i] else -1
        assert max(sign * (q[i] - target_q[i]) for q in trace) < overshoot


def test_reset_starts_from_the_measured_pose() -> None:
    ctrl = JointPositionController(ROBOT)
    ctrl.update(_ik((0.45, 0.0, 0.1)), ROBOT.home, 0.005)
    measured = (0.3, 1.0, -1.5, -1.0)
    assert ctrl.reset(measured) == measured
    first = ctrl.update(measured, measured, 0.005)
    assert first == pytest.approx(measured)  # at the target already: no stale motion
    # A measured pose past a limit starts from the limit.
    assert ctrl.reset((3.0, 1.0, -1.5, -1.0))[0] == 2.8


angles = st.floats(-7.0, 7.0, allow_nan=False)
poses = st.tuples(angles, angles, angles, angles)


@settings(deadline=None, max_examples=200)
@given(start=poses, speed=st.floats(0.05, 1.0),
       lead=st.one_of(st.none(), st.floats(0.01, 1.0)),
       steps=st.lists(st.tuples(poses, poses, st.floats(1e-4, 0.05)), min_size=1, max_size=40))
def test_setpoints_never_jump_and_never_leave_the_limits(
        start: tuple[float, ...], speed: float, lead: float | None,
        steps: list[tuple[tuple[float, ...], tuple[float, ...], float]]) -> None:
    ctrl = JointPositionController(ROBOT, JointGains(kp=40.0, ki=5.0, kd=0.5), speed_scale=speed,
                                   max_following_error_rad=lead)
    prev = ctrl.reset(start)
    for target, measured, dt in steps:
        sp = ctrl.update(target, measured, dt)
        for j, a, b in zip(ROBOT.joints, prev, sp, strict=True):
            assert j.position_min_rad <= b <= j.position_max_rad
            assert abs(b - a) <= j.velocity_max_rad_s * speed * dt * (1 + 1e-9) + 1e-15
        prev = sp


def test_joint_controller_checks_its_inputs() -> None:
    ctrl = JointPositionController(ROBOT)
    with pytest.raises(ValueError):
        ctrl.update((0.0, 1.0, -1.0), ROBOT.home, 0.005)
    with pytest.raises(ValueError):
        ctrl.update(ROBOT.home, (math.nan, 1.0, -1.0, 0.0), 0.005)
    with pytest.raises(ValueError):
        JointPositionController(ROBOT, speed_scale=0.0)
    with pytest.raises(ValueError):
        JointPositionController(ROBOT, [JointGains()] * 3)

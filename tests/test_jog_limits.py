"""JogController's limits, pure: the setpoint keeps the tool in the workspace box and the joints in
their soft limits; a pose already outside may only move back in (the daemon test is
tests/test_jog_limits_daemon.py)."""

from __future__ import annotations

from pathlib import Path

from edge_agent.executor.kinematics import ArmKinematics
from edge_agent.executor.manual import JogController, JogFrame
from edge_agent.robot import load_robot

ROBOT = load_robot(Path(__file__).resolve().parents[1] / "configs" / "robot" / "edge-arm-4.toml")
KIN = ArmKinematics.of(ROBOT)
DT = 0.005


def _jog(jog: JogController, q: tuple[float, ...], v: list[float], s: float,
         t: float = 0.0) -> tuple[float, ...]:
    """Jog at `v` for `s` seconds with a servo that follows the setpoint exactly."""
    for k in range(int(s / DT)):
        now = t + k * DT
        if k % 20 == 0:
            assert jog.command(now, JogFrame.JOINT, v, 200) is None
        sp, lost = jog.update(now, q, DT)
        assert not lost and sp is not None
        q = sp
    return q


def test_saturating_joint_jogs_stop_at_the_box_and_the_soft_limits() -> None:
    jog = JogController(ROBOT, KIN, speed_fraction=1.0)
    q = ROBOT.home
    ws = ROBOT.workspace
    for joint in range(ROBOT.n_joints):
        for sign in (1.0, -1.0):
            v = [0.0] * ROBOT.n_joints
            v[joint] = 5.0 * sign
            q = _jog(jog, q, v, 6.0)
            for qi, (lo, hi) in zip(q, ROBOT.soft_limits(), strict=True):
                assert lo - 1e-9 <= qi <= hi + 1e-9, (joint, sign, q)
            assert ws.contains(KIN.forward(q)[:3]), (joint, sign, KIN.forward(q))


def test_a_pose_outside_may_only_move_back_in() -> None:
    jog = JogController(ROBOT, KIN, speed_fraction=1.0)
    q = (0.0, 1.9, -1.2, -0.87)  # the shoulder up: the tool above the box
    z0 = KIN.forward(q)[2]
    assert z0 > ROBOT.workspace.max_m[2]
    up = _jog(jog, q, [0.0, 1.0, 0.0, 0.0], 0.5)
    assert up == q  # further out: not taken, and no jump back in either
    down = _jog(jog, q, [0.0, -1.0, 0.0, 0.0], 0.5)
    assert KIN.forward(down)[2] < z0

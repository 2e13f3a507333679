"""The simulated robot's physics: servo response, limits, currents, table, gripper, object."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from edge_agent.link.codec import GripperMode, Sensor, Status
from edge_agent.robot import RobotDescription, load_robot
from hil.lockstep import Lockstep
from hil.sim.config import RigConfig, load_rig
from hil.sim.harness import Session

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def robot() -> RobotDescription:
    return load_robot(ROOT / "configs/robot/edge-arm-4.toml")


def session(robot: RobotDescription, seed: int = 1, **kw: object) -> Session:
    s = Session(Lockstep(robot, seed=seed), **kw)  # type: ignore[arg-type]
    s.open()
    s.enable()
    return s


def test_default_rig_file_matches_built_in_defaults(robot: RobotDescription) -> None:
    assert load_rig(None, robot).replace(source="") == RigConfig()


def test_joint_step_follows_first_order_response_after_transport_delay(
        robot: RobotDescription) -> None:
    s = session(robot)
    fw, rig = s.r.fw, s.r.fw.rig
    start = list(fw.arm.q)
    step = 0.02  # small enough to stay clear of the velocity limit
    target = s.true_to_encoder([start[0] + step, *start[1:]])
    s.command(target, ttl_ms=2000)
    t_cmd = s.r.now + s.r.latency_us * 1e-6  # when the firmware receives it
    samples: list[tuple[float, float]] = []
    while s.r.now < t_cmd + 0.3:
        s.r.run_for(0.001)
        samples.append((s.r.now - t_cmd, fw.arm.q[0] - start[0]))
    delay, tau = rig.motor_transport_delay_s, rig.motor_time_constant_s

    def at(t: float) -> float:
        return min(samples, key=lambda x: abs(x[0] - t))[1]

    assert abs(at(delay - 0.002)) < 1e-9  # nothing moves before the delay has passed
    assert 0.55 * step < at(delay + tau) < 0.70 * step  # 1 - 1/e = 0.63 after one tau
    assert 0.90 * step < at(delay + 2.5 * tau) < 0.95 * step  # 1 - e^-2.5 = 0.918
    assert abs(at(0.29) - step) < 0.002 * step
    # the other joints hold still
    assert all(abs(a - b) < 1e-6 for a, b in zip(fw.arm.q[1:], start[1:], strict=True))  # f32


def test_velocity_limit_is_enforced_by_the_firmware(robot: RobotDescription) -> None:
    s = session(robot)
    fw = s.r.fw
    vmax = [j.velocity_max_rad_s for j in robot.joints]
    start = s.status().q
    far = [start[0] + 1.5, start[1] + 0.5, start[2] - 0.5, start[3] + 1.0]
    s.command(far, ttl_ms=3000)
    peak = [0.0] * 4
    reported_peak = [0.0] * 4
    while s.r.now < 1.5:
        s.r.run_for(0.001)
        peak = [max(p, abs(v)) for p, v in zip(peak, fw.arm.dq, strict=True)]
        st = s.status()
        reported_peak = [max(p, abs(v)) for p, v in zip(reported_peak, st.dq, strict=True)]
    for i in range(4):
        assert peak[i] <= vmax[i] + 1e-9
        assert peak[i] > 0.95 * vmax[i]  # it did saturate: the limit, not the servo, bounded it
        assert reported_peak[i] <= vmax[i] + 0.01


def test_position_limits_clamp_targets(robot: RobotDescription) -> None:
    s = session(robot)
    j = robot.joints[1]
    q = list(s.status().q)
    q[1] = j.position_max_rad + 1.0
    s.stream(q, 3.0)
    assert abs(s.status().q[1] - j.position_max_rad) < 0.01


def test_table_collision_raises_pitch_joint_currents_and_blocks(robot: RobotDescription) -> None:
    s = session(robot)
    fw = s.r.fw
    above = fw.arm.kin.tool_down_ik(0.35, 0.0, 0.05)
    below = fw.arm.kin.tool_down_ik(0.35, 0.0, -0.05)
    assert above is not None and below is not None
    s.stream(s.true_to_encoder(above), 2.0)
    free = s.status()
    imax = [j.current_max_a for j in robot.joints]
    assert all(abs(c) < 0.5 * m for c, m in zip(free.current, imax, strict=True))
    s.stream(s.true_to_encoder(below), 1.5)
    hit = s.status()
    assert fw.arm.penetration_m <= fw.rig.collision_max_penetration_m + 0.001
    assert fw.arm.tool[2] > -0.005  # the table held
    assert max(abs(c) / m for c, m in zip(hit.current[1:], imax[1:], strict=True)) > 0.8
    assert abs(hit.current[0]) < 0.5  # yaw carries no table load


def test_gravity_shows_in_the_shoulder_current(robot: RobotDescription) -> None:
    s = session(robot)
    fw = s.r.fw
    reach = fw.arm.kin.tool_down_ik(0.50, 0.0, 0.20)
    near = fw.arm.kin.tool_down_ik(0.25, 0.0, 0.20)
    assert reach is not None and near is not None
    far_current = s.stream(s.true_to_encoder(reach), 2.0).current[1]
    near_current = s.stream(s.true_to_encoder(near), 2.0).current[1]
    assert far_current > near_current + 0.3 > 0.3  # a longer lever needs more current


def _approach_object(s: Session) -> list[float]:
    """Open the gripper and put the tool around the cube; returns the grasp pose (true)."""
    fw = s.r.fw
    ox, oy, oz = fw.obj.xyz
    above = fw.arm.kin.tool_down_ik(ox, oy, oz + 0.10)
    at = fw.arm.kin.tool_down_ik(ox, oy, oz)
    assert above is not None and at is not None
    s.stream(s.true_to_encoder(above), 2.0, GripperMode.POSITION, 0.08)
    s.stream(s.true_to_encoder(at), 1.5, GripperMode.POSITION, 0.08)
    return at


def test_gripper_force_only_after_contact_then_object_follows_tool(
        robot: RobotDescription) -> None:
    s = session(robot, seed=3)
    fw = s.r.fw
    at = _approach_object(s)
    bias = fw.rig.biases_force_offset_n
    forces: list[tuple[float, float, bool]] = []
    end = s.r.now + 1.0
    while s.r.now < end:
        s.command(s.true_to_encoder(at), GripperMode.FORCE, 15.0, 2.0)
        s.r.run_for(0.005)
        st = s.status()
        forces.append((st.gripper_pos, st.gripper_force - bias, fw.gripper.contact))
    before = [f for w, f, c in forces if w > fw.obj.size + 0.001]
    after = [f for w, f, c in forces if c]
    assert before and after
    assert max(abs(f) for f in before) < 0.5  # noise only, while the fingers close
    assert after[-1] == pytest.approx(15.0, abs=1.0)
    assert forces[-1][0] == pytest.approx(fw.obj.size, abs=0.002)  # stopped at the cube
    assert fw.obj.grasped
    lift = fw.arm.kin.tool_down_ik(fw.obj.xyz[0], fw.obj.xyz[1], 0.15)
    assert lift is not None
    s.stream(s.true_to_encoder(lift), 2.0, GripperMode.FORCE, 15.0, 2.0)
    assert fw.obj.grasped and fw.obj.xyz[2] > 0.12
    # the camera sees it move with the tool
    s.r.run_for(0.2)
    pose = s.host.last(Sensor)
    assert pose is not None and pose.valid
    assert pose.values[2] > 0.12


def test_closing_on_nothing_reads_no_force(robot: RobotDescription) -> None:
    s = session(robot)
    st = s.stream(s.status().q, 1.5, GripperMode.FORCE, 20.0, 2.0)
    assert st.gripper_pos < 0.002
    assert abs(st.gripper_force - s.r.fw.rig.biases_force_offset_n) < 0.5
    assert st.gripper_current > 0.5  # the motor pushes against its end stop


def _grip_force(robot: RobotDescription, severity: float, current: float) -> float:
    s = session(robot, seed=3)
    _approach_object(s)
    s.r.inject("gripper", "weak_close", severity=severity)
    at = s.status().q
    st = s.stream(at, 1.0, GripperMode.FORCE, 40.0, current)
    return st.gripper_force - s.r.fw.rig.biases_force_offset_n


def test_weak_close_ranges_are_recoverable_and_not(robot: RobotDescription) -> None:
    rig = RigConfig()
    g = robot.gripper
    target = 10.0  # the grasp force the ranges are sized for (configs/rig/default.toml)
    lo, hi = rig.faults_weak_close_recoverable
    for sev in (lo, hi):
        assert _grip_force(robot, sev, g.current_nominal_a) < target
        assert _grip_force(robot, sev, g.current_max_a) >= target
    assert _grip_force(robot, rig.faults_weak_close_unrecoverable[0], g.current_max_a) < target


def test_slip_drops_a_lifted_object(robot: RobotDescription) -> None:
    s = session(robot, seed=3)
    fw = s.r.fw
    at = _approach_object(s)
    s.stream(s.true_to_encoder(at), 0.5, GripperMode.FORCE, 15.0, 2.0)
    assert fw.obj.grasped
    lift = list(at)
    lift[1] += 0.3
    s.stream(s.true_to_encoder(lift), 0.5, GripperMode.FORCE, 15.0, 2.0)
    assert fw.obj.lifted
    s.r.inject("gripper", "slip", duration_s=0.2)
    st = s.stream(s.true_to_encoder(lift), 0.5, GripperMode.FORCE, 15.0, 2.0)
    assert not fw.obj.grasped and fw.obj.drops == 1 and fw.obj.drop_causes == {"slip": 1}
    assert fw.obj.xyz[2] == pytest.approx(fw.obj.rest_z)
    assert st.gripper_pos < 0.01  # the fingers closed on nothing
    assert abs(st.gripper_force - fw.rig.biases_force_offset_n) < 0.5


def test_opening_the_fingers_in_the_air_is_a_release_drop(robot: RobotDescription) -> None:
    s = session(robot, seed=3)
    fw = s.r.fw
    at = _approach_object(s)
    s.stream(s.true_to_encoder(at), 0.5, GripperMode.FORCE, 15.0, 2.0)
    lift = list(at)
    lift[1] += 0.3
    s.stream(s.true_to_encoder(lift), 0.5, GripperMode.FORCE, 15.0, 2.0)
    assert fw.obj.grasped and fw.obj.lifted
    s.stream(s.true_to_encoder(lift), 0.3, GripperMode.POSITION, 0.08, 2.0)
    assert not fw.obj.grasped and fw.obj.drop_causes == {"release": 1}


def test_sensor_biases_are_hidden_in_the_reports(robot: RobotDescription) -> None:
    s = session(robot)
    fw = s.r.fw
    n = 200
    acc = [0.0] * 4
    for _ in range(n):
        s.r.run_for(0.001)
        acc = [a + q - t for a, q, t in zip(acc, s.status().q, fw.arm.q, strict=True)]
    for a, b in zip(acc, fw.rig.biases_joint_encoder_offset_rad, strict=True):
        assert a / n == pytest.approx(b, abs=5e-5)


def test_camera_reports_object_pose_at_its_rate_with_latency(robot: RobotDescription) -> None:
    s = session(robot, seed=5)
    s.r.run_for(2.0)
    fw = s.r.fw
    ch = robot.sensor("object_pose")
    frames = [(t, f.msg) for t, f in s.host.frames if isinstance(f.msg, Sensor)]
    frames = [(t, m) for t, m in frames if t > 0.2]
    rate = len(frames) / (frames[-1][0] - frames[0][0])
    assert rate == pytest.approx(ch.rate_hz, rel=0.1)
    for t, m in frames:
        assert m.channel == robot.sensor_channel_id("object_pose")
        assert t * 1e6 - m.fw_time_us >= ch.latency_s * 1e6 - 1  # stamped with sample time
    mean = [sum(m.values[i] for _, m in frames) / len(frames) for i in range(3)]
    for i in range(3):
        assert mean[i] - fw.obj.xyz[i] == pytest.approx(fw.rig.biases_camera_offset_m[i],
                                                        abs=0.001)


def test_object_start_pose_is_seeded(robot: RobotDescription) -> None:
    a = Lockstep(robot, seed=11).fw.obj.xyz
    b = Lockstep(robot, seed=11).fw.obj.xyz
    c = Lockstep(robot, seed=12).fw.obj.xyz
    assert a == b and a != c
    rig = RigConfig()
    for seed in range(20):
        x, y, z = Lockstep(robot, seed=seed).fw.obj.xyz
        assert rig.object_box_min_m[0] <= x <= rig.object_box_max_m[0]
        assert rig.object_box_min_m[1] <= y <= rig.object_box_max_m[1]
        assert z == pytest.approx(robot.table_z_m + rig.object_size_m / 2)
        assert not math.isnan(x)


def test_status_reports_match_true_state_within_noise(robot: RobotDescription) -> None:
    s = session(robot)
    s.r.run_for(0.05)
    st: Status = s.status()
    fw = s.r.fw
    assert st.gripper_pos == pytest.approx(fw.gripper.opening, abs=0.001)
    for q, t, b in zip(st.q, fw.arm.q, fw.bias, strict=True):
        assert q == pytest.approx(t + b, abs=0.001)

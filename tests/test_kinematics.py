"""Kinematics of edge-arm-4: FK against the description's formula, IK round trips and verdicts."""

from __future__ import annotations

import dataclasses
import math
import os
import random
from pathlib import Path

import numpy as np
import pytest

from edge_agent.errors import ConfigError
from edge_agent.executor.kinematics import (
    TOOL_DOWN,
    ArmKinematics,
    IKFailure,
    IKFailureReason,
    forward,
    inverse,
    jacobian,
    tool_error,
)
from edge_agent.robot import RobotDescription, Workspace, load_robot

ROBOT_TOML = Path(__file__).resolve().parents[1] / "configs" / "robot" / "edge-arm-4.toml"
# Default run: 5,000 round trips; EDGE_IK_SAMPLES=100000 for the long run.
N_SAMPLES = int(os.environ.get("EDGE_IK_SAMPLES", "5000"))


@pytest.fixture(scope="module")
def robot() -> RobotDescription:
    return load_robot(ROBOT_TOML)


@pytest.fixture(scope="module")
def kin(robot: RobotDescription) -> ArmKinematics:
    return ArmKinematics.of(robot)


def _tool_down_poses(kin: ArmKinematics, rng: random.Random, n: int) -> list[tuple[float, ...]]:
    """Random joint poses inside the limits with the tool pointing down and the tool in the box."""
    out: list[tuple[float, ...]] = []
    while len(out) < n:
        q1, q2, q3 = (rng.uniform(kin.lower[i], kin.upper[i]) for i in range(3))
        q4 = TOOL_DOWN - q2 - q3
        if not kin.lower[3] <= q4 <= kin.upper[3]:
            continue
        q = (q1, q2, q3, q4)
        if kin.robot.workspace.contains(kin.forward(q)[:3]):
            out.append(q)
    return out


def test_home_pose_matches_the_description_formula(robot: RobotDescription) -> None:
    q1, q2, q3, q4 = robot.home
    r = 0.35 * math.cos(q2) + 0.30 * math.cos(q2 + q3) + 0.12 * math.cos(q2 + q3 + q4)
    z = 0.20 + 0.35 * math.sin(q2) + 0.30 * math.sin(q2 + q3) + 0.12 * math.sin(q2 + q3 + q4)
    x, y, zz, pitch = forward(robot, robot.home)
    assert (x, y, zz) == pytest.approx((r * math.cos(q1), r * math.sin(q1), z), abs=1e-12)
    assert pitch == pytest.approx(q2 + q3 + q4)
    assert robot.workspace.contains((x, y, zz))  # home is a legal place to start from
    assert x == pytest.approx(0.35637, abs=1e-5) and zz == pytest.approx(0.21295, abs=1e-5)


def test_round_trip_over_random_reachable_targets(kin: ArmKinematics) -> None:
    rng = random.Random(20240601)
    worst_pos = worst_seeded = 0.0
    for q_true in _tool_down_poses(kin, rng, N_SAMPLES):
        target = kin.forward(q_true)[:3]
        q = kin.inverse(target)
        assert not isinstance(q, IKFailure), (target, q)
        assert kin.within_limits(q)
        x, y, z, pitch = kin.forward(q)
        worst_pos = max(worst_pos, math.dist((x, y, z), target))
        assert pitch == pytest.approx(TOOL_DOWN, abs=1e-12)
        # Seeded with the pose that produced the target, IK gives that pose back.
        q_back = kin.inverse(target, q_seed=q_true)
        assert not isinstance(q_back, IKFailure)
        worst_seeded = max(worst_seeded, *(abs(a - b) for a, b in zip(q_back, q_true, strict=True)))
    assert worst_pos < 1e-9
    assert worst_seeded < 1e-6  # acos loses digits only near a straight elbow


def test_round_trip_with_wide_limits_covers_every_branch(robot: RobotDescription) -> None:
    """With limits of a full turn, reaching back over the top and both elbows all occur."""
    open_box = dataclasses.replace(robot, workspace=Workspace((-2.0, -2.0, -2.0), (2.0, 2.0, 2.0)))
    kin = dataclasses.replace(ArmKinematics.of(open_box), lower=(-math.pi,) * 4,
                              upper=(math.pi,) * 4)
    rng = random.Random(11)
    kinds = set()
    for q_true in _tool_down_poses(kin, rng, 2000):
        target = kin.forward(q_true)[:3]
        q = kin.inverse(target, q_seed=q_true)
        assert not isinstance(q, IKFailure)
        assert kin.tool_error(q, target) < 1e-9
        assert max(abs(a - b) for a, b in zip(q, q_true, strict=True)) < 1e-6
        wrist_r = kin.forward(q)[0] * math.cos(q[0]) + kin.forward(q)[1] * math.sin(q[0])
        kinds.add((wrist_r > 0, q[2] < 0))
    assert len(kinds) == 4, kinds  # facing/reaching back x elbow up/down all exercised


def _planar_solutions(kin: ArmKinematics, a: float, b: float,
                      grid: np.ndarray) -> list[tuple[float, float]]:
    """Independent check: Newton-refine the nearest grid poses to hit wrist point (a, b)."""
    d = np.hypot(grid[:, 2] - a, grid[:, 3] - b)
    out = []
    for idx in np.argsort(d)[:5]:
        q2, q3 = float(grid[idx, 0]), float(grid[idx, 1])
        for _ in range(30):
            l2, l3 = kin.upper_arm, kin.forearm
            fa = l2 * math.cos(q2) + l3 * math.cos(q2 + q3) - a
            fb = l2 * math.sin(q2) + l3 * math.sin(q2 + q3) - b
            j11, j12 = -l2 * math.sin(q2) - l3 * math.sin(q2 + q3), -l3 * math.sin(q2 + q3)
            j21, j22 = l2 * math.cos(q2) + l3 * math.cos(q2 + q3), l3 * math.cos(q2 + q3)
            det = j11 * j22 - j12 * j21
            if abs(det) < 1e-12:
                break
            q2 -= (j22 * fa - j12 * fb) / det
            q3 -= (-j21 * fa + j11 * fb) / det
        if math.hypot(fa, fb) < 1e-10:
            out.append((q2, q3))
    return out


def test_verdicts_over_the_whole_workspace_box(kin: ArmKinematics) -> None:
    """Uniform targets in the box: a solution is exact; `unreachable` is confirmed by search."""
    lo, hi = kin.lower, kin.upper
    mesh2, mesh3 = np.meshgrid(np.linspace(lo[1], hi[1], 400), np.linspace(lo[2], hi[2], 400))
    q2s, q3s = mesh2.ravel(), mesh3.ravel()
    ok = (TOOL_DOWN - q2s - q3s >= lo[3]) & (TOOL_DOWN - q2s - q3s <= hi[3])
    grid = np.stack([q2s, q3s, kin.upper_arm * np.cos(q2s) + kin.forearm * np.cos(q2s + q3s),
                     kin.upper_arm * np.sin(q2s) + kin.forearm * np.sin(q2s + q3s)], axis=1)[ok]
    rng = random.Random(7)
    ws = kin.robot.workspace
    verdicts = {"ok": 0, "unreachable": 0}
    for _ in range(600):
        target = tuple(rng.uniform(ws.min_m[i], ws.max_m[i]) for i in range(3))
        q = kin.inverse(target)
        if not isinstance(q, IKFailure):
            verdicts["ok"] += 1
            assert kin.within_limits(q) and kin.tool_error(q, target) < 1e-9
            continue
        assert q.reason is IKFailureReason.UNREACHABLE
        verdicts["unreachable"] += 1
        r, yaw = math.hypot(target[0], target[1]), math.atan2(target[1], target[0])
        b = target[2] - kin.shoulder_height + kin.tool  # wrist centre above the shoulder
        for facing, q1 in ((1.0, yaw), (-1.0, yaw + math.pi), (-1.0, yaw - math.pi)):
            if not lo[0] <= q1 <= hi[0]:
                continue
            for q2, q3 in _planar_solutions(kin, facing * r, b, grid):
                pose = (q1, q2, q3, TOOL_DOWN - q2 - q3)
                assert not kin.within_limits(pose), f"IK missed {pose} for {target}"
    assert verdicts["ok"] > 100 and verdicts["unreachable"] > 10, verdicts


@pytest.mark.parametrize("target", [
    (0.10, 0.0, 0.2), (0.56, 0.0, 0.2), (0.3, -0.41, 0.2), (0.3, 0.41, 0.2), (0.3, 0.0, -0.01),
    (0.3, 0.0, 0.46), (math.nan, 0.0, 0.2), (0.3, math.inf, 0.2), (-0.3, 0.0, 0.2),
])
def test_targets_outside_the_box_are_out_of_workspace(robot: RobotDescription,
                                                      target: tuple[float, float, float]) -> None:
    result = inverse(robot, target)
    assert isinstance(result, IKFailure) and result.reason is IKFailureReason.OUT_OF_WORKSPACE


def test_in_the_box_but_beyond_reach_is_unreachable(robot: RobotDescription) -> None:
    # The far corner on the table: the wrist would be 0.69 m from the shoulder, reach is 0.65 m.
    result = inverse(robot, (0.55, 0.40, 0.0))
    assert isinstance(result, IKFailure) and result.reason is IKFailureReason.UNREACHABLE
    assert "reach" in result.message


def test_within_reach_but_outside_joint_limits_is_unreachable(kin: ArmKinematics) -> None:
    # Narrow the elbow so that only "elbow down" poses would reach this point.
    target = kin.forward(kin.home)[:3]
    tight = dataclasses.replace(kin, upper=(kin.upper[0], kin.upper[1], -2.5, kin.upper[3]))
    result = tight.inverse(target)
    assert isinstance(result, IKFailure) and result.reason is IKFailureReason.UNREACHABLE
    assert "joint limits" in result.message


def test_both_elbows_are_found_and_the_seed_picks_the_nearer(kin: ArmKinematics) -> None:
    wide = dataclasses.replace(kin, lower=(-2.8, -1.5, -2.6, -4.0), upper=(2.8, 2.2, 2.6, 2.0))
    target = (0.40, 0.05, 0.15)
    up, down = wide.inverse(target, elbow="up"), wide.inverse(target, elbow="down")
    assert not isinstance(up, IKFailure) and not isinstance(down, IKFailure)
    assert up[2] < 0 < down[2]
    for q in (up, down):
        assert wide.tool_error(q, target) < 1e-9
    nudged = tuple(v + 0.05 for v in down)
    assert wide.inverse(target, elbow="up", q_seed=nudged) == pytest.approx(down)


def test_only_the_up_elbow_fits_edge_arm_4_limits(kin: ArmKinematics) -> None:
    q = kin.inverse((0.40, 0.05, 0.15), elbow="down")
    assert not isinstance(q, IKFailure) and q[2] < 0  # preference yields to the limits


def test_target_on_the_yaw_axis_keeps_the_seed_yaw(robot: RobotDescription) -> None:
    open_box = dataclasses.replace(robot, workspace=Workspace((-1.0, -1.0, -1.0), (1.0, 1.0, 1.0)))
    kin = dataclasses.replace(ArmKinematics.of(open_box), upper=(2.8, 2.8, 0.3, 1.2))
    result = kin.inverse((0.0, 0.0, 0.5), q_seed=(0.7, 1.2, -1.9, -0.87))
    assert not isinstance(result, IKFailure)
    assert result[0] == pytest.approx(0.7) and kin.tool_error(result, (0.0, 0.0, 0.5)) < 1e-9


def test_tool_down_false_keeps_the_seed_pitch(robot: RobotDescription) -> None:
    seed = (0.1, 1.1, -1.7, -0.5)
    target = (0.35, 0.05, 0.25)
    q = inverse(robot, target, tool_down=False, q_seed=seed)
    assert not isinstance(q, IKFailure)
    assert forward(robot, q)[3] == pytest.approx(sum(seed[1:]))
    assert tool_error(robot, q, target) < 1e-9


def test_jacobian_matches_finite_differences(kin: ArmKinematics) -> None:
    rng = random.Random(3)
    for _ in range(50):
        q = [rng.uniform(kin.lower[i], kin.upper[i]) for i in range(4)]
        jac = jacobian(kin, q)
        for k in range(4):
            hi, lo = list(q), list(q)
            hi[k] += 1e-6
            lo[k] -= 1e-6
            col = [(a - b) / 2e-6 for a, b in zip(kin.forward(hi), kin.forward(lo), strict=True)]
            assert [row[k] for row in jac] == pytest.approx(col, abs=1e-7)


def test_tool_error_is_the_distance_to_the_target(robot: RobotDescription) -> None:
    x, y, z, _ = forward(robot, robot.home)
    assert tool_error(robot, robot.home, (x, y, z)) == 0.0
    assert tool_error(robot, robot.home, (x + 0.003, y - 0.004, z)) == pytest.approx(0.005)


def test_base_offset_moves_the_tool(robot: RobotDescription) -> None:
    moved = dataclasses.replace(robot, base_xyz_m=(0.1, -0.2, 0.05))
    a, b = forward(robot, robot.home), forward(moved, robot.home)
    assert (b[0] - a[0], b[1] - a[1], b[2] - a[2]) == pytest.approx((0.1, -0.2, 0.05))


@pytest.mark.parametrize("change, key", [
    (lambda r: dataclasses.replace(r, joints=r.joints[:3]), "joints"),
    (lambda r: dataclasses.replace(
        r, joints=(r.joints[0], dataclasses.replace(r.joints[1], axis="x"), *r.joints[2:])),
     "joints"),
    (lambda r: dataclasses.replace(r, base_rpy_rad=(0.0, 0.1, 0.0)), "base.rpy_rad"),
    (lambda r: dataclasses.replace(
        r, joints=(*r.joints[:2], dataclasses.replace(r.joints[2], link_length_m=0.0),
                   r.joints[3])),
     "joints[2].link_length_m"),
])
def test_other_chain_shapes_are_refused(robot: RobotDescription, change: object, key: str) -> None:
    with pytest.raises(ConfigError) as err:
        ArmKinematics.of(change(robot))  # type: ignore[operator]
    assert err.value.key == key


def test_wrong_lengths_are_programming_errors(kin: ArmKinematics) -> None:
    with pytest.raises(ValueError):
        kin.forward((0.0, 1.0, -1.0))
    with pytest.raises(ValueError):
        kin.inverse((0.3, 0.0))
    with pytest.raises(ValueError):
        kin.inverse((0.3, 0.0, 0.1), pitch=math.nan)

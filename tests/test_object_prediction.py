"""The executor takes the hub's Kalman-predicted object pose during a camera dropout inside its
bound (real SensorHub, real codec frames, the real Executor); past the bound, the camera mean."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from edge_agent.executor.executor import Executor
from edge_agent.executor.latch import StopLatch
from edge_agent.link.codec import FrameDecoder, Sensor, Status, StatusFlag, encode
from edge_agent.robot import load_robot
from edge_agent.sensors.hub import SensorHub
from edge_agent.sensors.readings import Source

ROBOT = load_robot(Path(__file__).resolve().parents[1] / "configs" / "robot" / "edge-arm-4.toml")
OBJECT = ROBOT.sensor_channel_id("object_pose")
LATENCY_S = ROBOT.sensor("object_pose").latency_s


def test_a_moving_part_is_tracked_through_a_camera_dropout() -> None:
    hub, ex, dec = SensorHub(ROBOT), Executor(ROBOT, StopLatch()), FrameDecoder()
    rng = random.Random(5)
    speed = 0.10  # m/s in x: a part on a conveyor

    def truth(t: float) -> tuple[float, float, float]:
        return (0.15 + speed * t, 0.05, 0.02)

    t, seq = 0.0, 0
    for k in range(1, 3001):  # 3 s of STATUS at 1 kHz, the camera at 30 Hz
        t = k / 1000
        msgs: list[object] = [Status(fw_time_us=1_000 * k, flags=StatusFlag.DRIVES_ENABLED,
                                     last_cmd_seq=0, q=ROBOT.home, dq=(0.0,) * 4,
                                     current=(0.1,) * 4, gripper_pos=0.04,
                                     gripper_current=0.3, gripper_force=0.0)]
        if k % 33 == 0:  # each frame shows the part as it was latency_s before it arrived
            msgs.append(Sensor(1_000 * k, OBJECT, True, tuple(
                v + rng.gauss(0, 0.002) for v in truth(t - LATENCY_S))))
        for m in msgs:
            for f in dec.feed(encode(m, seq % 65536)):  # type: ignore[arg-type]
                hub.update(f.msg, t)
            seq += 1
        if k % 5 == 0:
            ex.tick(t, hub.snapshot(t))
    measured = ex.object_estimate
    assert measured is not None
    # the camera stops; the robot's STATUS goes on
    for k in range(3001, 3401):
        t = k / 1000
        for f in dec.feed(encode(Status(fw_time_us=1_000 * k, flags=StatusFlag.DRIVES_ENABLED,
                                        last_cmd_seq=0, q=ROBOT.home, dq=(0.0,) * 4,
                                        current=(0.1,) * 4, gripper_pos=0.04,
                                        gripper_current=0.3, gripper_force=0.0),
                                 seq % 65536)):
            hub.update(f.msg, t)
        seq += 1
    snap = hub.snapshot(t)
    assert snap.object_pose is not None and snap.object_pose.source is Source.PREDICTED
    ex.tick(t, snap)
    predicted = ex.object_estimate
    assert predicted is not None
    assert predicted == pytest.approx(snap.object_pose.value)
    # 0.4 s into the dropout the part moved 4 cm: the prediction follows it, the mean does not
    err_pred = abs(predicted[0] - truth(t)[0])
    err_mean = abs(measured[0] - truth(t)[0])
    assert err_pred < 0.01 and err_mean > 0.03, (err_pred, err_mean)
    # past the camera's 1 s bound: no prediction; the executor falls back to the camera mean
    t += 1.0
    late = hub.snapshot(t)
    assert late.object_pose is not None and late.object_pose.source is Source.STALE
    ex.tick(t, late)
    assert ex.object_estimate == measured

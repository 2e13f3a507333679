# ruff: noqa: B023, E501
"""Benchmark: per-call cost of IK/FK, the joint controller, SensorHub.update/snapshot, Kalman.

Run from the repo root: python3 -m hil.bench_control_math [N]
Prints median / mean of the fastest 99 % / P99 / max in µs per call; a same-run baseline (an
empty function call) first. On a shared, loaded machine the P99/max columns are scheduler noise.
"""
from __future__ import annotations

import random
import statistics
import sys
import time

from edge_agent.executor.kinematics import ArmKinematics
from edge_agent.executor.pid import JointPositionController
from edge_agent.link.codec import FrameDecoder, Sensor, Status, StatusFlag, encode
from edge_agent.robot import load_robot
from edge_agent.sensors.hub import SensorHub
from edge_agent.sensors.kalman import EstimatorBank

N = int(sys.argv[1]) if len(sys.argv) > 1 else 5000
robot = load_robot("configs/robot/edge-arm-4.toml")


def bench(name, fn, n=N):
    ts = []
    for i in range(n):
        t0 = time.perf_counter_ns()
        fn(i)
        ts.append(time.perf_counter_ns() - t0)
    ts.sort()
    mean = statistics.fmean(ts[: int(n * 0.99)]) / 1e3  # mean of the fastest 99 %
    print(f"{name:52s} median {ts[n//2]/1e3:6.1f}  mean99 {mean:6.1f}  "
          f"P99 {ts[int(n*0.99)]/1e3:7.1f}  max {ts[-1]/1e3:8.1f} µs")


bench("baseline (empty call)", lambda i: None)
kin = ArmKinematics.of(robot)
rng = random.Random(1)
ws = robot.workspace
targets = [tuple(rng.uniform(ws.min_m[k], ws.max_m[k]) for k in range(3)) for _ in range(N)]
bench("kinematics.forward", lambda i: kin.forward(robot.home))
bench("kinematics.inverse (random box target)", lambda i: kin.inverse(targets[i]))
bench("kinematics.inverse (seeded)", lambda i: kin.inverse(targets[i], q_seed=robot.home))
bench("ArmKinematics.of (validation)", lambda i: ArmKinematics.of(robot))
ctrl = JointPositionController(robot)
ctrl.reset(robot.home)
goal = kin.inverse((0.4, 0.1, 0.1))
bench("JointPositionController.update", lambda i: ctrl.update(goal, robot.home, 0.005))


def status(k):
    return Status(1000 * k, StatusFlag.DRIVES_ENABLED, k % 65536, (0.001 * k, 1.2, -1.9, -0.87),
                  (1.0, 0.0, 0.0, 0.0), (0.1, 0.2, 0.3, 0.4), 0.04, 0.5, 3.0 + 0.01 * (k % 7))


dec = FrameDecoder()
frames = [f.msg for f in dec.feed(b"".join(encode(status(k), k % 65536) for k in range(N)))]
obj = robot.sensor_channel_id("object_pose")
for label, bank in (("no estimators", None), ("estimators attached", EstimatorBank.create(robot))):
    hub = SensorHub(robot, estimators=False)
    if bank is not None:
        hub.attach_estimators(bank)
    bench(f"SensorHub.update(Status) [{label}]", lambda i: hub.update(frames[i], i * 0.001))
    bench(f"SensorHub.update(Sensor) [{label}]",
          lambda i: hub.update(Sensor(i, obj, True, (0.3 + 1e-4 * i, 0.0, 0.1)), N * 0.001 + i / 30))
    t_end = N * 0.001 + N / 30
    bench(f"SensorHub.snapshot fresh [{label}]", lambda i: hub.snapshot(t_end))
    bench(f"SensorHub.snapshot predicting [{label}]", lambda i: hub.snapshot(t_end + 0.05))
est = EstimatorBank.create(robot).get("joint_encoders")
bench("ChannelEstimator.update (joint_encoders)", lambda i: est.update((0.001 * i,) * 4, i * 0.001))
est2 = EstimatorBank.create(robot).get("wrist_force")
bench("ChannelEstimator.update (wrist_force)", lambda i: est2.update((3.0,), i * 0.001))

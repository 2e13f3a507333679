"""A small deterministic plant for the executor's unit tests (the full rig is in hil/episodes).

Joints follow POSITION setpoints after a first-order lag (HOLD keeps them); the gripper opens
and closes at its speed limit, grips a cube of `size` when the tool is on it, and its force is
min(setpoint, force_per_amp × current limit) × (1 - weak). GripperMode.HOLD keeps opening and
force, as the firmware does. Knobs: `frozen` (joints ignore commands), `weak`, `extra_current`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

from edge_agent.executor.executor import Executor
from edge_agent.executor.kinematics import ArmKinematics
from edge_agent.executor.latch import StopLatch
from edge_agent.executor.tasks import ExecutorConfig
from edge_agent.link.codec import Command, GripperMode, Mode
from edge_agent.policy_seam import Policy
from edge_agent.robot import RobotDescription, load_robot
from edge_agent.sensors.readings import Reading, Snapshot, Source

ROBOT_PATH = Path(__file__).resolve().parents[1] / "configs" / "robot" / "edge-arm-4.toml"
OBJECT = (0.36, 0.06, 0.02)


def snapshot(t: float, q: tuple[float, ...], dq: tuple[float, ...], currents: tuple[float, ...],
             gripper_pos: float, gripper_force: float, gripper_current: float,
             object_pose: tuple[float, ...] | None, predicted: bool = False,
             stale: bool = False) -> Snapshot:
    """A real SensorHub Snapshot with the fields the executor reads filled in."""
    pose = Reading("object_pose", object_pose, t, t) if object_pose is not None else None
    return Snapshot(t=t, fw_time_s=t, flags=0, last_cmd_seq=None, estop_input=False, q=q,
                    dq=dq, q_source=(Source.STALE if stale else
                                     Source.PREDICTED if predicted else Source.MEASURED),
                    currents=currents, gripper_pos=gripper_pos,
                    gripper_current=gripper_current, gripper_force=gripper_force,
                    object_pose=pose, channels=MappingProxyType({}), stale=(), past_bound=())


@dataclass
class FakeArm:
    robot: RobotDescription
    q: list[float] = field(default_factory=list)
    dq: list[float] = field(default_factory=list)
    opening: float = 0.08
    force: float = 0.0
    gcurrent: float = 0.0
    weak: float = 0.0
    frozen: bool = False
    predicted: bool = False
    stale: bool = False
    extra_current: float = 0.0
    size: float = 0.04
    tau: float = 0.03
    object_pose: tuple[float, float, float] = OBJECT

    def __post_init__(self) -> None:
        self.q = list(self.robot.home)
        self.dq = [0.0] * len(self.q)
        self.kin = ArmKinematics.of(self.robot)

    def snapshot(self, t: float) -> Snapshot:
        cur = tuple([1.0 + self.extra_current] + [1.0] * (len(self.q) - 1))
        return snapshot(t, tuple(self.q), tuple(self.dq), cur, self.opening, self.force,
                        self.gcurrent, self.object_pose, self.predicted, self.stale)

    def on_object(self) -> bool:
        x, y, z, _ = self.kin.forward(self.q)
        o = self.object_pose
        return math.hypot(x - o[0], y - o[1]) < 0.012 and abs(z - o[2]) < 0.02

    def apply(self, cmd: Command, dt: float) -> None:
        if cmd.mode == Mode.POSITION and not self.frozen:
            k = min(1.0, dt / self.tau)
            new = [a + (b - a) * k for a, b in zip(self.q, cmd.q, strict=True)]
            self.dq = [(b - a) / dt for a, b in zip(self.q, new, strict=True)]
            self.q = new
        else:
            self.dq = [0.0] * len(self.q)
        g = self.robot.gripper
        if cmd.gripper_mode == GripperMode.HOLD:
            return
        if cmd.gripper_mode == GripperMode.POSITION:
            target = min(max(cmd.gripper_setpoint, g.stroke_min_m), g.stroke_max_m)
            self.force = 0.0
            self.gcurrent = 0.1
        else:
            target = g.stroke_min_m
        step = g.speed_max_m_s * dt
        if self.force > 0.0 and cmd.gripper_mode == GripperMode.FORCE:
            target = self.opening
        self.opening = min(max(target, self.opening - step), self.opening + step)
        if cmd.gripper_mode == GripperMode.FORCE and self.opening <= self.size and \
                self.on_object():
            self.opening = self.size
            per_amp = g.force_max_n / g.current_max_a
            amps = min(cmd.gripper_setpoint / per_amp, cmd.gripper_current_limit)
            self.gcurrent = amps
            self.force = per_amp * amps * (1.0 - self.weak)


class Bench:
    """An Executor driving a FakeArm at `hz`, with every command and event kept."""

    def __init__(self, config: ExecutorConfig | None = None, policy: Policy | None = None,
                 hz: float = 200.0, **arm: object) -> None:
        self.robot = load_robot(ROBOT_PATH)
        self.latch = StopLatch()
        self.ex = Executor(self.robot, self.latch, policy, config)
        self.arm = FakeArm(self.robot, **arm)  # type: ignore[arg-type]
        self.dt = 1.0 / hz
        self.now = 0.0
        self.commands: list[tuple[float, Command]] = []
        self.events: list[dict[str, Any]] = []

    def step(self, n: int = 1) -> Command:
        cmd = None
        for _ in range(n):
            self.now = round(self.now + self.dt, 9)
            cmd = self.ex.tick(self.now, self.arm.snapshot(self.now))
            self.commands.append((self.now, cmd))
            self.arm.apply(cmd, self.dt)
            self.events += self.ex.drain_events()
        assert cmd is not None
        return cmd

    def run_until(self, pred: Callable[[], bool], timeout_s: float) -> bool:
        end = self.now + timeout_s
        while self.now < end:
            self.step()
            if pred():
                return True
        return False

    def of(self, type_: str) -> list[dict[str, Any]]:
        return [e for e in self.events if e["type"] == type_]

    def done(self, task_id: str = "t1") -> dict[str, Any] | None:
        for e in self.of("task_done"):
            if e["task_id"] == task_id:
                return e
        return None

    def outcome(self, task_id: str = "t1") -> str | None:
        done = self.done(task_id)
        return str(done["outcome"]) if done is not None else None

    def start(self, task_id: str = "t1") -> None:
        self.step(5)
        r = self.ex.start_task(self.now, task_id)
        assert r.ok, r
        self.events += self.ex.drain_events()

"""The simulated firmware's protocol behaviour (docs/PROTOCOL.md), over the lock-step runner."""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Sequence
from pathlib import Path

import pytest

from edge_agent.link.codec import (
    Command,
    Enable,
    EstopEdge,
    Event,
    EventCode,
    Frame,
    FrameType,
    GripperMode,
    Hello,
    Message,
    Mode,
    Ping,
    Pong,
    Status,
    StatusFlag,
    StopCategory,
    encode,
)
from edge_agent.robot import RobotDescription, load_robot
from hil.lockstep import Lockstep
from hil.sim.config import RigConfig
from hil.sim.harness import Session

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def robot() -> RobotDescription:
    return load_robot(ROOT / "configs/robot/edge-arm-4.toml")


def events(s: Session, code: EventCode) -> list[Event]:
    return [e for e in s.host.of_type(Event) if e.code == code]


def enabled_session(robot: RobotDescription, rig: RigConfig | None = None,
                    **kw: object) -> Session:
    s = Session(Lockstep(robot, rig, seed=2), **kw)  # type: ignore[arg-type]
    s.open()
    st = s.enable()
    assert st.flags & StatusFlag.DRIVES_ENABLED
    return s


def test_nothing_is_sent_before_hello_and_status_flows_after(robot: RobotDescription) -> None:
    s = Session(Lockstep(robot, seed=1))
    s.send(Enable(True))
    s.r.run_for(0.2)
    assert not s.host.frames
    assert s.r.fw.counters["ignored_frames"] == 1
    ack = s.open()
    assert ack.accepted and ack.n_joints == 4 and ack.proto_version == 1
    s.r.run_for(0.1)
    st = s.status()
    assert st.flags & StatusFlag.SESSION_OPEN
    assert not st.flags & StatusFlag.DRIVES_ENABLED  # drives start disabled


def test_hello_version_mismatch_is_refused_and_everything_else_ignored(
        robot: RobotDescription) -> None:
    s = Session(Lockstep(robot, seed=1))
    ack = s.open(version=2)
    assert not ack.accepted and ack.proto_version == 1
    assert [e.detail for e in events(s, EventCode.VERSION_MISMATCH)] == [2]
    s.send(Enable(True))
    s.command(s.true_to_encoder(s.r.fw.arm.q))
    s.r.run_for(0.2)
    assert not s.host.of_type(Status)
    assert not s.r.fw.arm.enabled
    assert [e.type for e in s.r.fw.record.entries] == ["HELLO", "ENABLE", "COMMAND"]


def test_status_period_follows_hello(robot: RobotDescription) -> None:
    s = Session(Lockstep(robot, seed=1), status_period_us=5000)
    s.open()
    s.r.run_for(1.0)
    times = [m.fw_time_us for m in s.host.of_type(Status)]
    assert {b - a for a, b in itertools.pairwise(times)} == {5000}


def test_enable_is_refused_while_the_estop_is_pressed(robot: RobotDescription) -> None:
    s = Session(Lockstep(robot, seed=1))
    s.open()
    s.r.inject("estop", "press")
    s.r.run_for(0.01)
    s.send(Enable(True))
    s.r.run_for(0.05)
    rejected = events(s, EventCode.CMD_REJECTED)
    assert [e.detail for e in rejected] == [FrameType.ENABLE]
    assert not s.status().flags & StatusFlag.DRIVES_ENABLED
    assert s.status().estop_input
    s.r.inject("estop", "release")
    s.r.run_for(0.01)
    assert s.enable().flags & StatusFlag.DRIVES_ENABLED


def test_estop_press_latches_firmware_and_sends_an_edge(robot: RobotDescription) -> None:
    s = enabled_session(robot)
    q0 = s.status().q
    moving = [q0[0] + 1.0, *q0[1:]]
    s.stream(moving, 0.3)
    s.r.inject("estop", "press")
    s.r.run_for(0.006)  # one host period
    edges = s.host.of_type(EstopEdge)
    assert len(edges) == 1 and edges[0].pressed
    # the edge comes ahead of the status of the same tick
    kinds = [type(f.msg) for _, f in s.host.frames]
    i = kinds.index(EstopEdge)
    assert kinds[i + 1] is Status
    follower = s.host.frames[i + 1][1].msg
    assert isinstance(follower, Status) and follower.fw_time_us == edges[0].fw_time_us
    st = s.status()
    assert st.flags & StatusFlag.ESTOP_INPUT and st.flags & StatusFlag.ESTOP_LATCHED
    assert not st.flags & StatusFlag.DRIVES_ENABLED
    # the host keeps commanding motion: nothing moves
    s.stream(moving, 0.2)
    q_stopped = s.r.fw.arm.q[0]
    s.stream(moving, 0.5)
    assert s.r.fw.arm.q[0] == pytest.approx(q_stopped, abs=1e-9)
    # release alone clears nothing; ENABLE after release does, holding the measured position
    s.r.inject("estop", "release")
    s.stream(moving, 0.1)
    assert s.status().flags & StatusFlag.ESTOP_LATCHED
    assert [e.pressed for e in s.host.of_type(EstopEdge)] == [True, False]
    st = s.enable()
    assert not st.flags & StatusFlag.ESTOP_LATCHED and st.flags & StatusFlag.DRIVES_ENABLED
    s.r.run_for(0.1)
    assert s.r.fw.arm.q[0] == pytest.approx(q_stopped, abs=1e-6)


def test_without_firmware_estop_hold_only_the_host_can_stop_motion(
        robot: RobotDescription) -> None:
    s = enabled_session(robot, RigConfig(firmware_estop_hold=False))
    q0 = s.status().q
    s.stream([q0[0] + 1.0, *q0[1:]], 0.2)
    s.r.inject("estop", "press")
    s.r.run_for(0.006)  # one host period
    assert s.host.of_type(EstopEdge)[-1].pressed
    before = s.r.fw.arm.q[0]
    st = s.stream([q0[0] + 1.0, *q0[1:]], 0.2)  # a host that ignores the button keeps moving
    assert st.flags & StatusFlag.ESTOP_INPUT and st.flags & StatusFlag.DRIVES_ENABLED
    assert not st.flags & StatusFlag.ESTOP_LATCHED
    assert s.r.fw.arm.q[0] > before + 0.1
    s.stop(StopCategory.CAT0)  # the host's stop frame is what stops it now
    s.r.run_for(0.1)
    stopped = s.r.fw.arm.q[0]
    s.stream([q0[0] + 1.0, *q0[1:]], 0.3)
    assert s.r.fw.arm.q[0] == pytest.approx(stopped, abs=1e-5)  # braked to rest
    assert not s.status().flags & StatusFlag.DRIVES_ENABLED


def test_deadman_trips_once_holds_and_only_enable_clears_it(robot: RobotDescription) -> None:
    """PROTOCOL.md §4: a deadman trip latches — a host that wakes up with stale setpoints cannot
    move the arm by sending them; only a fresh ENABLE(1) ends it."""
    s = enabled_session(robot, deadman_ms=50)
    q0 = s.status().q
    s.stream(lambda t: [q0[0] + 0.5 * t, *q0[1:]], 0.5)
    s.r.run_for(0.5)  # commands stop arriving
    st = s.status()
    assert st.flags & StatusFlag.DEADMAN_TRIPPED and st.flags & StatusFlag.HOLDING
    trips = events(s, EventCode.DEADMAN_TRIP)
    assert len(trips) == 1 and 50 <= trips[0].detail <= 52
    held = s.r.fw.arm.q[0]
    s.r.run_for(0.3)
    assert s.r.fw.arm.q[0] == pytest.approx(held, abs=1e-6)
    assert abs(s.r.fw.arm.dq[0]) < 1e-6
    # HOLD commands feed the deadman but keep the trip; so do POSITION commands now
    s.hold(0.1)
    assert s.status().flags & StatusFlag.DEADMAN_TRIPPED
    st = s.stream([q0[0] + 0.3, *q0[1:]], 0.5)
    assert st.flags & StatusFlag.DEADMAN_TRIPPED
    assert s.r.fw.arm.q[0] == pytest.approx(held, abs=1e-6), "a stale setpoint moved the arm"
    st = s.enable()
    assert not st.flags & StatusFlag.DEADMAN_TRIPPED
    st = s.stream([q0[0] + 0.3, *q0[1:]], 0.5)
    assert s.r.fw.arm.q[0] == pytest.approx(q0[0] + 0.3, abs=0.02)
    assert len(events(s, EventCode.DEADMAN_TRIP)) == 1


def test_the_old_firmware_without_the_deadman_latch_lets_a_position_command_clear_it(
        robot: RobotDescription) -> None:
    """`firmware_deadman_latch = false`: the firmware before PROTOCOL.md §4's latch, for tests
    that prove the host side alone keeps stale setpoints off the robot."""
    s = enabled_session(robot, RigConfig(firmware_deadman_latch=False), deadman_ms=50)
    q0 = s.status().q
    s.hold(0.05)
    s.r.run_for(0.2)
    assert s.status().flags & StatusFlag.DEADMAN_TRIPPED
    st = s.stream([q0[0] + 0.3, *q0[1:]], 0.5)
    assert not st.flags & StatusFlag.DEADMAN_TRIPPED


def test_command_ttl_overrides_the_session_deadman(robot: RobotDescription) -> None:
    s = enabled_session(robot, deadman_ms=50)
    s.command(s.status().q, ttl_ms=300)
    s.r.run_for(0.25)
    assert not s.status().flags & StatusFlag.DEADMAN_TRIPPED
    s.r.run_for(0.1)
    assert s.status().flags & StatusFlag.DEADMAN_TRIPPED


def test_stop_categories(robot: RobotDescription) -> None:
    s = enabled_session(robot)
    q0 = s.status().q
    s.stream([q0[0] + 1.0, *q0[1:]], 0.2)
    s.stop(StopCategory.CAT2)
    s.r.run_for(0.05)
    st = s.status()
    assert st.flags & StatusFlag.HOLDING and st.flags & StatusFlag.DRIVES_ENABLED
    held = s.r.fw.arm.q[0]
    s.stream([q0[0] + 1.0, *q0[1:]], 0.3)  # latched until ENABLE(1)
    assert s.r.fw.arm.q[0] == pytest.approx(held, abs=0.01)
    s.enable()
    s.stream([q0[0] + 1.0, *q0[1:]], 0.3)
    assert s.r.fw.arm.q[0] > held + 0.1
    s.stop(StopCategory.CAT0)
    s.r.run_for(0.05)
    assert not s.status().flags & StatusFlag.DRIVES_ENABLED


def test_ping_is_answered_at_once_with_firmware_time(robot: RobotDescription) -> None:
    s = Session(Lockstep(robot, seed=1, link_latency_s=0.0002))
    s.open()
    s.r.run_for(0.0105)
    sent = s.r.now
    s.send(Ping(123456))
    s.r.run_for(0.005)
    pong = s.host.last(Pong)
    assert pong is not None and pong.host_time_us == 123456
    assert pong.fw_time_us == round((sent + 0.0002) * 1e6)  # not rounded to a tick
    assert pong.fw_time_us % 1000 != 0


def test_bad_frames_are_counted_skipped_and_reported(robot: RobotDescription) -> None:
    s = enabled_session(robot)
    good = encode(Ping(1), 50)
    s.send(b"\x00\x13\x37garbage\x00" + good[:-3] + b"\x00" + b"\xff" * 600 + b"\x00")
    s.send(Ping(2))
    s.r.run_for(0.2)
    c = s.r.fw.decoder.counters
    assert c.bad_frames >= 2 and c.oversize >= 1
    assert [p.host_time_us for p in s.host.of_type(Pong)] == [2]
    assert sum(e.detail for e in events(s, EventCode.BAD_FRAME)) == c.bad_frames
    assert s.status().flags & StatusFlag.DRIVES_ENABLED


def test_wrong_joint_count_is_rejected_and_holds(robot: RobotDescription) -> None:
    s = enabled_session(robot)
    q0 = s.status().q
    s.stream([q0[0] + 1.0, *q0[1:]], 0.1)
    s.command(q0[:3])
    s.r.run_for(0.02)
    assert [e.detail for e in events(s, EventCode.CMD_REJECTED)] == [FrameType.COMMAND]
    assert s.status().flags & StatusFlag.HOLDING


def test_a_repeated_command_seq_is_applied_once(robot: RobotDescription) -> None:
    s = enabled_session(robot)
    frame = encode(Command(Mode.POSITION, s.status().q), 999)
    s.send(frame)
    s.send(frame)
    s.r.run_for(0.02)
    assert s.r.fw.counters["duplicates_skipped"] == 1
    assert s.r.fw.counters["commands_applied"] == 1
    assert s.status().last_cmd_seq == 999


def test_out_of_range_targets_are_clamped_and_reported(robot: RobotDescription) -> None:
    s = enabled_session(robot)
    q = list(s.status().q)
    q[2] = 5.0
    s.command(q, GripperMode.POSITION, 0.5, 9.0)
    s.r.run_for(0.02)
    clamped = events(s, EventCode.LIMIT_CLAMPED)
    assert [e.detail for e in clamped] == [(1 << 2) | (1 << 4)]  # joint 2 and the gripper


def test_same_seed_same_bytes(robot: RobotDescription) -> None:
    def run(seed: int) -> bytes:
        r = Lockstep(robot, seed=seed)
        s = Session(r)
        s.open()
        s.enable()
        q0 = s.status().q
        s.stream(lambda t: [q0[0] + 0.2 * t, *q0[1:]], 0.3)
        return b"".join(encode(f.msg, f.seq) for _, f in s.host.frames)

    assert run(4) == run(4)
    assert run(4) != run(5)


class _Follower:
    """A host controller plugged into the runner: opens a session and walks joint 0."""

    def __init__(self) -> None:
        self.seen = 0
        self.q: tuple[float, ...] | None = None
        self.last_status: Status | None = None

    def tick(self, now: float, frames: Sequence[Frame]) -> Iterable[bytes | Message]:
        self.seen += len(frames)
        for f in frames:
            if isinstance(f.msg, Status):
                self.last_status = f.msg
        if now == 0.0:
            return [Hello(1, 50, 5000)]
        st = self.last_status
        if st is None:
            return []
        if not st.flags & StatusFlag.DRIVES_ENABLED:
            return [Enable(True)]
        if self.q is None:
            self.q = st.q
        return [Command(Mode.POSITION, (self.q[0] + 0.1 * now, *self.q[1:]))]


def test_a_host_controller_plugs_into_the_runner(robot: RobotDescription) -> None:
    host = _Follower()
    r = Lockstep(robot, seed=1, host=host, host_period_s=0.005)
    r.run_for(2.0)
    assert host.seen > 300
    assert host.q is not None and host.last_status is not None
    assert host.last_status.q[0] == pytest.approx(host.q[0] + 0.1 * 2.0, abs=0.02)
    assert r.fw.counters["commands_applied"] > 350
    cmds = r.fw.record.query(type="COMMAND")
    assert cmds[-1].fields["mode"] == "POSITION" and len(cmds[-1].fields["q"]) == 4

"""Rig fault injection: sensors, gripper, collision, link, schedules, control handler, config."""

from __future__ import annotations

import json
import math
import threading
from pathlib import Path

import pytest

from edge_agent.errors import ConfigError
from edge_agent.link.codec import Event, EventCode, GripperMode, Sensor, Status, StatusFlag
from edge_agent.robot import RobotDescription, load_robot
from hil.lockstep import Lockstep
from hil.sim.config import parse_rig
from hil.sim.control import ControlHandler
from hil.sim.faults import FaultError, FaultSpec, load_schedule
from hil.sim.harness import Session

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def robot() -> RobotDescription:
    return load_robot(ROOT / "configs/robot/edge-arm-4.toml")


def enabled(robot: RobotDescription, seed: int = 2, **kw: object) -> Session:
    s = Session(Lockstep(robot, seed=seed, **kw))  # type: ignore[arg-type]
    s.open()
    s.enable()
    return s


def statuses_since(s: Session, t: float) -> list[Status]:
    return [f.msg for tt, f in s.host.frames if tt > t and isinstance(f.msg, Status)]


def test_sensor_dropout_sends_nan_in_status_then_recovers(robot: RobotDescription) -> None:
    s = enabled(robot)
    s.r.inject("sensor:joint_encoders", "dropout", duration_s=0.1)
    t0 = s.r.now
    s.r.run_for(0.05)
    st = s.status()
    assert all(math.isnan(q) for q in st.q) and all(math.isnan(v) for v in st.dq)
    assert not math.isnan(st.current[0])  # other channels unaffected
    s.r.run_for(0.1)
    assert not any(math.isnan(q) for q in s.status().q)
    assert any(math.isnan(m.q[0]) for m in statuses_since(s, t0))


def test_camera_dropout_sends_invalid_samples(robot: RobotDescription) -> None:
    s = enabled(robot)
    s.r.inject("sensor:object_pose", "dropout")
    t0 = s.r.now
    s.r.run_for(0.5)
    samples = [f.msg for t, f in s.host.frames if t > t0 + 0.06 and isinstance(f.msg, Sensor)]
    assert len(samples) >= 10 and not any(m.valid for m in samples)
    assert all(len(m.values) == 3 for m in samples)
    s.r.clear("sensor:object_pose")
    s.r.run_for(0.2)
    last = s.host.last(Sensor)
    assert last is not None and last.valid


def test_stuck_noise_and_spikes(robot: RobotDescription) -> None:
    s = enabled(robot)
    s.r.inject("sensor:wrist_force", "stuck", duration_s=0.2)
    t0 = s.r.now
    s.r.run_for(0.1)
    stuck = {m.gripper_force for m in statuses_since(s, t0 + 0.01)}
    assert len(stuck) == 1
    s.r.run_for(0.2)
    normal = [m.gripper_force for m in statuses_since(s, s.r.now - 0.08)]
    assert len(set(normal)) > 10

    def spread(values: list[float]) -> float:
        mean = sum(values) / len(values)
        return math.sqrt(sum((v - mean) ** 2 for v in values) / len(values))

    std = robot.sensor("wrist_force").noise_std
    assert spread(normal) < 2 * std
    s.r.inject("sensor:wrist_force", "noise", severity=1.0, duration_s=0.3)
    t1 = s.r.now
    s.r.run_for(0.3)
    noisy = [m.gripper_force for m in statuses_since(s, t1 + 0.01)]
    assert spread(noisy) > 10 * std
    s.r.inject("sensor:joint_currents", "spikes", severity=1.0, duration_s=1.0)
    t2 = s.r.now
    s.r.run_for(1.0)
    big = [m for m in statuses_since(s, t2 + 0.01) if max(abs(c) for c in m.current) > 4.0]
    assert 10 < len(big) < 200  # ~5 % of 1000 samples


def test_collision_fault_blocks_and_raises_current(robot: RobotDescription) -> None:
    s = enabled(robot)
    q0 = s.status().q
    s.stream([q0[0] + 1.0, *q0[1:]], 0.2)
    s.r.inject("collision", "impact", duration_s=0.3)
    s.stream([q0[0] + 1.0, *q0[1:]], 0.1)
    frozen = s.r.fw.arm.q[0]
    st = s.stream([q0[0] + 1.0, *q0[1:]], 0.1)
    assert s.r.fw.arm.q[0] == frozen
    assert abs(st.current[0]) > 0.8 * robot.joints[0].current_max_a
    s.stream([q0[0] + 1.0, *q0[1:]], 0.5)
    assert s.r.fw.arm.q[0] > frozen + 0.1  # moves again once it is gone


def test_link_corrupt_flips_bits_the_host_decoder_counts(robot: RobotDescription) -> None:
    s = enabled(robot)
    s.r.inject("link", "corrupt", severity=1.0, duration_s=0.5)
    s.hold(0.5)
    bad = s.r.host_decoder.counters.crc_errors + s.r.host_decoder.counters.cobs_errors
    assert bad > 50
    assert s.r.fw.counters["corrupted_bytes"] > 50
    ok_before = s.r.host_decoder.counters.frames_ok
    s.hold(0.2)
    assert s.r.host_decoder.counters.frames_ok - ok_before > 150


def test_link_unplug_is_silence_both_ways(robot: RobotDescription) -> None:
    s = enabled(robot)
    s.hold(0.1)  # a command stream arms the firmware's deadman
    s.r.inject("link", "unplug", duration_s=0.3)
    s.r.run_for(0.005)
    n = len(s.host.frames)
    s.hold(0.25)  # the firmware hears none of it: its deadman trips
    assert len(s.host.frames) == n
    assert s.r.fw.counters["rx_discarded_bytes"] > 0
    assert s.r.fw.deadman_tripped
    s.hold(0.2)
    assert len(s.host.frames) > n + 100
    # the trip's event went into the void; the flag tells the host after the link is back
    assert not s.host.of_type(Event)
    assert s.status().flags & StatusFlag.DEADMAN_TRIPPED


def test_scheduled_faults_start_and_end_on_firmware_time(robot: RobotDescription,
                                                         tmp_path: Path) -> None:
    toml = tmp_path / "f.toml"
    toml.write_text('[[faults]]\nat_s = 0.5\ntarget = "estop"\nmode = "press"\n'
                    'duration_s = 0.2\n\n[[faults]]\nat_s = 0.1\ntarget = "gripper"\n'
                    'mode = "weak_close"\nseverity = "unrecoverable"\n')
    js = tmp_path / "f.json"
    js.write_text(json.dumps({"faults": [{"at_s": 0.3, "target": "sensor:wrist_force",
                                          "mode": "dropout", "duration_s": 0.1}]}))
    specs = load_schedule(toml) + load_schedule(js)
    r = Lockstep(robot, seed=1, schedule=specs)
    s = Session(r)
    s.open()
    r.run_until(0.2)
    lo, hi = r.fw.rig.faults_weak_close_unrecoverable
    assert lo <= r.fw.gripper.weak_severity <= hi
    r.run_until(0.35)
    assert math.isnan(s.status().gripper_force)
    r.run_until(0.6)
    assert s.status().flags & StatusFlag.ESTOP_INPUT
    r.run_until(0.8)
    assert not s.status().flags & StatusFlag.ESTOP_INPUT
    assert [h["mode"] for h in r.fw.faults.history if h["target"] == "estop"] == [
        "press", "expired"]


def test_bad_fault_requests_are_refused(robot: RobotDescription, tmp_path: Path) -> None:
    r = Lockstep(robot)
    for target, mode in [("sensor:nope", "dropout"), ("gripper", "explode"), ("gpu", "fail"),
                         ("sensor:estop_input", "stuck"), ("sensor", "dropout")]:
        with pytest.raises(FaultError):
            r.inject(target, mode)
    with pytest.raises(FaultError):
        r.inject("gripper", "weak_close", severity=1.5)
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps([{"target": "estop", "mode": "press"}]))
    with pytest.raises(FaultError, match="at_s"):
        load_schedule(bad)


def test_gripper_fault_changes_the_grip(robot: RobotDescription) -> None:
    s = enabled(robot)
    s.r.inject("gripper", "weak_close", severity=0.5)
    assert s.r.fw.faults.gripper_weak == 0.5
    s.r.run_for(0.01)
    assert s.r.fw.gripper.weak_severity == 0.5
    s.r.clear("gripper")
    s.stream(s.status().q, 0.05, GripperMode.POSITION, 0.08)
    assert s.r.fw.gripper.weak_severity == 0.0


def test_control_handler_requests(robot: RobotDescription) -> None:
    s = enabled(robot)
    clock = [0.0]
    h = ControlHandler([s.r.fw], threading.Lock(), clock=lambda: clock[0])
    assert h.handle({"cmd": "ping"})["ok"]
    assert not h.handle({"cmd": "nope"})["ok"]
    assert not h.handle({"cmd": "inject", "target": "bogus", "mode": "x"})["ok"]
    assert not h.handle({"cmd": "status", "robot": 3})["ok"]
    assert not h.handle([1, 2])["ok"]
    clock[0] = s.r.now
    res = h.handle({"cmd": "inject", "target": "estop", "mode": "press"})
    assert res["ok"] and res["fault"]["target"] == "estop"
    s.r.run_for(0.01)
    state = h.handle({"cmd": "status"})["state"]
    assert state["estop_input"] and state["estop_latched"] and not state["drives_enabled"]
    assert set(state) >= {"q", "object", "gripper", "counters", "faults"}
    assert h.handle({"cmd": "faults"})["active"][0]["mode"] == "press"
    assert h.handle({"cmd": "clear"})["cleared"] == ["estop"]
    assert h.handle({"cmd": "set", "key": "firmware_estop_hold", "value": False})["ok"]
    assert s.r.fw.estop_hold is False
    assert not h.handle({"cmd": "set", "key": "firmware_estop_hold", "value": "no"})["ok"]
    assert h.handle({"cmd": "set", "key": "object_xyz", "value": [0.3, 0.1, 0.0]})["ok"]
    assert s.r.fw.obj.xyz == [0.3, 0.1, s.r.fw.obj.rest_z]
    rec = h.handle({"cmd": "record", "type": "ENABLE"})
    assert rec["ok"] and [f["enable"] for f in rec["frames"]] == [True]
    assert h.handle({"cmd": "record", "limit": 1})["frames"][0]["type"] == "ENABLE"
    sched = h.handle({"cmd": "schedule", "faults": [{"at_s": 9.0, "target": "collision",
                                                   "mode": "impact"}]})
    assert sched["ok"] and h.handle({"cmd": "faults"})["scheduled"] == 1
    json.dumps(h.handle({"cmd": "status"}))  # everything is JSON


def test_rig_config_errors_name_the_key() -> None:
    with pytest.raises(ConfigError, match=r"motor\.time_constant_s"):
        parse_rig({"schema_version": 1, "motor": {"time_constant_s": "fast"}})
    with pytest.raises(ConfigError, match="unknown key"):
        parse_rig({"schema_version": 1, "motor": {"tau": 0.1}})
    with pytest.raises(ConfigError, match="schema_version"):
        parse_rig({"motor": {}})
    with pytest.raises(ConfigError) as exc:
        parse_rig({"schema_version": 1, "faults": {"weak_close_recoverable": [0.8, 0.2]}})
    assert exc.value.key == "faults.weak_close_recoverable"


def test_per_joint_arrays_must_match_the_robot(robot: RobotDescription) -> None:
    rig = parse_rig({"schema_version": 1, "biases": {"joint_encoder_offset_rad": [0.1, 0.2]}})
    with pytest.raises(ConfigError, match="joint_encoder_offset_rad"):
        rig.check(robot)


def test_fault_spec_from_mapping_rejects_unknown_fields() -> None:
    with pytest.raises(FaultError):
        FaultSpec.from_mapping({"target": "estop", "mode": "press", "when": 3})
    with pytest.raises(FaultError, match="'mode'"):  # no silent default mode
        FaultSpec.from_mapping({"target": "collision"})


def test_the_rig_takes_exactly_the_modes_the_command_schema_documents() -> None:
    """One name end to end (issue #27 item 5: the schema said `impact`, the rig took `hit`):
    every rig target's modes are the `failure.inject` schema's (docs/asyncapi.yaml's)."""
    from edge_agent.commands.schema import FAILURE_MODES
    from hil.sim.faults import MODES

    assert {k: set(v) for k, v in MODES.items()} == {
        k: set(FAILURE_MODES[k]) for k in MODES}


def test_fast_status_path_equals_the_general_one(robot: RobotDescription) -> None:
    runs = []
    for force_general in (False, True):
        s = enabled(robot, seed=9)
        q0 = s.status().q
        s.stream([q0[0] + 0.3, *q0[1:]], 0.1)
        if force_general:  # a fault on a channel no report uses: takes the general path
            s.r.fw.sensors.faults = {"unused": ("noise", 1.0)}
        runs.append(s.r.fw.status.encode(s.r.fw.fw_us, 1))
    assert runs[0] == runs[1]


def test_saturated_current_sets_fault_and_reports_overcurrent(robot: RobotDescription) -> None:
    s = enabled(robot)
    q0 = s.status().q
    s.r.inject("collision", "impact", severity=1.5, duration_s=0.2)
    st = s.stream([q0[0] + 0.5, *q0[1:]], 0.1)
    assert st.flags & StatusFlag.FAULT
    assert abs(st.current[0]) == pytest.approx(robot.joints[0].current_max_a, abs=0.1)
    over = [e for e in s.host.of_type(Event) if e.code == EventCode.OVERCURRENT]
    assert over and over[0].detail & 1
    st = s.stream([q0[0] + 0.5, *q0[1:]], 0.3)
    assert not st.flags & StatusFlag.FAULT


def test_noise_scale_per_channel(robot: RobotDescription) -> None:
    rig = parse_rig({"schema_version": 1, "noise": {"channel_scale": {"wrist_force": 0.0}}})
    s = Session(Lockstep(robot, rig.check(robot), seed=1))
    s.open()
    s.r.run_for(0.1)
    forces = {m.gripper_force for m in s.host.of_type(Status)}
    assert len(forces) == 1  # f32 of bias + 0 * noise: one value
    assert forces.pop() == pytest.approx(rig.biases_force_offset_n)
    bad = parse_rig({"schema_version": 1, "noise": {"channel_scale": {"lidar": 2.0}}})
    with pytest.raises(ConfigError, match="lidar"):
        bad.check(robot)

"""Rest calibration against the rig's hidden biases and clock: lock-step, then a real daemon.

Stated errors: every bias estimate is within 6 of its own reported standard errors of the rig's
hidden value (and those standard errors are small: < 1e-5 rad, < 0.005 N, < 0.001 m); the clock
offset is within the estimator's guaranteed bound (half a round trip) of the truth.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from daemon_proc import DaemonProc
from hypothesis import given, settings
from hypothesis import strategies as st
from mosquitto import wait_until

from edge_agent.daemon.rest_calibration import (
    NOT_AT_REST,
    CalibrationResult,
    Estimate,
    RestCalibrator,
    estimate_clock,
)
from edge_agent.link.codec import (
    Command,
    Enable,
    GripperMode,
    Hello,
    Mode,
    Ping,
    Pong,
    Sensor,
    Status,
)
from edge_agent.robot import load_robot
from hil.lockstep import Lockstep, ScriptedHost
from hil.sim.config import RigConfig, load_rig

REPO = Path(__file__).resolve().parents[1]
ROBOT = load_robot(REPO / "configs" / "robot" / "edge-arm-4.toml")
SE_LIMIT = {"joint_encoders": 1e-5, "wrist_force": 0.005, "object_pose": 0.001}


def _assert_close(est: Estimate, truth: tuple[float, ...], name: str) -> None:
    assert est.value is not None, f"{name}: {est.reason}"
    errs = [abs(v - t) for v, t in zip(est.value, truth, strict=True)]
    print(f"{name}: estimate {est.value} truth {truth} |error| {errs} stderr {est.stderr}")
    assert max(est.stderr) < SE_LIMIT[name]
    for e, se in zip(errs, est.stderr, strict=True):
        assert e <= 6 * se + 1e-6, f"{name}: error {e} > 6 x stderr {se}"


# --------------------------------------------------------------------------- lock-step


def _runner(seed: int = 5) -> tuple[Lockstep, ScriptedHost, RigConfig]:
    rig = load_rig(None, ROBOT)
    host = ScriptedHost()
    r = Lockstep(ROBOT, rig, seed=seed, host=host, host_period_s=0.0002,
                 link_latency_s=0.0001)
    r.send(Hello(deadman_ms=500))
    r.run_for(0.05)
    return r, host, rig


def _window(r: Lockstep, host: ScriptedHost, seconds: float, keep_moving: Command | None = None,
            object_reference: tuple[float, ...] | None = None) -> CalibrationResult:
    """Feed `seconds` of the stream (with 20 PINGs) to a RestCalibrator."""
    host.frames.clear()
    for _ in range(20):
        r.send(Ping(r.t_us))
        if keep_moving is not None:
            r.send(keep_moving)
        r.run_for(seconds / 20)
    cal = RestCalibrator(ROBOT)
    cam_id = next(i for i, c in enumerate(ROBOT.frame_sensors) if c.name == "object_pose")
    for now, f in host.frames:
        m = f.msg
        if isinstance(m, Status):
            cal.add_status(m)
        elif isinstance(m, Sensor) and m.channel == cam_id and m.valid:
            cal.add_object_pose(m.values, m.fw_time_us * 1e-6)
        elif isinstance(m, Pong):
            cal.add_exchange(m.host_time_us, m.fw_time_us, round(now * 1e6))
    return cal.result(object_reference=object_reference)


def test_lockstep_at_power_up_finds_every_hidden_bias_and_the_clock() -> None:
    r, host, rig = _runner()
    fixture = tuple(r.fw.obj.xyz)  # a calibration object at a surveyed pose
    res = _window(r, host, 2.0, object_reference=fixture)
    assert res.at_rest
    _assert_close(res.joint_encoders, rig.biases_joint_encoder_offset_rad, "joint_encoders")
    _assert_close(res.wrist_force, (rig.biases_force_offset_n,), "wrist_force")
    _assert_close(res.object_pose, rig.biases_camera_offset_m, "object_pose")
    c = res.clock
    assert c is not None and c.exchanges == 20
    # lock-step: firmware time 0 = virtual time 0, so the true offset is 0
    print(f"clock offset {c.offset_us} us, bound {c.bound_us} us, rtt min {c.rtt_min_us} us")
    assert abs(c.offset_us) <= c.bound_us + 1 and c.bound_us <= 100
    assert c.rtt_min_us == 200  # 2 x 100 µs link latency
    assert set(res.offsets(["wrist_force", "object_pose", "estop_input"])) == {
        "wrist_force", "object_pose"}


def test_lockstep_motion_refuses_biases_and_a_moved_arm_refuses_the_encoders() -> None:
    r, host, _ = _runner(seed=6)
    r.send(Enable(True))
    r.run_for(0.02)
    target = list(ROBOT.home)
    target[0] += 0.3
    cmd = Command(Mode.POSITION, tuple(target), ttl_ms=500)
    res = _window(r, host, 0.3, keep_moving=cmd)  # the base turns 0.3 rad: moving
    assert not res.at_rest
    assert res.joint_encoders.reason == NOT_AT_REST and res.wrist_force.value is None
    assert res.clock is not None  # the link is measurable whatever the arm does
    res = _window(r, host, 2.0, keep_moving=cmd)  # arrived and holding, 0.3 rad from home
    assert res.at_rest and res.joint_encoders.value is None
    assert "not at the reference pose" in str(res.joint_encoders.reason)
    assert res.wrist_force.value is not None


def test_lockstep_closed_gripper_refuses_the_force_offset() -> None:
    r, host, _ = _runner(seed=7)
    r.send(Enable(True))
    r.run_for(0.02)
    close = Command(Mode.HOLD, ROBOT.home, gripper_mode=GripperMode.POSITION,
                    gripper_setpoint=0.0, ttl_ms=500)
    for _ in range(40):
        r.send(close)
        r.run_for(0.05)
    res = _window(r, host, 1.0, keep_moving=close)
    assert res.at_rest and res.wrist_force.value is None
    assert "contact cannot be ruled out" in str(res.wrist_force.reason)
    assert res.object_pose.value is None and "not observable" in str(res.object_pose.reason)


@settings(deadline=None, max_examples=300)
@given(st.floats(-1e9, 1e9), st.lists(st.tuples(st.integers(0, 10**9), st.integers(0, 5000),
                                                 st.integers(0, 5000)), min_size=3, max_size=30))
def test_clock_offset_is_always_within_its_bound(theta: float,
                                                 trips: list[tuple[int, int, int]]) -> None:
    """Whatever the one-way delays (asymmetric, jittery), the truth is within ±bound."""
    ex = [(s, round(s + up + theta), s + up + down) for s, up, down in trips]
    c = estimate_clock(ex)
    assert c is not None
    assert abs(c.offset_us - theta) <= c.bound_us + 1.0  # +1: the firmware stamp is rounded
    assert c.bound_us <= min(up + down for _, up, down in trips) / 2 + 1.0


# --------------------------------------------------------------------------- real daemon


def test_daemon_calibrates_after_ready_and_publishes_in_status(tmp_path: Path) -> None:
    rig = load_rig(None, ROBOT)
    d = DaemonProc(tmp_path, None).start()
    try:
        d.wait_ready()

        def ready() -> list[dict[str, Any]]:
            return [e for e in d.events("event") if e.get("type") in (
                "calibration_ready", "calibration_failed")]
        wait_until(lambda: bool(ready()), 90, "calibration_ready")
        assert ready()[0]["type"] == "calibration_ready", ready()
        cal = d.socket_cmd("status")["result"]["background"]["calibration"]
        pings = d.rig({"cmd": "record", "type": "PING"})["frames"]
    finally:
        d.stop()
    assert cal["ok"] and cal["at_rest"] and cal["applied"] == ["wrist_force"]
    enc, force = cal["joint_encoders"], cal["wrist_force"]
    _assert_close(Estimate(tuple(enc["value"]), tuple(enc["stderr"]), enc["samples"]),
                  rig.biases_joint_encoder_offset_rad, "joint_encoders")
    _assert_close(Estimate(tuple(force["value"]), tuple(force["stderr"]), force["samples"]),
                  (rig.biases_force_offset_n,), "wrist_force")
    # the truth on the pty: the rig stamps each PING with its monotonic reception time and the
    # firmware clock at that instant (same CLOCK_MONOTONIC as the daemon's host clock)
    truth = [p["fw_us"] - p["t"] * 1e6 for p in pings]
    assert len(pings) >= 3 and max(truth) - min(truth) < 3
    clock = cal["clock"]
    err = abs(clock["offset_us"] - truth[0])
    print(f"daemon clock offset error {err:.1f} us (bound {clock['bound_us']} us), rtt min "
          f"{clock['rtt_min_ms']} ms median {clock['rtt_median_ms']} ms")
    assert err <= clock["bound_us"] + 3
    assert math.isfinite(clock["rtt_min_ms"]) and clock["rtt_min_ms"] > 0

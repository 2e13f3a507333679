"""Issue #15 item 5: manual jog stays inside the workspace box and the soft joint limits.

The real daemon + guardian + simulated robot over a pty, jog speed at the joints' full limit
(the hardest case for stopping in time): every joint jogged to saturation in both directions,
each from where the last one left the arm. After each, the robot's measured joints (its encoders)
are inside the soft limits and its measured tool pose (forward kinematics) is inside the box.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from daemon_proc import REPO, DaemonProc
from mosquitto import wait_until

from edge_agent.executor.kinematics import ArmKinematics
from edge_agent.robot import load_robot

ROBOT = load_robot(REPO / "configs" / "robot" / "edge-arm-4.toml")
KIN = ArmKinematics.of(ROBOT)
SATURATE = 5.0  # rad/s: scaled down to the jog speed limit, direction kept
STILL_RAD = 2e-4


def _rig(d: DaemonProc) -> dict[str, Any]:
    return d.rig({"cmd": "status"})["state"]  # type: ignore[no-any-return]


def _recover_from_jog_lost(d: DaemonProc) -> None:
    """A loaded machine let the jog stream's ttl (200 ms) run out between two jogs: the jog
    deadman's protective stop (not what this test is about). Reset and go on jogging."""
    causes = d.socket_cmd("status")["result"]["stop"]["causes"]
    # a stall past the deadman mid-jog is a deadman stop: also a stall, not a limit
    assert set(causes) <= {"jog_lost", "deadman"} and causes, causes
    wait_until(lambda: d.socket_cmd("reset")["ok"], 30, "reset after jog_lost")
    wait_until(lambda: d.socket_cmd("manual.enter")["ok"], 30, "manual mode again")


def _jog_until_still(d: DaemonProc, joint: int, sign: float) -> dict[str, Any]:
    """Jog one joint at saturation until the robot stops moving (or 20 s of firmware time)."""
    dq = [0.0] * ROBOT.n_joints
    dq[joint] = sign * SATURATE
    st = _rig(d)
    start_fw = st["fw_time_us"]
    ref_q, ref_fw = st["q_encoder"], st["fw_time_us"]
    while True:
        r = d.socket_cmd("manual.jog", {"dq": dq, "ttl_ms": 200})
        if not r["ok"] and "protective stop" in r["error"]["message"]:
            _recover_from_jog_lost(d)
            continue
        # refused while a late reader left the encoders predicted for a tick: jog on
        assert r["ok"] or "predicted" in r["error"]["message"], r
        st = _rig(d)  # jogs go back to back, paced by the two round trips (ttl 200 ms)
        assert st["fw_time_us"] - start_fw < 20_000_000, "the jog never came to rest"
        if not r["ok"]:  # no jog went out: the arm standing still now says nothing of a limit
            ref_q, ref_fw = st["q_encoder"], st["fw_time_us"]
            continue
        if st["fw_time_us"] - ref_fw >= 300_000:  # moved less than STILL_RAD in 0.3 s: still
            if max(abs(a - b) for a, b in zip(st["q_encoder"], ref_q, strict=True)) < STILL_RAD:
                return st
            ref_q, ref_fw = st["q_encoder"], st["fw_time_us"]


def test_saturating_jogs_stay_inside_the_box_and_the_soft_limits(tmp_path: Path) -> None:
    d = DaemonProc(tmp_path, None, extra=("executor.jog_speed_scale=1.0",)).start()
    ws, soft = ROBOT.workspace, ROBOT.soft_limits()
    try:
        d.wait_ready()
        wait_until(lambda: d.socket_cmd("status")["result"]["link_up"], 30, "link up")
        wait_until(lambda: d.socket_cmd("manual.enter")["ok"], 30, "manual mode")
        moved = 0.0
        for joint in range(ROBOT.n_joints):
            for sign in (1.0, -1.0):
                before = _rig(d)["q_encoder"][joint]
                st = _jog_until_still(d, joint, sign)
                q = st["q_encoder"]
                moved += abs(q[joint] - before)
                name = ROBOT.joints[joint].name
                for i, (lo, hi) in enumerate(soft):
                    assert lo - 0.01 <= q[i] <= hi + 0.01, (name, sign, i, q)
                    assert (ROBOT.joints[i].position_min_rad < q[i]
                            < ROBOT.joints[i].position_max_rad), (name, sign, i, q)
                tool = KIN.forward(q)[:3]
                assert ws.contains(tool), (name, sign, tool, q)
        assert moved > 1.0, "the jogs hardly moved the arm: nothing was tested"
        assert d.socket_cmd("status")["result"]["mode"] == "manual"
    finally:
        d.stop()

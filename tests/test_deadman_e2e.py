"""End to end: a stalled daemon or a stalled link guardian is a latched deadman stop.

The real daemon (`edge-agent run --sim`), its real guardian process and the simulated robot on
a real pty. A process is stopped with SIGSTOP (as a swap storm, a stuck collection or a debugger
would) mid-task, then continued; the assertions are on what reached the robot (the rig's frame
record) and on what the operator sees in `status`:

- no POSITION setpoint reaches the robot after the stall until `reset` and a new command;
- the stop is a latched protective stop with cause `deadman`, and it is in the snapshot;
- after `reset` nothing moves; after `resume` the task moves again.

The guardian case runs with the rig's firmware deadman latch OFF (the old firmware, which a
POSITION command released): only the host side keeps the daemon's queued setpoints off the arm.

In the guardian case what counts is what the robot read after the SIGCONT, once the rig has
read the pty empty: the stopped guardian wrote nothing between the two signals, so a POSITION
read then was written after it woke (a
stop-model hole, as the guardian writing a setpoint it held when it froze was:
tests/test_guardian_freeze.py) — unless its own STOP(CAT2, DEADMAN) is the very next frame (a
freeze between its last clock check and the write; the firmware holds at once). Frames it wrote
before the freeze may reach the rig late when
the host is starved (the pty's kernel worker, the rig's thread: 31 POSITION frames read 114 ms
after the SIGSTOP in one loaded run of hil.guardian_freeze_loop); a real UART does not hold
them, and a latching firmware ignores them after its deadman trip (docs/PROTOCOL.md §4) — they
are not the daemon's queued setpoints.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

from daemon_proc import DaemonProc
from mosquitto import wait_until

# Generous L1 timeouts: a stall must not turn into an L1 timeout on a loaded machine.
SLOW = tuple(f"executor.l1_timeouts_s.{s}=60" for s in (
    "approach", "grasp", "lift", "transfer", "release", "retreat"))


def _status(d: DaemonProc) -> dict[str, Any]:
    r = d.socket_cmd("status")
    assert r["ok"], r
    out = r["result"]
    assert isinstance(out, dict)
    return out


def _rig_t(d: DaemonProc) -> float:
    return float(d.rig({"cmd": "ping"})["t"])


def _positions_since(d: DaemonProc, t: float) -> list[dict[str, Any]]:
    rec = d.rig({"cmd": "record", "type": "COMMAND", "since": t, "where": {"mode": "POSITION"}})
    assert rec["ok"], rec
    frames = rec["frames"]
    assert isinstance(frames, list)
    return frames


def _wait_rig_time(d: DaemonProc, until: float, what: str) -> None:
    wait_until(lambda: _rig_t(d) > until, 30, what)


def _rig_drained(d: DaemonProc) -> bool:
    """Nothing came in over 30 ms of the rig's time while its firmware ran 20 ms of ticks (it
    steps only when select() finds the pty empty): it has read every byte written before."""
    a = d.rig({"cmd": "status"})
    _wait_rig_time(d, float(a["t"]) + 0.03, "30 ms of the rig's time")
    b = d.rig({"cmd": "status"})
    return bool(a["state"]["counters"]["rx_bytes"] == b["state"]["counters"]["rx_bytes"]
                and b["state"]["fw_time_us"] - a["state"]["fw_time_us"] >= 20_000)


def _guardian_pid(daemon_pid: int) -> int:
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmd = f.read()
        except (OSError, ValueError, IndexError):
            continue
        if ppid == daemon_pid and b"edge_agent.link.guardian" in cmd:
            return int(entry)
    raise AssertionError("the daemon's guardian process was not found")


def _start_task(d: DaemonProc) -> str:
    d.wait_ready()
    wait_until(lambda: _status(d)["link_up"], 30, "link up")
    r = d.socket_cmd("task.start")
    assert r["ok"], r
    t = _rig_t(d)
    # moving: setpoints reach the robot
    wait_until(lambda: bool(_positions_since(d, t)), 30, "POSITION frames at the robot")
    return str(r["result"]["task_id"])


def _latched_deadman(st: dict[str, Any]) -> bool:
    stop = st.get("stop") or {}
    return bool(st["mode"] == "protective_stop" and stop.get("cause") == "deadman")


def _recover_and_move(d: DaemonProc, task: str) -> None:
    """reset: nothing moves; resume: the task moves again."""
    wait_until(lambda: d.socket_cmd("reset")["ok"], 30, "reset accepted")
    st = _status(d)
    assert st["mode"] == "holding", st
    assert st["link"]["guardian"]["latched"] is False, st["link"]
    t_reset = _rig_t(d)
    _wait_rig_time(d, t_reset + 0.3, "0.3 s after the reset")
    assert _positions_since(d, t_reset) == [], "a reset moved the robot"
    r = d.socket_cmd("resume", {"task_id": task})
    assert r["ok"], r
    wait_until(lambda: bool(_positions_since(d, t_reset)), 30, "moving again after resume")


def _snapshot_has_deadman(d: DaemonProc) -> bool:
    snap = d.state_dir / "daemon.snap"
    return snap.exists() and b'"deadman"' in snap.read_bytes()


def test_a_stopped_daemon_wakes_up_latched_and_its_stale_setpoints_never_reach_the_robot(
        tmp_path: Path) -> None:
    d = DaemonProc(tmp_path, None, extra=SLOW).start()
    try:
        task = _start_task(d)
        assert d.proc is not None
        t_stop = _rig_t(d)
        os.kill(d.proc.pid, signal.SIGSTOP)
        t_stopped = _rig_t(d)  # the rig's time once the stop is in: a host stall may delay it
        try:
            _wait_rig_time(d, t_stop + 1.0, "a second of the daemon stopped")
        finally:
            os.kill(d.proc.pid, signal.SIGCONT)
        t_cont = _rig_t(d)
        wait_until(lambda: _latched_deadman(_status(d)), 30, "a latched deadman stop")
        _wait_rig_time(d, t_cont + 0.5, "half a second after the continue")
        # the guardian held at the deadman; nothing the daemon computed after the stall moved
        # the robot (frames in flight at the SIGSTOP land within a few ms of it)
        assert _positions_since(d, t_stopped + 0.1) == []
        st = _status(d)
        assert _latched_deadman(st), st
        g = st["link"]["guardian"]
        assert g["latched"] and g["cause"] == "deadman", g
        wait_until(lambda: _snapshot_has_deadman(d), 10, "the deadman stop in the snapshot")
        _recover_and_move(d, task)
    finally:
        d.stop()


def test_a_stopped_guardian_is_a_deadman_stop_and_the_queued_setpoints_never_move_the_arm(
        tmp_path: Path) -> None:
    d = DaemonProc(tmp_path, None, extra=SLOW).start()
    try:
        d.wait_ready()
        # the old firmware: a POSITION command would release its deadman trip by itself
        assert d.rig({"cmd": "set", "key": "firmware_deadman_latch", "value": False})["ok"]
        task = _start_task(d)
        assert d.proc is not None
        gpid = _guardian_pid(d.proc.pid)
        t_stop = _rig_t(d)
        os.kill(gpid, signal.SIGSTOP)
        try:
            # the daemon notices the silent guardian while it is still stopped
            wait_until(lambda: _latched_deadman(_status(d)), 30, "a latched deadman stop")
            _wait_rig_time(d, t_stop + 1.5, "1.5 s of the guardian stopped")
            fw = d.rig({"cmd": "status"})["state"]
            assert fw["deadman_tripped"], fw  # the firmware's own deadman tripped meanwhile
            # a starved rig reads the pty late: all the guardian wrote before it froze first
            wait_until(lambda: _rig_drained(d), 30, "the rig read the pty empty")
            t_precont = _rig_t(d)  # from here on, what the robot reads was written after the wake
        finally:
            os.kill(gpid, signal.SIGCONT)
        t_cont = _rig_t(d)
        _wait_rig_time(d, t_cont + 0.5, "half a second after the continue")
        # the setpoints the daemon queued before it noticed, and any the guardian held when it
        # froze, went nowhere — but one a freeze between the guardian's last clock check and
        # its write let out, which its own STOP(CAT2, DEADMAN) follows at once
        after = d.rig({"cmd": "record", "since": t_precont})["frames"]
        by_seq = {f["seq"]: f for f in after}
        for f in _positions_since(d, t_precont):
            nxt = by_seq.get((f["seq"] + 1) & 0xFFFF) or {}
            assert (nxt.get("type"), nxt.get("category"), nxt.get("reason")) == (
                "STOP", "CAT2", "DEADMAN"), f"a POSITION after the wake: {f}"
        st = _status(d)
        assert _latched_deadman(st), st
        wait_until(lambda: bool(_status(d)["link"]["guardian"]["latched"]), 10,
                   "the guardian latched")
        wait_until(lambda: _snapshot_has_deadman(d), 10, "the deadman stop in the snapshot")
        _recover_and_move(d, task)
    finally:
        d.stop()

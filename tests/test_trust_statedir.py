"""Issue 16, item 3: one daemon per state dir, a state dir others may write is refused, and the
`running` marker is never written through a symlink.

Two real daemon processes on one state dir: the second exits at once (75) naming the first one's
pid and leaves every file of the first untouched (marker, snapshot, rig.sock); after `kill -9` of
the first the next start still reports the unclean restart (protective stop).
"""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

from daemon_proc import DaemonProc
from mosquitto import wait_until

from edge_agent.daemon.persist import MARKER


def _fingerprint(state: Path) -> dict[str, tuple[int, int, int, bytes]]:
    """Every file in the state dir (not the journal's folder): inode, size, mtime, contents."""
    out = {}
    for p in sorted(state.iterdir()):
        st = os.lstat(p)
        if p.is_dir():
            continue
        data = p.read_bytes() if p.is_file() else b""
        out[p.name] = (st.st_ino, st.st_size, st.st_mtime_ns, data)
    return out


def _wait_exit(d: DaemonProc, timeout: float = 30.0) -> int:
    assert d.proc is not None
    try:
        return d.proc.wait(timeout)
    except subprocess.TimeoutExpired:
        raise AssertionError("the second daemon did not exit:\n" + "\n".join(d.lines[-20:])) \
            from None


def test_a_second_daemon_on_the_same_state_dir_touches_nothing(tmp_path: Path) -> None:
    first = DaemonProc(tmp_path, None).start()
    try:
        first.wait_ready()
        assert first.proc is not None
        state = first.state_dir
        assert (state / "rig.sock").exists() and (state / MARKER).exists()
        # quiet: nothing of the first daemon's own rewrites the files while we compare; its
        # drift period (daemon/drift.py) is saved once its reports start, after READY
        wait_until(lambda: (state / "drift.json").exists(), 30, "the first daemon's drift.json")
        first.socket_cmd("status")
        before = _fingerprint(state)
        second = DaemonProc(tmp_path, None).start()
        rc = _wait_exit(second)
        out = "\n".join(second.lines)
        assert rc == 75, out
        assert f"is in use by pid {first.proc.pid}" in out, out
        after = _fingerprint(state)
        changed = [n for n in before if before[n] != after.get(n) and n not in (
            "daemon.snap", "daemon.snap.prev", "dedup.json", "drift.json")]  # the first's saves
        assert not changed and set(after) == set(before), (changed, set(after) ^ set(before))
        assert after[MARKER][3] == f"{first.proc.pid}\n".encode()  # still the first's marker
        assert first.socket_cmd("status")["ok"]  # and its sockets still answer
        os.killpg(first.proc.pid, signal.SIGKILL)  # crash: daemon, guardian and rig
        first.proc.wait(10)
    finally:
        first.stop()
    third = DaemonProc(tmp_path, None).start()
    try:
        ready = third.wait_ready()
        assert ready["unclean_restart"] is True, ready  # the protective stop is not skipped
        stop = third.socket_cmd("status")["result"]["stop"]
        assert "unclean_restart" in stop["causes"], stop
    finally:
        third.stop()


def test_a_state_dir_others_can_write_is_refused_and_left_alone(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir()
    os.chmod(state, 0o777)
    d = DaemonProc(tmp_path, None).start()
    rc = _wait_exit(d)
    out = "\n".join(d.lines)
    assert rc == 78 and "writable by group or others (mode 0777)" in out, out
    assert list(state.iterdir()) == []


def test_the_running_marker_is_never_written_through_a_symlink(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    target = tmp_path / "precious.txt"
    target.write_text("keep me\n")
    (state / MARKER).symlink_to(target)
    d = DaemonProc(tmp_path, None).start()
    try:
        ready = d.wait_ready()
        assert target.read_text() == "keep me\n"
        assert not (state / MARKER).is_symlink() and (state / MARKER).is_file()
        assert ready["unclean_restart"] is True  # a planted marker counts as an unclean stop
    finally:
        d.stop()
    assert not (state / MARKER).exists()  # removed at the clean shutdown
    assert target.read_text() == "keep me\n"

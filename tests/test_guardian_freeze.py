"""The link guardian frozen mid-task: a setpoint it held when it froze never reaches the robot.

A SIGSTOP (a debugger, a cgroup freezer, a swap storm) lands wherever the guardian's loop is:
most often in select(), where waking up reads a fresh clock and the deadman drops the daemon's
queued setpoints — but also between its clock read and the write of a POSITION the rules let
through on that clock. hil.guardian_freeze_loop caught that under load: the rig read seq 504
3 ms before the SIGSTOP and seq 505, a POSITION, 8 ms after the SIGCONT 1.5 s later, with the
guardian stopped in user space (/proc/PID/syscall -1), the firmware's deadman tripped and the
daemon's `deadman` stop latched meanwhile. Here the real Guardian loop object runs on a real pty
against the firmware peer and a real socketpair, and the freeze is what it leaves behind: a
clock read before the freeze judging, and writing, the frames read after it.
"""

from __future__ import annotations

import os
import select
import signal
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from edge_agent.link.codec import (
    Command,
    Enable,
    GReset,
    GripperMode,
    Hello,
    Message,
    Mode,
    Ping,
    Stop,
    StopCategory,
    StopReason,
    encode,
)
from edge_agent.link.guardian import Guardian, parse_args
from edge_agent.link.guardian_actions import is_motion
from edge_agent.link.guardian_rules import Limits
from edge_agent.robot import load_robot
from hil.peer import FirmwarePeer, PeerPty

ROBOT = Path(__file__).resolve().parents[1] / "configs" / "robot" / "edge-arm-4.toml"
HOLD = Limits.from_robot(load_robot(ROBOT)).hold()
DEADMAN_MS = 50


def position(q0: float = 0.125) -> Command:
    return Command(Mode.POSITION, (q0, 1.0, -1.0, 0.0), GripperMode.POSITION, 0.03125, 0.75)


@pytest.fixture
def rig(tmp_path: Path) -> Iterator[tuple[FirmwarePeer, Guardian, socket.socket]]:
    """The firmware peer (no STATUS stream: nothing here reads the tty), a Guardian on its pty,
    and the daemon's end of the socketpair. The Guardian's signal handlers are undone after."""
    peer = FirmwarePeer(PeerPty(tmp_path)).start()
    peer.streaming = False
    ours, theirs = socket.socketpair()
    theirs.setblocking(False)
    saved = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    args = parse_args(["--fd", str(theirs.fileno()), "--port", peer.pty.path, "--robot",
                       str(ROBOT), "--priority", "0", "--deadman-ms", str(DEADMAN_MS)])
    g = Guardian(args, theirs, Limits.from_robot(load_robot(ROBOT)), realtime=False)
    try:
        now = time.monotonic()
        g.link.poll(now)  # opens the pty; its HELLO goes out after the link call
        g._flush(now)
        peer.wait_for(lambda f: isinstance(f.msg, Hello))
        while not g.rules.link_up:  # the HELLO_ACK: the link is up (a reset needs it)
            assert select.select([g.link.fileno()], [], [], 5)[0], "no HELLO_ACK"
            g._from_tty(time.monotonic())
        yield peer, g, ours
    finally:
        g.link.stop()
        for s, h in saved.items():
            signal.signal(s, h)
        wake_w = signal.set_wakeup_fd(-1)
        for fd in (wake_w, g.wake_r):
            if fd >= 0:
                os.close(fd)
        ours.close()
        theirs.close()
        peer.stop()


def _daemon_sends(g: Guardian, ours: socket.socket, msgs: list[Message], now: float | None,
                  seq: list[int]) -> None:
    """The daemon writes `msgs`; the guardian reads and judges them on `now` (None: fresh)."""
    data = b""
    for m in msgs:
        seq[0] += 1
        data += encode(m, seq[0])
    ours.sendall(data)
    assert select.select([g.sock], [], [], 5)[0], "the daemon's frames did not arrive"
    g._from_daemon(time.monotonic() if now is None else now)


def _passed(peer: FirmwarePeer, mark: int, marker: Ping) -> list[Message]:
    peer.wait_for(lambda f: f.msg == marker, start=mark)
    with peer._cond:
        msgs = [f.msg for f in peer.received[mark:]]
    return msgs[: msgs.index(marker)]


def _freeze(g: Guardian, seconds: float) -> float:
    """The clock read a freeze leaves behind: the loop's tick, then `seconds` of nothing (the
    wait is the freeze being replayed, not a synchronisation); returns the tick's time."""
    read = time.monotonic()
    g._apply(g.rules.on_tick(read), read)
    while time.monotonic() < read + seconds:
        time.sleep(0.01)
    return read


def test_setpoints_judged_on_a_clock_read_before_the_freeze_are_not_written_after_it(
        rig: tuple[FirmwarePeer, Guardian, socket.socket]) -> None:
    peer, g, ours = rig
    seq = [0]
    _daemon_sends(g, ours, [Enable(True), position()], None, seq)
    peer.wait_for(lambda f: f.msg == position())  # moving

    # Frozen after its clock read, for longer than the deadman, while the daemon's setpoints
    # queued in the socketpair (read at once after the wake, judged on the old clock).
    mark = peer.mark()
    stale = _freeze(g, 3 * DEADMAN_MS / 1000)
    _daemon_sends(g, ours, [position(0.25), position(0.375), position(0.5)], stale, seq)
    _daemon_sends(g, ours, [Ping(7)], None, seq)
    passed = _passed(peer, mark, Ping(7))
    assert not [m for m in passed if is_motion(m)], passed
    assert g.rules.latched and g.rules.cause == StopReason.DEADMAN
    # the check before the write caught it (or, when this test itself was starved for longer
    # than the deadman before the replayed freeze, the gap in the rules' own time did first)
    assert g.rules.counters["stale_dropped"] == 1 or g.rules.counters["stalls"] >= 1

    # The latch holds like every deadman: G_RESET, ENABLE(1), then new setpoints move again.
    mark = peer.mark()
    _daemon_sends(g, ours, [HOLD, Stop(StopCategory.CAT2, StopReason.DEADMAN)], None, seq)
    _daemon_sends(g, ours, [GReset(), Enable(True), position(0.625), Ping(8)], None, seq)
    assert position(0.625) in _passed(peer, mark, Ping(8))

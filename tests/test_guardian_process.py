"""The guardian process against a firmware peer on a real pty, driven through GuardianClient."""

from __future__ import annotations

import os
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from edge_agent.link import codec
from edge_agent.link.codec import (
    Command,
    Enable,
    Frame,
    GAt,
    GripperMode,
    GState,
    Hello,
    Message,
    Mode,
    Ping,
    Status,
    StatusFlag,
    Stop,
    StopCategory,
    StopReason,
)
from edge_agent.link.guardian_client import GuardianClient
from edge_agent.link.guardian_rules import GuardianFlag, Limits
from edge_agent.robot import load_robot
from hil.peer import FirmwarePeer, PeerPty

ROOT = Path(__file__).resolve().parents[1]
ROBOT = ROOT / "configs" / "robot" / "edge-arm-4.toml"
HOLD = Limits.from_robot(load_robot(ROBOT)).hold()
ESTOP_STOP = Stop(StopCategory.CAT0, StopReason.ESTOP_INPUT)
Q_OK = (0.125, 1.0, -1.0, 0.0)  # exact in f32, so frames compare equal after the wire


def f32(x: float) -> float:
    return float(struct.unpack("<f", struct.pack("<f", x))[0])


def position(q: tuple[float, ...] = Q_OK) -> Command:
    return Command(Mode.POSITION, tuple(f32(v) for v in q), GripperMode.POSITION, 0.03125, 0.75)


def is_motion(m: Message) -> bool:
    return (isinstance(m, Command) and m.moves) or (isinstance(m, Enable) and m.enable)


class Daemon:
    """The daemon's view: every frame from the guardian, and waiting for a G_STATE."""

    def __init__(self) -> None:
        self.frames: list[Frame] = []
        self.cond = threading.Condition()
        self.downs: list[str] = []
        self.ups = 0

    def on_frame(self, f: Frame) -> None:
        with self.cond:
            self.frames.append(f)
            self.cond.notify_all()

    def on_down(self, reason: str) -> None:
        with self.cond:
            self.downs.append(reason)
            self.cond.notify_all()

    def on_up(self) -> None:
        with self.cond:
            self.ups += 1
            self.cond.notify_all()

    def mark(self) -> int:
        with self.cond:
            return len(self.frames)

    def wait(self, cond: Callable[[], bool], timeout: float = 15.0) -> None:
        with self.cond:
            if not self.cond.wait_for(cond, timeout):
                raise AssertionError("timed out")

    def states_since(self, start: int) -> list[GState]:
        with self.cond:
            return [f.msg for f in self.frames[start:] if isinstance(f.msg, GState)]

    def wait_state(self, pred: Callable[[GState], bool], start: int = 0,
                   timeout: float = 15.0) -> GState:
        found: list[GState] = []

        def hit() -> bool:
            found[:] = [f.msg for f in self.frames[start:]
                        if isinstance(f.msg, GState) and pred(f.msg)]
            return bool(found)

        self.wait(hit, timeout)
        return found[0]


@pytest.fixture
def peer(tmp_path: Path) -> Iterator[FirmwarePeer]:
    p = FirmwarePeer(PeerPty(tmp_path)).start()
    yield p
    p.stop()


def start_client(peer: FirmwarePeer, daemon: Daemon, deadman_s: float = 0.05,
                 **kw: object) -> GuardianClient:
    kw.setdefault("priority", 0)
    client = GuardianClient(peer.pty.path, ROBOT, deadman_s, on_frame=daemon.on_frame,
                            on_guardian_down=daemon.on_down, on_guardian_up=daemon.on_up,
                            **kw)  # type: ignore[arg-type]
    client.start()
    daemon.wait_state(lambda s: s.link_up and bool(s.flags & GuardianFlag.SESSION_OPEN))
    return client


def sent_after(peer: FirmwarePeer, mark: int, marker: Ping) -> list[Message]:
    """What reached the tty from `mark` up to the marker PING (sent last by the test)."""
    peer.wait_for(lambda f: f.msg == marker, start=mark)
    with peer._cond:
        msgs = [f.msg for f in peer.received[mark:]]
    return msgs[: msgs.index(marker)]


def test_the_firmware_deadman_outlasts_the_guardians(tmp_path: Path) -> None:
    """With a 250 ms guardian deadman (the tests' setting) a fixed 100 ms firmware deadman
    tripped first on a 100-250 ms stall, before the guardian's HOLD stream began: the HELLO asks
    the firmware for twice the guardian's deadman."""
    peer = FirmwarePeer(PeerPty(tmp_path)).start()
    client = GuardianClient(peer.pty.path, ROBOT, 0.25, on_frame=lambda f: None,
                            on_guardian_down=lambda why: None, on_guardian_up=lambda: None,
                            priority=0)
    try:
        client.start()
        hello = peer.wait_for(lambda f: isinstance(f.msg, Hello)).msg
        assert isinstance(hello, Hello) and hello.deadman_ms == 500, hello
    finally:
        client.stop()
        peer.stop()


def test_estop_latch_reset_and_enable_at_the_wire(peer: FirmwarePeer) -> None:
    # a 1 s deadman: the test's own pauses between steps (a loaded CI machine) must not trip
    # it — 50 ms did once (12-07: a deadman latch refused the last ENABLE, nothing passed)
    daemon = Daemon()
    client = start_client(peer, daemon, deadman_s=1.0)
    try:
        hello = peer.wait_for(lambda f: isinstance(f.msg, Hello)).msg
        assert isinstance(hello, Hello) and hello.deadman_ms == 2000  # 2 x the guardian's
        # firmware frames are relayed to the daemon unchanged
        daemon.wait(lambda: any(isinstance(f.msg, Status) for f in daemon.frames))
        client.send(Enable(True))
        client.send(position())
        peer.wait_for(lambda f: f.msg == position())

        m = daemon.mark()
        peer.press()
        peer.wait_for(lambda f: f.msg == ESTOP_STOP)
        st = daemon.wait_state(lambda s: s.latched, m)
        assert st.cause == StopReason.ESTOP_INPUT and st.estop_input

        mark = peer.mark()
        for _ in range(3):
            client.send(position())
        client.send(Enable(True))
        client.send(Command(Mode.HOLD, Q_OK))
        client.send(Ping(1))
        passed = sent_after(peer, mark, Ping(1))
        assert not [x for x in passed if is_motion(x)]
        assert Command(Mode.HOLD, Q_OK) in passed

        m = daemon.mark()
        client.reset()
        st = daemon.wait_state(lambda s: s.cause == StopReason.RESET_REFUSED, m)
        assert st.latched

        mark = peer.mark()
        peer.release()
        peer.press()  # a second press edge: another stop frame although latched
        peer.wait_for(lambda f: f.msg == ESTOP_STOP, start=mark)
        m = daemon.mark()
        peer.release()
        daemon.wait_state(lambda s: not s.estop_input, m)
        m = daemon.mark()
        client.reset()
        st = daemon.wait_state(lambda s: not s.latched, m)
        assert st.flags & GuardianFlag.NEED_ENABLE

        mark = peer.mark()
        client.send(position())
        client.send(Ping(2))
        assert not [x for x in sent_after(peer, mark, Ping(2)) if is_motion(x)]

        mark = peer.mark()
        client.send(Enable(True))
        client.send(position((9.0, 9.0, 9.0, 9.0)))
        client.send(Ping(3))
        passed = sent_after(peer, mark, Ping(3))
        assert passed and passed[0] == Enable(True), (passed, daemon.states_since(m))
        assert position((2.8, 2.2, 0.3, 1.2)) in passed  # clamped to the robot's limits
    finally:
        client.stop()
        client.stop()


def test_a_timed_command_reaches_the_tty_at_its_deadline_and_a_stop_drops_it(
        peer: FirmwarePeer) -> None:
    """G_AT: the guardian holds the frame until its CLOCK_MONOTONIC deadline (a frame sent
    after it overtakes it), then writes it; one due further ahead than the deadman is refused;
    a STOP before the deadline drops it. Only lower bounds on time are asserted: a slow
    machine makes the frame later, never earlier."""
    daemon = Daemon()
    client = start_client(peer, daemon)
    try:
        client.send(Enable(True))
        mark = peer.mark()
        due = time.monotonic() + 0.04  # within the deadman (50 ms here): further is refused
        client.send(GAt(round(due * 1e6), position()))
        client.send(Ping(1))
        peer.wait_for(lambda f: f.msg == position(), start=mark)
        assert time.monotonic() >= due, "the guardian wrote a timed frame before its deadline"
        with peer._cond:
            order = [f.msg for f in peer.received[mark:]]
        assert order.index(Ping(1)) < order.index(position())

        mark = peer.mark()
        client.send(GAt(round((time.monotonic() + 1.0) * 1e6), position()))
        client.send(Ping(2))
        assert not [x for x in sent_after(peer, mark, Ping(2)) if is_motion(x)]

        mark = peer.mark()
        due = time.monotonic() + 0.04
        client.send(GAt(round(due * 1e6), position((0.25, 1.0, -1.0, 0.0))))
        client.send(Stop(StopCategory.CAT2, StopReason.PROTECTIVE))
        time.sleep(max(0.0, due - time.monotonic()) + 0.1)
        client.send(Ping(3))
        passed = sent_after(peer, mark, Ping(3))
        assert Stop(StopCategory.CAT2, StopReason.PROTECTIVE) in passed
        assert not [x for x in passed if is_motion(x)]
    finally:
        client.stop()


def test_deadman_hold_when_the_daemon_goes_quiet(peer: FirmwarePeer) -> None:
    """Silence past the deadman: holds on the tty and a latch — the daemon's next (stale)
    setpoint ends the hold stream but does not reach the robot."""
    daemon = Daemon()
    client = start_client(peer, daemon)
    try:
        mark = peer.mark()
        client.send(position())
        # the test sends nothing more: within the deadman the guardian streams holds
        peer.wait_for(lambda f: f.msg == HOLD, start=mark)
        st = daemon.wait_state(lambda s: s.deadman_hold)
        assert st.cause == StopReason.DEADMAN and st.latched
        m = daemon.mark()
        after = peer.mark()
        client.send(position())
        st = daemon.wait_state(lambda s: not s.deadman_hold, m)
        assert st.latched and st.cause == StopReason.DEADMAN
        client.send(Ping(7))  # frames stay in order: once PING is through, so was the COMMAND
        peer.wait_for(lambda f: isinstance(f.msg, Ping), start=after)
        assert not any(f.msg.TYPE == codec.FrameType.COMMAND and f.msg.moves
                       for f in list(peer.received)[after:]), "a stale setpoint reached the robot"
    finally:
        client.stop()


def test_daemon_end_of_file_holds_and_the_guardian_exits(peer: FirmwarePeer) -> None:
    ours, theirs = socket.socketpair()
    proc = subprocess.Popen(
        [sys.executable, "-m", "edge_agent.link.guardian", "--fd", str(theirs.fileno()),
         "--port", peer.pty.path, "--robot", str(ROBOT), "--priority", "0"],
        pass_fds=(theirs.fileno(),), cwd=ROOT)
    theirs.close()
    try:
        dec = codec.FrameDecoder()
        ours.settimeout(15)
        up = False
        while not up:
            data = ours.recv(65536)
            assert data, "guardian exited early"
            up = any(isinstance(f.msg, GState) and f.msg.link_up for f in dec.feed(data))
        # firmware frames keep their numbers and G_STATE reuses the last one: no gaps
        assert dec.counters.seq_gaps == 0 and dec.counters.bad_frames == 0
        ours.sendall(codec.encode(position(), 0))
        peer.wait_for(lambda f: f.msg == position())
        mark = peer.mark()
        ours.close()  # the daemon dies
        peer.wait_for(lambda f: f.msg == HOLD, start=mark)
        assert proc.wait(timeout=15) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_sigterm_holds_and_exits_cleanly(peer: FirmwarePeer) -> None:
    daemon = Daemon()
    client = start_client(peer, daemon)
    proc = client._proc
    assert proc is not None
    mark = peer.mark()
    client.stop()  # SIGTERM
    peer.wait_for(lambda f: f.msg == HOLD, start=mark)
    assert proc.returncode == 0
    assert daemon.downs == []  # a requested stop is not a failure


def test_a_dead_guardian_is_reported_and_restarted_latched(peer: FirmwarePeer) -> None:
    daemon = Daemon()
    client = start_client(peer, daemon, restart_min_s=0.01, restart_max_s=0.05)
    try:
        old = client.pid
        assert old is not None
        m = daemon.mark()
        os.kill(old, 9)
        daemon.wait(lambda: daemon.ups == 1)
        assert "exited" in daemon.downs[0]
        assert client.pid != old and client.restarts == 1
        st = daemon.wait_state(lambda s: s.link_up, m)
        assert st.latched and st.cause == StopReason.PROTECTIVE
        m = daemon.mark()
        client.reset()
        daemon.wait_state(lambda s: not s.latched, m)
    finally:
        client.stop()


def test_tty_loss_is_a_link_fault_and_a_new_device_recovers(peer: FirmwarePeer) -> None:
    daemon = Daemon()
    client = start_client(peer, daemon)
    try:
        m = daemon.mark()
        peer.unplug()
        st = daemon.wait_state(lambda s: not s.link_up, m)
        assert st.latched and st.cause == StopReason.LINK_FAULT
        mark = peer.mark()
        m = daemon.mark()
        peer.replug()
        daemon.wait_state(lambda s: s.link_up, m)
        peer.wait_for(lambda f: isinstance(f.msg, Hello), start=mark)  # a new session
        m = daemon.mark()
        client.reset()
        daemon.wait_state(lambda s: not s.latched, m)
    finally:
        client.stop()


def test_realtime_flag_says_whether_sched_fifo_was_granted(peer: FirmwarePeer) -> None:
    daemon = Daemon()
    client = start_client(peer, daemon, priority=30)
    try:
        pid = client.pid
        assert pid is not None
        fifo = os.sched_getscheduler(pid) == os.SCHED_FIFO
        st = daemon.wait_state(lambda s: True)
        assert bool(st.flags & GuardianFlag.REALTIME) == fifo
    finally:
        client.stop()


def test_send_while_stopped_raises_link_error(peer: FirmwarePeer) -> None:
    from edge_agent.errors import LinkError

    daemon = Daemon()
    client = start_client(peer, daemon)
    client.stop()
    with pytest.raises(LinkError):
        client.send(Ping(0))


def test_the_guardian_imports_nothing_heavy() -> None:
    code = ("import sys; before = set(sys.modules); import edge_agent.link.guardian; "
            "print(' '.join(sorted({m.split('.')[0] for m in set(sys.modules) - before} "
            "- set(sys.stdlib_module_names))))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                         check=True).stdout.split()
    assert set(out) <= {"edge_agent", "serial"}, out


def test_commands_before_the_guardian_is_ready_are_dropped_other_frames_wait(
        peer: FirmwarePeer) -> None:
    daemon = Daemon()
    client = GuardianClient(peer.pty.path, ROBOT, 0.05, on_frame=daemon.on_frame, priority=0)
    client.start()
    pid = client.pid
    assert pid is not None
    os.kill(pid, signal.SIGSTOP)  # hold it in its start-up
    try:
        if client.ready:
            pytest.skip("the guardian was up before it could be paused")
        for _ in range(500):  # 2.5 s of a 200 Hz stream: would fill the socket and block
            client.send(position())
        stop = Stop(StopCategory.CAT2, StopReason.PROTECTIVE)
        client.send(stop)
        assert client.dropped_before_ready == 500
    finally:
        os.kill(pid, signal.SIGCONT)
    try:
        peer.wait_for(lambda f: f.msg == stop)
        st = daemon.wait_state(lambda s: s.latched and s.link_up)
        assert st.cause == StopReason.PROTECTIVE
        assert client.ready
        assert not [f for f in peer.received if isinstance(f.msg, Command)]
    finally:
        client.stop()


@pytest.mark.parametrize(("fault_after", "faults"), [(4, True), (1000, False)])
def test_link_fault_after_is_how_many_bad_frames_in_a_row_fault_the_link(
        peer: FirmwarePeer, capfd: pytest.CaptureFixture[str], fault_after: int,
        faults: bool) -> None:
    """`link.fault_after` reaches the guardian (--fault-after): 6 bad frames in a row are a
    `bad_frames` link fault at 4, and nothing at 1000 (the next good frame is relayed)."""
    daemon = Daemon()
    client = start_client(peer, daemon, extra_args=("--fault-after", str(fault_after)))
    try:
        z = (0.0,) * 4
        marker = Status(424242, StatusFlag.SESSION_OPEN, 0, z, z, z, 0.0, 0.0, 0.0)
        bad = bytearray(codec.encode(marker, 7))
        bad[6] = bad[6] ^ 0x40 or 0x40  # a CRC error; never a 0x00 (that would split the frame)
        m = daemon.mark()
        if faults:
            peer.streaming = False  # no good frame right after the burst to reset the count
            peer.send_raw(bytes(bad) * 6)
            st = daemon.wait_state(lambda s: not s.link_up, m)
            assert st.latched and st.cause == StopReason.LINK_FAULT
        else:
            peer.send_raw(bytes(bad) * 6 + codec.encode(marker, 12345))
            daemon.wait(lambda: any(f.msg == marker for f in daemon.frames[m:]))
            upto = [f.msg for f in daemon.frames[m:]]
            upto = upto[: upto.index(marker)]
            assert not [g for g in upto if isinstance(g, GState) and not g.link_up]
    finally:
        client.stop()
    faults_logged = [ln for ln in capfd.readouterr().err.splitlines()
                     if '"link_fault"' in ln and '"bad_frames"' in ln]
    assert bool(faults_logged) == faults, faults_logged


def test_the_link_keys_reach_the_guardian_command_line(tmp_path: Path) -> None:
    """spec_from_config hands [link] to the guardian: what the test above sets by hand."""
    from edge_agent.config import load_config
    from edge_agent.link.guardian import parse_args
    from edge_agent.link.guardian_spawn import spec_from_config

    (tmp_path / "state").mkdir()
    cfg = load_config(ROOT / "configs" / "sim.toml", [
        f"state_dir={tmp_path / 'state'}", "link.fault_after=7", "link.baudrate=115200",
        "link.write_timeout_ms=2.5", "link.reopen_min_s=0.3", "link.reopen_max_s=4"], sim=True)
    cmd = spec_from_config(cfg, "/dev/ttyX").command(3, restart=False)
    args = parse_args(cmd[cmd.index("--fd"):])
    assert (args.fault_after, args.baudrate, args.write_timeout_ms, args.reopen_min_s,
            args.reopen_max_s) == (7, 115200, 2.5, 0.3, 4.0)

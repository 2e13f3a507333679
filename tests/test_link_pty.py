"""The serial link over real ptys: bad frames skipped, unplug → fault, replug → recovery."""

from __future__ import annotations

import os
import random
import select
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from edge_agent.link import codec
from edge_agent.link.codec import Command, Hello, HelloAck, Mode, Status, StatusFlag, Stop
from edge_agent.link.serial_link import Backoff, LinkConfig, LinkThread, SerialLink
from hil.peer import FirmwarePeer, PeerPty

Z4 = (0.0, 0.0, 0.0, 0.0)


def status(t: int = 0) -> Status:
    return Status(t, StatusFlag(0), 0, Z4, Z4, Z4, 0.0, 0.0, 0.0)


def wait_until(cond: Callable[[], bool], timeout: float = 10.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.002)


class Events:
    """Records the link's callbacks; a HELLO is sent on every open, as the guardian does."""

    def __init__(self) -> None:
        self.log: list[tuple[str, str]] = []
        self.lock = threading.Lock()
        self.link: SerialLink | None = None
        self.seq = codec.SeqCounter()

    def on_open(self, now: float) -> None:
        assert self.link is not None
        self.link.write(codec.encode(Hello(), self.seq.next()), now)
        with self.lock:
            self.log.append(("open", ""))

    def on_up(self, now: float) -> None:
        with self.lock:
            self.log.append(("up", ""))

    def on_down(self, cause: str, detail: str, now: float) -> None:
        with self.lock:
            self.log.append(("down", cause))

    def count(self, kind: str, cause: str | None = None) -> int:
        with self.lock:
            return sum(1 for k, c in self.log if k == kind and (cause is None or c == cause))


def make_link(path: str, events: Events, **kw: float | int) -> SerialLink:
    cfg = LinkConfig(port=path, **kw)  # type: ignore[arg-type]
    link = SerialLink(cfg, on_open=events.on_open, on_up=events.on_up, on_down=events.on_down,
                      rng=random.Random(1))
    events.link = link
    return link


@pytest.fixture
def pty(tmp_path: Path) -> Iterator[PeerPty]:
    p = PeerPty(tmp_path)
    yield p
    p.close()


def test_corrupted_truncated_and_duplicated_frames_are_counted_and_skipped(pty: PeerPty) -> None:
    events = Events()
    runner = LinkThread(make_link(pty.path, events, rx_timeout_s=30.0)).start()
    try:
        wait_until(lambda: events.count("open") == 1, what="open")
        good = [codec.encode(status(i), i) for i in range(5)]
        corrupted = bytearray(good[1])
        i = next(k for k in range(len(corrupted) // 2, len(corrupted))
                 if corrupted[k] not in (0, 1))
        corrupted[i] ^= 0x01
        truncated = good[2][: len(good[2]) // 2]
        assert pty.master is not None
        os.write(pty.master, good[0] + bytes(corrupted) + truncated + good[3] + good[3] + good[4])
        seqs = [runner.frames.get(timeout=10).seq for _ in range(3)]
        assert seqs == [0, 3, 4]
        c = runner.link.counters_dict()
        assert c["rx_bad_frames"] == 2
        assert c["duplicates_skipped"] == 1
        assert c["rx_frames_ok"] == 4
        assert c["resyncs"] >= 1
        assert events.count("down") == 0 and events.count("up") == 1
        assert runner.frames.empty()
    finally:
        runner.stop()


def test_unplugged_peer_is_a_fault_and_a_new_device_recovers(pty: PeerPty) -> None:
    peer = FirmwarePeer(pty).start()
    events = Events()
    runner = LinkThread(make_link(pty.path, events, rx_timeout_s=0.2, backoff_min_s=0.01,
                                  backoff_max_s=0.05)).start()
    try:
        wait_until(lambda: events.count("up") == 1, what="link up")
        assert isinstance(peer.wait_for(lambda f: isinstance(f.msg, Hello)).msg, Hello)
        peer.unplug()
        wait_until(lambda: events.count("down") == 1, what="link fault")
        assert events.log[-1] == ("down", "port_lost")
        assert not runner.link.up
        peer.replug()
        wait_until(lambda: events.count("up") == 2, what="recovery")
        c = runner.link.counters
        assert c.faults == 1 and c.recoveries == 1 and c.opens == 2
        assert events.count("down") == 1  # retries during the outage are not new faults
        # frames flow again after the recovery
        while not runner.frames.empty():
            runner.frames.get_nowait()
        f = runner.frames.get(timeout=10)
        assert isinstance(f.msg, Status | HelloAck)
    finally:
        runner.stop()
        peer.stop()


def test_a_silent_peer_is_a_fault_and_recovers_when_it_talks_again(pty: PeerPty) -> None:
    peer = FirmwarePeer(pty).start()
    events = Events()
    runner = LinkThread(make_link(pty.path, events, rx_timeout_s=0.05, backoff_min_s=0.01,
                                  backoff_max_s=0.05)).start()
    try:
        wait_until(lambda: events.count("up") == 1, what="link up")
        peer.streaming = False
        wait_until(lambda: events.count("down") == 1, what="silent fault")
        assert events.log[-1] == ("down", "silent")
        assert runner.link.counters.timeouts >= 3
        peer.streaming = True
        wait_until(lambda: events.count("up") == 2, what="recovery")
        assert runner.link.counters.recoveries == 1
    finally:
        runner.stop()
        peer.stop()


def test_a_port_that_never_answers_is_a_fault_and_is_reopened(pty: PeerPty) -> None:
    events = Events()
    runner = LinkThread(make_link(pty.path, events, open_timeout_s=0.2, backoff_min_s=0.01,
                                  backoff_max_s=0.05)).start()
    try:
        wait_until(lambda: events.count("down") == 1, what="silent fault")
        assert events.log[-1] == ("down", "silent")
        wait_until(lambda: events.count("open") >= 3, what="reopens")
        assert events.count("up") == 0 and events.count("down") == 1
    finally:
        runner.stop()


def test_missing_port_is_reported_and_opened_once_it_exists(tmp_path: Path) -> None:
    path = str(tmp_path / "ttyLATE")
    events = Events()
    runner = LinkThread(make_link(path, events, rx_timeout_s=0.5, backoff_min_s=0.01,
                                  backoff_max_s=0.05)).start()
    pty: PeerPty | None = None
    peer: FirmwarePeer | None = None
    try:
        wait_until(lambda: events.count("down", "open_failed") == 1, what="open failure")
        wait_until(lambda: runner.link.counters.open_failures >= 2, what="retries")
        pty = PeerPty(tmp_path, "ttyLATE")
        peer = FirmwarePeer(pty).start()
        wait_until(lambda: events.count("up") == 1, what="link up")
        assert events.count("down") == 1
    finally:
        runner.stop()
        if peer is not None:
            peer.stop()
        elif pty is not None:
            pty.close()


def test_a_stop_frame_gets_through_a_full_output_buffer(pty: PeerPty) -> None:
    events = Events()
    link = make_link(pty.path, events, rx_timeout_s=30.0, max_write_timeouts=1000,
                     write_timeout_s=0.002)
    link.poll(time.monotonic())
    assert events.count("open") == 1
    cmd = codec.encode(Command(Mode.POSITION, (0.1, 0.2, 0.3, 0.4)), 0)
    try:
        # nobody reads the master: fill the pty until a write times out
        while link.write(cmd, time.monotonic()):
            pass
        assert link.counters.write_timeouts == 1
        assert link.write(codec.encode(Stop(codec.StopCategory.CAT0, codec.StopReason.ESTOP_INPUT),
                                       1), time.monotonic(), urgent=True)
        assert pty.master is not None
        dec = codec.FrameDecoder()
        frames: list[codec.Frame] = []
        while select.select([pty.master], [], [], 0.2)[0]:
            frames += dec.feed(os.read(pty.master, 65536))
        assert frames and isinstance(frames[-1].msg, Stop)
        assert events.count("down") == 0
    finally:
        link.stop()


def test_a_pyserial_url_is_a_selectable_transport() -> None:
    events = Events()
    link = make_link("loop://", events, rx_timeout_s=30.0)
    try:
        link.poll(time.monotonic())  # opens and sends HELLO, which loop:// sends back
        fd = link.fileno()
        assert fd is not None
        frames: list[codec.Frame] = []
        deadline = time.monotonic() + 10
        while not frames and time.monotonic() < deadline:
            if select.select([fd], [], [], 0.5)[0]:
                frames += link.read(time.monotonic()).frames
        assert [type(f.msg) for f in frames] == [Hello]
        assert link.up and events.count("up") == 1
    finally:
        link.stop()
        link.stop()  # idempotent


def test_backoff_grows_exponentially_with_jitter_and_is_capped() -> None:
    b = Backoff(0.1, 1.0, random.Random(7))
    delays = [b.next() for _ in range(8)]
    for k, d in enumerate(delays):
        base = min(1.0, 0.1 * 2**k)
        assert 0.5 * base <= d <= base
    assert len(set(delays)) == len(delays)  # jittered: no two retries in lock-step
    b.reset()
    assert b.next() <= 0.1

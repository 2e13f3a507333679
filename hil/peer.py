"""A minimal firmware peer on a real pty, for link and guardian tests (the full robot is hil/sim).

`PeerPty` is a pty pair whose slave is reached through a stable symlink (as udev's
/dev/serial/by-id links are), so a test can unplug the device and plug a new one at the same path.
`FirmwarePeer` runs on a thread at the master side: it answers HELLO, streams STATUS with the
e-stop input in its flags, sends ESTOP_EDGE on press/release, and records every frame the host
wrote so a test can wait for one.
"""

from __future__ import annotations

import contextlib
import math
import os
import select
import threading
import time
import tty
from collections.abc import Callable
from pathlib import Path

from edge_agent.link import codec
from edge_agent.link.codec import (
    Frame,
    FrameDecoder,
    Hello,
    HelloAck,
    Message,
    SeqCounter,
    Status,
    StatusFlag,
)


class PeerPty:
    """A pty whose slave is reachable at `path` (a symlink) until unplugged."""

    def __init__(self, directory: str | Path, name: str = "ttyPEER") -> None:
        self.path = str(Path(directory) / name)
        self.master: int | None = None
        self._slave: int | None = None
        self.plug()

    def plug(self) -> None:
        """Create a new pty and point `path` at it (a fresh device at the same path)."""
        master, slave = os.openpty()
        tty.setraw(slave)  # no echo, no line editing, before anyone writes a byte
        os.set_blocking(master, False)
        self.master, self._slave = master, slave
        tmp = self.path + ".new"
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        os.symlink(os.ttyname(slave), tmp)
        os.replace(tmp, self.path)

    def unplug(self) -> None:
        """Remove the device: the host sees EIO/hang-up and the path disappears."""
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)
        for fd in (self.master, self._slave):
            if fd is not None:
                with contextlib.suppress(OSError):
                    os.close(fd)
        self.master = self._slave = None

    def close(self) -> None:
        self.unplug()


class FirmwarePeer:
    """The firmware side of a PeerPty on a thread: HELLO, STATUS stream, e-stop, a frame log."""

    def __init__(self, pty: PeerPty, *, n_joints: int = 4, status_period_s: float = 0.002,
                 stream_before_hello: bool = False) -> None:
        self.pty = pty
        self.n_joints = n_joints
        self.status_period_s = status_period_s
        self.stream_before_hello = stream_before_hello
        self.streaming = True
        self.pressed = False
        self.session_open = False
        self.received: list[Frame] = []
        self.decoder = FrameDecoder()
        self._seq = SeqCounter()
        self._cond = threading.Condition()
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="firmware-peer", daemon=True)
        self._t0 = time.monotonic()

    def start(self) -> FirmwarePeer:
        self._thread.start()
        return self

    # -- what a test does ------------------------------------------------------------------
    def send(self, msg: Message) -> None:
        self.send_raw(codec.encode(msg, self._seq.next()))

    def send_raw(self, data: bytes) -> None:
        with self._cond:
            fd = self.pty.master
            if fd is None:
                return
            view = memoryview(data)
            deadline = time.monotonic() + 1.0  # a host that reads nothing: drop, do not hang
            while view and time.monotonic() < deadline:
                try:
                    view = view[os.write(fd, view):]
                except BlockingIOError:
                    select.select([], [fd], [], 0.01)
                except OSError:
                    return

    def press(self) -> None:
        self._edge(True)

    def release(self) -> None:
        self._edge(False)

    def _edge(self, pressed: bool) -> None:
        with self._cond:
            self.pressed = pressed
            self.send(codec.EstopEdge(self._fw_us(), pressed))
            self.send(self._status())

    def unplug(self) -> None:
        with self._cond:
            self.pty.unplug()
            self.session_open = False
            self.decoder.reset()

    def replug(self) -> None:
        with self._cond:
            self.pty.plug()
            self._cond.notify_all()

    def wait_for(self, pred: Callable[[Frame], bool], timeout: float = 10.0,
                 start: int = 0) -> Frame:
        """The first frame from the host (from index `start` on) that satisfies `pred`."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                for f in self.received[start:]:
                    if pred(f):
                        return f
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"no matching frame from the host in {timeout} s")
                self._cond.wait(left)

    def mark(self) -> int:
        """An index into `received`, to wait only for frames after this point."""
        with self._cond:
            return len(self.received)

    def stop(self) -> None:
        with self._cond:
            self._stopping = True
        if self._thread.is_alive():
            self._thread.join(timeout=2.0)
        self.pty.close()

    # -- the firmware loop -----------------------------------------------------------------
    def _fw_us(self) -> int:
        return int((time.monotonic() - self._t0) * 1e6)

    def _status(self) -> Status:
        flags = StatusFlag(0)
        if self.pressed:
            flags |= StatusFlag.ESTOP_INPUT | StatusFlag.ESTOP_LATCHED
        if self.session_open:
            flags |= StatusFlag.SESSION_OPEN
        z = (0.0,) * self.n_joints
        return Status(self._fw_us(), flags, 0, z, z, z, 0.0, 0.0, 0.0)

    def _run(self) -> None:
        next_status = time.monotonic()
        while True:
            with self._cond:
                if self._stopping:
                    return
                fd = self.pty.master
            if fd is None:
                with self._cond:
                    self._cond.wait(0.01)
                continue
            timeout = max(0.0, next_status - time.monotonic())
            try:
                ready = select.select([fd], [], [], timeout)[0]
            except (OSError, ValueError):
                continue
            with self._cond:
                if self.pty.master != fd:
                    continue
                if ready:
                    try:
                        data = os.read(fd, 65536)
                    except (BlockingIOError, OSError):
                        data = b""
                    for f in self.decoder.feed(data):
                        self._on_frame(f)
                now = time.monotonic()
                if now >= next_status:
                    next_status = now + self.status_period_s
                    if self.streaming and (self.session_open or self.stream_before_hello):
                        self.send(self._status())

    def _on_frame(self, f: Frame) -> None:
        self.received.append(f)
        if isinstance(f.msg, Hello):
            self.session_open = f.msg.proto_version == codec.PROTO_VERSION
            self.send(HelloAck(codec.PROTO_VERSION, self.session_open, self.n_joints, "peer-1"))
        self._cond.notify_all()


# --------------------------------------------------------------------------- benchmark peer
# `python -m hil.peer --fd N --mode estop|pong`: the firmware side of a benchmark, in its own
# process (as the real firmware is), on the pty master passed as fd N. Prints one JSON line.


class _BenchPeer:
    """The firmware side of a benchmark: HELLO, STATUS at `status_hz`, PONG, e-stop edges."""

    def __init__(self, fd: int, status_hz: float) -> None:
        self.fd = fd
        self.dec = FrameDecoder()
        self.seq = SeqCounter()
        self.t0 = time.monotonic()
        self.period = 1.0 / status_hz if status_hz > 0 else math.inf
        self.pressed = False
        self.next_status = time.monotonic()
        self.host_frames = 0
        self.position_commands = 0

    def fw_us(self) -> int:
        return int((time.monotonic() - self.t0) * 1e6)

    def frame(self, msg: Message) -> bytes:
        return codec.encode(msg, self.seq.next())

    def status_frame(self) -> bytes:
        flags = StatusFlag.SESSION_OPEN
        if self.pressed:
            flags |= StatusFlag.ESTOP_INPUT | StatusFlag.ESTOP_LATCHED
        z = (0.0,) * 4
        return self.frame(Status(self.fw_us(), flags, 0, z, z, z, 0.0, 0.0, 0.0))

    def write(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            try:
                view = view[os.write(self.fd, view):]
            except BlockingIOError:
                select.select([], [self.fd], [], 0.01)

    def serve(self, until: float, want: Callable[[Frame], bool] | None = None) -> int | None:
        """Act as firmware until `until`; return perf_counter_ns() when a `want` frame arrives."""
        while True:
            now = time.monotonic()
            if now >= self.next_status:
                self.next_status = now + self.period
                self.write(self.status_frame())
            if now >= until:
                return None
            timeout = max(0.0, min(until, self.next_status) - now)
            if not select.select([self.fd], [], [], timeout)[0]:
                continue
            try:
                data = os.read(self.fd, 65536)
            except BlockingIOError:
                continue
            t = time.perf_counter_ns()
            for f in self.dec.feed(data):
                self.host_frames += 1
                m = f.msg
                if isinstance(m, Hello):
                    self.write(self.frame(HelloAck(codec.PROTO_VERSION, True, 4, "bench")))
                elif isinstance(m, codec.Ping):
                    self.write(self.frame(codec.Pong(m.host_time_us, self.fw_us())))
                elif isinstance(m, codec.Command) and m.moves:
                    self.position_commands += 1
                if want is not None and want(f):
                    return t


def _bench_peer(fd: int, mode: str, edges: int, warmup_s: float, status_hz: float,
                reply: str, gap_ms: tuple[float, float], seed: int) -> dict[str, object]:
    import random

    rng = random.Random(seed)
    peer = _BenchPeer(fd, status_hz)
    stop_frame = codec.Stop(codec.StopCategory.CAT0, codec.StopReason.ESTOP_INPUT)

    def got_reply(f: Frame) -> bool:
        if reply == "echo":
            return isinstance(f.msg, codec.EstopEdge) and f.msg.pressed
        return f.msg == stop_frame

    peer.serve(time.monotonic() + warmup_s)
    if mode == "pong":
        peer.serve(math.inf)
    lat_ns: list[int] = []
    misses = 0
    for _ in range(edges):
        peer.pressed = True
        data = peer.frame(codec.EstopEdge(peer.fw_us(), True)) + peer.status_frame()
        t_start = time.perf_counter_ns()
        peer.write(data)
        t_end = peer.serve(time.monotonic() + 0.5, got_reply)
        if t_end is None:
            misses += 1
        else:
            lat_ns.append(t_end - t_start)
        peer.serve(time.monotonic() + rng.uniform(*gap_ms) / 1000)
        peer.pressed = False
        peer.write(peer.frame(codec.EstopEdge(peer.fw_us(), False)) + peer.status_frame())
        peer.serve(time.monotonic() + rng.uniform(*gap_ms) / 1000)
    return {"lat_ns": lat_ns, "misses": misses, "host_frames": peer.host_frames,
            "position_commands": peer.position_commands}


def main(argv: list[str] | None = None) -> int:
    import argparse
    import json
    import sys

    p = argparse.ArgumentParser(prog="python -m hil.peer")
    p.add_argument("--fd", type=int, required=True, help="the pty master")
    p.add_argument("--mode", choices=("estop", "pong"), default="estop")
    p.add_argument("--edges", type=int, default=10000)
    p.add_argument("--warmup-s", type=float, default=1.0)
    p.add_argument("--status-hz", type=float, default=1000.0)
    p.add_argument("--reply", choices=("stop", "echo"), default="stop",
                   help="what answers a press: the guardian's STOP, or the edge echoed back")
    p.add_argument("--gap-ms", type=float, nargs=2, default=(1.0, 3.0))
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--priority", type=int, default=0,
                   help="SCHED_FIFO for the peer: real firmware is not a host process that waits "
                        "for a CPU, so a benchmark may take its scheduling out of the figures")
    a = p.parse_args(argv)
    if a.priority > 0:
        with contextlib.suppress(OSError):
            os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(a.priority))
    os.set_blocking(a.fd, False)
    res = _bench_peer(a.fd, a.mode, a.edges, a.warmup_s, a.status_hz, a.reply,
                      (a.gap_ms[0], a.gap_ms[1]), a.seed)
    sys.stdout.write(json.dumps(res) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

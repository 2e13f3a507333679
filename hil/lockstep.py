"""Lock-step runner: the simulated firmware and a host-side controller in virtual time, no I/O.

No threads, no tty, no sleeping: a discrete-event loop over integer microseconds exchanges real
protocol bytes between `hil.sim.firmware.Firmware` and a host object. Seeded, so a run is
reproducible; the same Firmware runs in real time on a pty (`python -m hil.rig`).

The host seam (docs in this module are the contract):

    class HostController(Protocol):
        def tick(self, now: float, frames: Sequence[Frame]) -> Iterable[bytes | Message]: ...

`tick` is called every `host_period_s` of virtual time with the frames that arrived since the
last call (already decoded by a FrameDecoder; `runner.host_decoder.counters` has the counts) and
returns what to send: encoded bytes (the host owns its sequence numbers) or messages (the runner
numbers them with one SeqCounter). Each direction has `link_latency_s` of delay. Order at equal
times: bytes reach the firmware, then the firmware ticks, then the host ticks.

    runner = Lockstep(robot, seed=7, host=my_host, host_period_s=0.005)
    runner.run_for(2.0)                     # or run_until(t) / run_until_true(pred, timeout_s)
    runner.inject("gripper", "weak_close", severity="recoverable")
    runner.fw.record.query(type="STOP")     # what the host sent; runner.state() the true state

Without a host, `ScriptedHost` is used: `runner.send(msg)` queues a frame and
`runner.host.frames` keeps everything received.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Protocol

from edge_agent.link.codec import Frame, FrameDecoder, Message, SeqCounter, encode
from edge_agent.robot import RobotDescription
from hil.sim.config import RigConfig
from hil.sim.faults import FaultSpec
from hil.sim.firmware import Firmware
from hil.sim.record import FrameRecord

_NEVER = 1 << 62  # µs: later than any run


class HostController(Protocol):
    """The host side plugged into the runner (guardian + daemon core, or a test script)."""

    def tick(self, now: float, frames: Sequence[Frame]) -> Iterable[bytes | Message]: ...


class ScriptedHost:
    """A host that keeps every frame it receives and sends what a test queues."""

    def __init__(self, keep: int = 1_000_000) -> None:
        self.frames: deque[tuple[float, Frame]] = deque(maxlen=keep)
        self.outbox: list[bytes | Message] = []

    def tick(self, now: float, frames: Sequence[Frame]) -> Iterable[bytes | Message]:
        for f in frames:
            self.frames.append((now, f))
        out, self.outbox = self.outbox, []
        return out

    def of_type(self, cls: type) -> list[Any]:
        """Messages of one class received so far, oldest first."""
        return [f.msg for _, f in self.frames if isinstance(f.msg, cls)]

    def last(self, cls: type) -> Any | None:
        for _, f in reversed(self.frames):
            if isinstance(f.msg, cls):
                return f.msg
        return None


class Lockstep:
    """Firmware ⇄ host in virtual time (seconds, starting at 0 = firmware time 0)."""

    def __init__(self, robot: RobotDescription, rig: RigConfig | None = None, *, seed: int = 0,
                 host: HostController | None = None, host_period_s: float = 0.005,
                 link_latency_s: float = 0.0001, schedule: Iterable[FaultSpec] = (),
                 record: FrameRecord | None = None) -> None:
        self.fw = Firmware(robot, rig, seed=seed, t0=0.0, record=record)
        self.host: HostController = host if host is not None else ScriptedHost()
        self.host_decoder = FrameDecoder()
        self.host_seq = SeqCounter()
        self.host_period_us = max(1, round(host_period_s * 1e6))
        self.latency_us = max(0, round(link_latency_s * 1e6))
        self.t_us = 0
        self._next_host_us = 0
        self._to_fw: list[tuple[int, int, bytes]] = []  # heap: (time, order, bytes)
        self._order = 0
        self._to_host: deque[tuple[int, bytes]] = deque()
        self.fw.faults.schedule(schedule)

    @property
    def now(self) -> float:
        return self.t_us * 1e-6

    # ------------------------------------------------------------------ inputs

    def send(self, msg: bytes | Message, at: float | None = None) -> None:
        """Queue a host frame outside the controller; it reaches the firmware at `at`
        (absolute virtual time, exactly) or after the link latency from now."""
        data = msg if isinstance(msg, bytes | bytearray) else encode(msg, self.host_seq.next())
        t = round(at * 1e6) if at is not None else self.t_us + self.latency_us
        if t < self.t_us:
            raise ValueError(f"cannot deliver in the past ({at} < {self.now})")
        self._queue_fw(t, bytes(data))

    def _queue_fw(self, t_us: int, data: bytes) -> None:
        self._order += 1
        heapq.heappush(self._to_fw, (t_us, self._order, data))

    def inject(self, target: str, mode: str, duration_s: float | None = None,
               severity: float | str | None = None) -> dict[str, Any]:
        """Start a rig fault now (see hil.sim.faults)."""
        return self.fw.inject(FaultSpec(target, mode, duration_s, severity), self.now)

    def clear(self, target: str | None = None) -> list[str]:
        return self.fw.clear_faults(target, self.now)

    def state(self) -> dict[str, Any]:
        """The firmware's true state (as the control socket's `status`)."""
        return self.fw.status.snapshot()

    # ------------------------------------------------------------------ time

    def run_for(self, dt: float) -> None:
        self.run_until(self.now + dt)

    def run_until_true(self, pred: Callable[[], bool], timeout_s: float,
                       poll_s: float = 0.001) -> bool:
        """Advance until `pred()` holds (checked every `poll_s`) or `timeout_s` passes."""
        end = self.now + timeout_s
        while not pred():
            if self.now >= end - 1e-9:
                return False
            self.run_until(min(end, self.now + poll_s))
        return True

    def run_until(self, t: float) -> None:
        """Run every event up to and including virtual time `t`."""
        end = round(t * 1e6)
        fw, to_fw, to_host = self.fw, self._to_fw, self._to_host
        tick_us, lat = fw.tick_us, self.latency_us
        while True:
            t_fw = fw.k * tick_us
            t_rx = to_fw[0][0] if to_fw else _NEVER
            t_next = min(t_fw, self._next_host_us, t_rx)
            if t_next > end:
                break
            self.t_us = t_next
            now = t_next * 1e-6
            if t_rx == t_next:
                while to_fw and to_fw[0][0] <= t_next:
                    fw.receive(heapq.heappop(to_fw)[2], now)
                out = fw.drain()
            elif t_fw == t_next:
                out = fw.step(now)
            else:
                self._host_tick(t_next, now)
                continue
            if out:
                to_host.append((t_next + lat, out))
        self.t_us = max(self.t_us, end)

    def _host_tick(self, t_us: int, now: float) -> None:
        frames: list[Frame] = []
        to_host = self._to_host
        while to_host and to_host[0][0] <= t_us:
            frames += self.host_decoder.feed(to_host.popleft()[1])
        self._next_host_us = t_us + self.host_period_us
        for item in self.host.tick(now, frames):
            data = item if isinstance(item, bytes | bytearray) else encode(item,
                                                                          self.host_seq.next())
            self._queue_fw(t_us + self.latency_us, bytes(data))

"""A scripted host session on the lock-step runner: HELLO, ENABLE, streamed commands, waiting.

For tests and scenario scripts that talk to the simulated firmware directly (no daemon): every
call advances virtual time, so nothing sleeps. Joint targets are in encoder coordinates (what the
host sees); `true_to_encoder` converts true angles (e.g. from `Kinematics.tool_down_ik`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from edge_agent.link.codec import (
    Command,
    Enable,
    GripperMode,
    Hello,
    HelloAck,
    Message,
    Mode,
    Status,
    Stop,
    StopCategory,
    StopReason,
)
from hil.lockstep import Lockstep, ScriptedHost


class Session:
    """Drives a Lockstep runner whose host is a ScriptedHost."""

    def __init__(self, runner: Lockstep, *, status_period_us: int = 1000, deadman_ms: int = 50,
                 period_s: float = 0.005) -> None:
        if not isinstance(runner.host, ScriptedHost):
            raise TypeError("Session needs the runner's default ScriptedHost")
        self.r = runner
        self.host: ScriptedHost = runner.host
        self.status_period_us = status_period_us
        self.deadman_ms = deadman_ms
        self.period_s = period_s

    def send(self, msg: Message | bytes) -> None:
        self.r.send(msg)

    def wait(self, pred: Callable[[], bool], timeout_s: float = 1.0) -> bool:
        return self.r.run_until_true(pred, timeout_s)

    def open(self, version: int = 1) -> HelloAck:
        n = len(self.host.of_type(HelloAck))
        self.send(Hello(version, self.deadman_ms, self.status_period_us))
        if not self.wait(lambda: len(self.host.of_type(HelloAck)) > n, 0.5):
            raise AssertionError("no HELLO_ACK")
        ack: HelloAck = self.host.of_type(HelloAck)[-1]
        return ack

    def enable(self) -> Status:
        self.send(Enable(True))
        self.r.run_for(0.01)
        return self.status()

    def status(self) -> Status:
        st = self.host.last(Status)
        if st is None:
            raise AssertionError("no STATUS received")
        s: Status = st
        return s

    def command(self, q: Sequence[float], gripper_mode: GripperMode = GripperMode.HOLD,
                setpoint: float = 0.0, current_limit: float = 0.0, ttl_ms: int = 0,
                mode: Mode = Mode.POSITION) -> None:
        self.send(Command(mode, tuple(q), gripper_mode, setpoint, current_limit, ttl_ms))

    def stream(self, q: Sequence[float] | Callable[[float], Sequence[float]], seconds: float,
               gripper_mode: GripperMode = GripperMode.HOLD, setpoint: float = 0.0,
               current_limit: float = 0.0, mode: Mode = Mode.POSITION) -> Status:
        """Send one command per period for `seconds` (q fixed, or a function of time)."""
        end = self.r.now + seconds
        while self.r.now < end - 1e-9:
            target = q(self.r.now) if callable(q) else q
            self.command(target, gripper_mode, setpoint, current_limit, mode=mode)
            self.r.run_for(self.period_s)
        return self.status()

    def hold(self, seconds: float) -> Status:
        """Stream COMMAND(HOLD) (keeps the deadman fed, moves nothing)."""
        return self.stream(self.status().q, seconds, mode=Mode.HOLD)

    def stop(self, category: StopCategory = StopCategory.CAT2,
             reason: StopReason = StopReason.PROTECTIVE) -> None:
        self.send(Stop(category, reason))

    def true_to_encoder(self, q_true: Sequence[float]) -> list[float]:
        return [q + b for q, b in zip(q_true, self.r.fw.bias, strict=True)]

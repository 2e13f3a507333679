"""The control thread's output: each tick's COMMAND frame to the guardian, at once or timed for
the next deadline (`control.output_at_deadline`).

Sent as the tick ends (the default), a frame reaches the robot as late as the tick woke late
and ran long: the daemon's wake-up jitter is the robot's period error. With
`output_at_deadline`, the frame is handed to the link guardian as `G_AT(next deadline, COMMAND)`
and the guardian — a small SCHED_FIFO process with no GIL shared with paho or the asyncio loop —
writes it at that deadline (docs/PROTOCOL.md §5.2). The robot receives the stream on the
loop's clock at one control period more latency, and a daemon tick may wake up to a period
late without the robot seeing it.

Nothing computed before a stop goes out after it: the guardian drops a waiting G_AT on any
latch, any STOP and any immediate COMMAND. When the latch changes the frame computed under the
new state goes out at once — superseding what waits — and again at the next deadline, where the
timed stream takes over.
"""

from __future__ import annotations

from collections.abc import Callable

from edge_agent.executor.latch import LatchState
from edge_agent.link.codec import Command, GAt, Message


class CommandOutput:
    """`emit` once per tick with the frame it computed."""

    def __init__(self, send: Callable[[Message], None], at_deadline: bool) -> None:
        self._send = send
        self.at_deadline = at_deadline
        self._under: LatchState | None = None  # the latch state the last frame was computed under
        self.sent_at_once = 0  # timed mode: frames sent at once because the latch changed

    def emit(self, cmd: Command, computed_under: LatchState, due: float) -> None:
        """`computed_under`: the latch state read before the executor computed `cmd`;
        `due`: the next deadline (the clock the guardian reads: time.monotonic)."""
        if not self.at_deadline:
            self._send(cmd)
            return
        if computed_under is not self._under:  # the first frame, or the latch changed
            self._under = computed_under
            self._send(cmd)
            self.sent_at_once += 1
        self._send(GAt(max(0, round(due * 1e6)), cmd))

"""The control thread's output: each tick's COMMAND frame to the guardian, now or at the next
deadline (`control.output_at_deadline`).

Sent as the tick ends (the default), a frame leaves as late as the tick ran long. Held to the
next deadline, the robot receives the stream on the loop's clock whatever a tick's duration,
at one control period more latency. A held frame is never sent across a latch change: it was
computed before the stop, so it is dropped and counted, and that tick's own frame (a hold,
computed under the new latch) goes out at once.
"""

from __future__ import annotations

from collections.abc import Callable

from edge_agent.executor.latch import LatchState
from edge_agent.link.codec import Command


class CommandOutput:
    """`begin_tick` at a tick's start, `end_tick` with the frame it computed."""

    def __init__(self, send: Callable[[Command], None], at_deadline: bool) -> None:
        self._send = send
        self.at_deadline = at_deadline
        self._held: tuple[Command, LatchState] | None = None
        self._sent_held = False
        self.discarded = 0  # held frames dropped because the latch changed

    def begin_tick(self, latch: LatchState) -> None:
        """`latch`: the latch state now. The held frame goes out if it is the one it was
        computed under."""
        held, self._held = self._held, None
        self._sent_held = False
        if held is None:
            return
        if held[1] is latch:
            self._send(held[0])
            self._sent_held = True
        else:
            self.discarded += 1

    def end_tick(self, cmd: Command, computed_under: LatchState) -> None:
        """`computed_under`: the latch state read before the executor computed `cmd`."""
        if not self.at_deadline:
            self._send(cmd)
            return
        if not self._sent_held:  # the first tick, or the latch changed: out now (and again at
            self._send(cmd)      # the next deadline, where the held stream takes over)
        self._held = (cmd, computed_under)

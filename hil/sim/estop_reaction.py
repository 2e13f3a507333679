"""The simulated robot's own e-stop reaction clock: press edge → first STOP frame received.

The firmware stamps a press edge at its tick (`pressed`), the runner stamps the moment that
tick's frames were handed to the wire (`wired`), and the first STOP received after it closes the
measurement (`stop_received`). Two figures per press, µs on the firmware clock:

- `tick_us`: from the press tick. It also carries the simulator's own lateness when a real-time
  runner is woken late (a firmware on a microcontroller is not);
- `wire_us`: from the wire, what the host side answers to. The lock-step runner has no wire, so
  both are equal there.

A press that is pressed again before a STOP arrived counts as `unanswered`. Read and cleared
through the control socket's `latency` command (hil/sim/control.py); bounded deques.
"""

from __future__ import annotations

from collections import deque
from typing import Any

MAX_KEPT = 200_000


class EstopReaction:
    def __init__(self) -> None:
        self.tick_us: deque[int] = deque(maxlen=MAX_KEPT)
        self.wire_us: deque[int] = deque(maxlen=MAX_KEPT)
        self.unanswered = 0
        self._press_us: int | None = None
        self._wire_at_us: int | None = None

    def pressed(self, t_us: int) -> None:
        if self._press_us is not None:
            self.unanswered += 1
        self._press_us = t_us
        self._wire_at_us = None

    def wired(self, fw_us: int) -> None:
        if self._press_us is not None and self._wire_at_us is None:
            self._wire_at_us = fw_us

    def stop_received(self, rx_us: int) -> None:
        press = self._press_us
        if press is None:
            return
        self.tick_us.append(rx_us - press)
        wired = self._wire_at_us
        self.wire_us.append(rx_us - (wired if wired is not None else press))
        self._press_us = self._wire_at_us = None

    def latency(self, clear: bool = False) -> dict[str, Any]:
        """The control socket's `latency` answer; `clear` empties the record after reading it."""
        out = {"estop_reaction_us": list(self.tick_us),
               "estop_wire_reaction_us": list(self.wire_us), "unanswered": self.unanswered}
        if clear:
            self.tick_us.clear()
            self.wire_us.clear()
            self.unanswered = 0
        return out

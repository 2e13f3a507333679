"""Signals without locks: SIGTERM/SIGINT → a controlled stop, SIGUSR1 → an e-stop.

The kernel's signal number goes down a pipe (`signal.set_wakeup_fd`, async-signal-safe) to a
thread of its own, which acts on it; the Python-level handler does nothing. A handler must never
take a lock the interrupted main thread may hold: `Event.set()` from a handler that interrupted
`Event.wait()` on the same event deadlocks (the simulated robot did exactly that), and so could
tripping the latch. Call `route_signals` from the main thread.
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Callable
from types import FrameType

from edge_agent.daemon.supervisor import Spawn


def _nothing(signum: int, frame: FrameType | None) -> None:
    return None  # the wakeup fd carries it to the thread below; nothing here may block


def route_signals(on_estop: Callable[[], None], spawn: Spawn) -> threading.Event:
    """Route the signals to a thread started with `spawn` (named `signals`, it lives as long
    as the process); the returned event is set by SIGTERM/SIGINT."""
    stop_requested = threading.Event()
    r, w = os.pipe()
    os.set_blocking(w, False)
    signal.set_wakeup_fd(w, warn_on_full_buffer=False)
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1):
        signal.signal(sig, _nothing)

    def run() -> None:
        while True:
            try:
                data = os.read(r, 64)
            except OSError:
                return
            if not data:
                return
            for signum in data:
                if signum == signal.SIGUSR1:
                    on_estop()
                elif signum in (signal.SIGTERM, signal.SIGINT):
                    stop_requested.set()

    spawn("signals", run)
    return stop_requested

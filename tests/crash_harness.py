"""Test helper: run a writer in a forked child and kill -9 it at a chosen instant (crash tests).

The child acknowledges each completed write on a pipe as one little-endian u64; the parent
collects what was acknowledged before the kill, so a test can check that what the store replays
after the crash covers it.
"""

from __future__ import annotations

import os
import select
import signal
import struct
import time
from collections.abc import Callable

ACK = struct.Struct("<Q")


def fork_and_kill(child: Callable[[int], None], delay_s: float,
                  after_first_ack: bool = False) -> list[int]:
    """Run `child(ack_fd)` in a forked process, SIGKILL it after `delay_s`; return its acks."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never return into the test runner
        try:
            os.close(r)
            child(w)
        finally:
            os._exit(3)
    os.close(w)
    raw = b""
    try:
        if after_first_ack:  # a kill in steady state, however slow the machine is today
            ready, _, _ = select.select([r], [], [], 60.0)
            assert ready, "the child acknowledged nothing within 60 s"
            raw = os.read(r, ACK.size)
        time.sleep(delay_s)  # not synchronisation: this is the random instant of the crash
    finally:
        os.kill(pid, signal.SIGKILL)
        _, status = os.waitpid(pid, 0)
    while chunk := os.read(r, 65536):
        raw += chunk
    os.close(r)
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL, (
        f"the child died on its own (status {status:#x}), not by our SIGKILL")
    return [a for (a,) in ACK.iter_unpack(raw[: len(raw) - len(raw) % ACK.size])]

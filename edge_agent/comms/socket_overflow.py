"""Control-socket connections past the slot limit: read the first line, serve an e-stop, else busy.

The socket serves at most `max_clients` connections at a time, each on its own thread. A
connection beyond that used to get `busy` at once — so a few silent connections could make a
local `estop` bounce. Now it joins this lane instead, run by the accept thread itself with
non-blocking reads (no thread per connection): its first line is read within `line_timeout_s`;
an e-stop (or a line that names one, fail safe) is served, anything else, or nothing in time,
gets `busy` and the connection is closed. The lane is bounded: when it is full the oldest
connection is decided on what it sent so far (usually nothing: `busy`) to make room, so a flood
of silent connections ages out while an e-stop, which writes at once, is read on arrival.
"""

from __future__ import annotations

import contextlib
import selectors
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from edge_agent.log import get_logger

_log = get_logger(__name__)
OVERFLOW = "overflow"  # the selector key's data for a connection of this lane


@dataclass
class _Pending:
    deadline: float
    buf: bytearray = field(default_factory=bytearray)


class OverflowLane:
    """Connections waiting for their first line; driven by the owner's selector loop."""

    def __init__(self, sel: selectors.BaseSelector, answer: Callable[[bytes], bytes | None], *,
                 busy: bytes, max_pending: int = 32, line_timeout_s: float = 1.0,
                 max_line: int = 65536, clock: Callable[[], float] = time.monotonic) -> None:
        if max_pending < 1:
            raise ValueError(f"max_pending must be >= 1, got {max_pending}")
        self._sel = sel
        self._answer = answer  # a first line → the reply to send, or None for busy
        self._busy = busy
        self._max_pending = max_pending
        self._line_timeout_s = line_timeout_s
        self._max_line = max_line
        self._clock = clock
        self._pending: dict[socket.socket, _Pending] = {}  # insertion order: oldest first
        self.counters = {"served": 0, "busy": 0, "evicted": 0}

    def __len__(self) -> int:
        return len(self._pending)

    def add(self, conn: socket.socket) -> None:
        """Take an over-limit connection; its line is often there already, so try it now."""
        if len(self._pending) >= self._max_pending:
            oldest = next(iter(self._pending))
            self.counters["evicted"] += 1
            self._finish(oldest)
        conn.setblocking(False)
        self._pending[conn] = _Pending(self._clock() + self._line_timeout_s)
        self._sel.register(conn, selectors.EVENT_READ, OVERFLOW)
        self.readable(conn)

    def readable(self, conn: socket.socket) -> None:
        """The selector says `conn` has data (or EOF): decide once a line is complete."""
        p = self._pending.get(conn)
        if p is None:
            return
        try:
            chunk = conn.recv(self._max_line + 1 - len(p.buf))
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            chunk = b""
        p.buf += chunk
        if not chunk or b"\n" in p.buf or len(p.buf) > self._max_line:
            self._finish(conn)

    def timeout(self) -> float | None:
        """Seconds until the next first-line deadline (None: nothing pending)."""
        if not self._pending:
            return None
        first = min(p.deadline for p in self._pending.values())
        return max(0.0, first - self._clock())

    def expire(self) -> None:
        """Decide every connection whose first line did not complete in time."""
        now = self._clock()
        for conn in [c for c, p in self._pending.items() if p.deadline <= now]:
            self._finish(conn)

    def close_all(self) -> None:
        for conn in list(self._pending):
            self._pending.pop(conn)
            with contextlib.suppress(KeyError, ValueError, OSError):
                self._sel.unregister(conn)
            conn.close()

    def _finish(self, conn: socket.socket) -> None:
        p = self._pending.pop(conn)
        with contextlib.suppress(KeyError, ValueError, OSError):
            self._sel.unregister(conn)
        line = bytes(p.buf[:p.buf.find(b"\n") + 1] if b"\n" in p.buf else p.buf)
        reply = None
        if line.strip():
            try:
                reply = self._answer(line)
            except Exception:
                _log.exception("control_socket_overflow_answer_failed")
        if reply is None:
            reply = self._busy
            self.counters["busy"] += 1
            if self.counters["busy"] in (1, 10, 100) or self.counters["busy"] % 1000 == 0:
                _log.warning("control_socket_busy", refused=self.counters["busy"],
                             evicted=self.counters["evicted"])
        else:
            self.counters["served"] += 1
        try:
            conn.settimeout(0.5)  # a tiny reply; a peer that does not read is not waited for
            conn.sendall(reply)
        except OSError:
            pass
        finally:
            conn.close()

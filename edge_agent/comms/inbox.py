"""A bounded command inbox drained by one worker thread: paho's callbacks put, never wait.

The worker is a plain thread rather than an asyncio task: command handling then does not depend
on the daemon's event loop being alive (or started yet), the bridge can be tested on its own, and
`CommandAPI` is thread-safe anyway. Priority items (e-stops) go to the front and are never dropped;
anything else that finds the inbox full — `maxsize` items, or `max_bytes` of payloads queued (a
packet may be 256 KiB: 256 of them would hold 64 MiB) — is refused, counted and logged.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from edge_agent.commands.freshness import Epoch
from edge_agent.log import get_logger

_log = get_logger(__name__)
MAX_QUEUED_BYTES = 16 << 20  # commands are ~1 KB: only oversized ones (refused anyway) add up


@dataclass(frozen=True)
class InboundCommand:
    """One command message as it arrived, waiting for the worker."""

    name: str
    payload: bytes
    source: str  # "mqtt" or "fleet"
    deadline: float | None  # monotonic (the bridge's clock): arrival + MQTT 5 message expiry
    response_topic: str | None = None
    correlation: bytes | None = None
    priority: bool = False
    arrived: Epoch | None = None  # the stop epoch on arrival: a stop since makes motion stale
    legacy: bool = False  # came on a deprecated dotted topic: answered on its reply alias


class CommandInbox:
    """Bounded FIFO with a priority lane, and the worker thread that drains it."""

    def __init__(self, process: Callable[[InboundCommand], None], *, maxsize: int,
                 max_bytes: int = MAX_QUEUED_BYTES, name: str = "mqtt-commands") -> None:
        if maxsize < 1:
            raise ValueError(f"inbox size must be >= 1, got {maxsize}")
        self._process = process
        self._maxsize = maxsize
        self._max_bytes = max_bytes
        self._bytes = 0  # payload bytes queued
        self._name = name
        self._items: deque[InboundCommand] = deque()
        self._cond = threading.Condition()
        self._stopping = False
        self._busy = False
        self._thread: threading.Thread | None = None
        self.overflow = 0
        self.processed = 0

    def start(self) -> None:
        with self._cond:
            if self._thread is not None or self._stopping:
                return
            self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
            self._thread.start()

    def offer(self, item: InboundCommand) -> bool:
        """Queue an item without blocking; False (counted, logged) when full."""
        with self._cond:
            if self._stopping:
                return False
            full = not item.priority and (len(self._items) >= self._maxsize or
                                          self._bytes + len(item.payload) > self._max_bytes)
            if full:
                self.overflow += 1
                count = self.overflow
            else:
                if item.priority:
                    self._items.appendleft(item)
                else:
                    self._items.append(item)
                self._bytes += len(item.payload)
                self._cond.notify()
                return True
        if count == 1 or count % 100 == 0:
            _log.warning("inbox_overflow", inbox=self._name, command=item.name, dropped=count)
        return False

    def depth(self) -> int:
        with self._cond:
            return len(self._items)

    def idle(self) -> bool:
        """True when nothing is queued and the worker is not processing."""
        with self._cond:
            return not self._items and not self._busy

    def stop(self, timeout: float = 5.0) -> None:
        """Stop the worker after the item in hand; queued items are dropped (and logged)."""
        with self._cond:
            self._stopping = True
            dropped = len(self._items)
            self._items.clear()
            self._bytes = 0
            self._cond.notify_all()
            thread = self._thread
        if dropped:
            _log.warning("inbox_dropped_at_stop", inbox=self._name, dropped=dropped)
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._items and not self._stopping:
                    self._cond.wait()
                if self._stopping:
                    return
                item = self._items.popleft()
                self._bytes -= len(item.payload)
                self._busy = True
            try:
                self._process(item)
            except Exception:
                _log.exception("inbox_process_failed", inbox=self._name, command=item.name)
            finally:
                with self._cond:
                    self._busy = False
                    self.processed += 1

"""The tap: a cheap, non-blocking fan-out of (channel, time, payload) from any thread.

`publish` is what the control thread, the link reader, the inference worker and the main
thread call at their seams. Its cost is one `time.time_ns()`, a tuple and one `deque.append`
per subscriber — never I/O, never a lock. With no subscriber (observe off, or before READY)
it returns after one attribute load. Each consumer (the flight recorder, the live view)
`subscribe`s and gets its own bounded deque, which it drains on its own thread: when a
consumer falls behind, its oldest items go (drop-oldest) and are counted in `dropped` (two
publishers racing on a full queue may undercount by one: the count is not locked).

The payload is whatever the seam has at hand (a link frame, a sensor snapshot, an event dict):
turning it into JSON is the consumer's work (`channels.encode`), off the publisher's thread.
Payloads must not be mutated after publishing (frames and snapshots are immutable; event dicts
are published once and then only read).
"""

from __future__ import annotations

import threading
import time
from collections import deque
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from edge_agent.contract.status_observe import TapQueue

# (topic, log time in ns since the Unix epoch, payload)
Item = tuple[str, int, Any]


class Subscription:
    """One consumer's queue: bounded, drop-oldest, drained by the consumer's own thread."""

    __slots__ = ("dropped", "maxlen", "name", "queue", "received", "topics")

    def __init__(self, name: str, maxlen: int, topics: frozenset[str] | None) -> None:
        if maxlen < 1:
            raise ValueError(f"tap subscription {name!r}: maxlen must be >= 1, not {maxlen}")
        self.name = name
        self.maxlen = maxlen
        self.queue: deque[Item] = deque(maxlen=maxlen)
        self.dropped = 0  # items lost to drop-oldest (this consumer was behind)
        self.received = 0  # items drained
        self.topics = topics  # None: every topic

    def drain(self, limit: int = 8192) -> list[Item]:
        """Up to `limit` items, oldest first (the consumer's thread only)."""
        q = self.queue
        out: list[Item] = []
        pop = q.popleft
        try:
            for _ in range(min(limit, len(q))):
                out.append(pop())
        except IndexError:  # pragma: no cover - only this thread pops
            pass
        self.received += len(out)
        return out

    def stats(self) -> TapQueue:
        return {"queued": len(self.queue), "dropped": self.dropped, "received": self.received,
                "maxlen": self.maxlen}


class Tap:
    """The fan-out. `publish` from any thread; `subscribe`/`unsubscribe` rarely (a lock)."""

    def __init__(self) -> None:
        self._subs: tuple[Subscription, ...] = ()
        self._lock = threading.Lock()  # subscribe/unsubscribe only, never publish

    @property
    def active(self) -> bool:
        """Someone listens: a seam whose payload costs something to build may check first."""
        return bool(self._subs)

    def publish(self, topic: str, payload: Any, t_ns: int | None = None) -> None:
        """Hand `payload` to every subscriber of `topic`; `t_ns`: its time (ns since the Unix
        epoch), now if None. Never blocks, never raises for a full queue."""
        subs = self._subs
        if not subs:
            return
        item = (topic, time.time_ns() if t_ns is None else t_ns, payload)
        for s in subs:
            if s.topics is not None and topic not in s.topics:
                continue
            q = s.queue
            if len(q) >= s.maxlen:
                s.dropped += 1
            q.append(item)

    def subscribe(self, name: str, maxlen: int = 65_536,
                  topics: frozenset[str] | None = None) -> Subscription:
        sub = Subscription(name, maxlen, topics)
        with self._lock:
            self._subs = (*self._subs, sub)
        return sub

    def unsubscribe(self, sub: Subscription) -> None:
        with self._lock:
            self._subs = tuple(s for s in self._subs if s is not sub)

    def stats(self) -> dict[str, TapQueue]:
        return {s.name: s.stats() for s in self._subs}


# The process's tap: seams deep in the daemon (log setup, link reader) publish here without
# being handed one. Tests that need isolation build their own Tap.
TAP = Tap()


def publish(topic: str, payload: Any, t_ns: int | None = None) -> None:
    """`TAP.publish`: the one call a seam makes."""
    TAP.publish(topic, payload, t_ns)

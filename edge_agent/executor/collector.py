"""Keeps the cyclic garbage collector off the control thread: no collection starts inside a tick.

A collection runs in whichever thread's allocation crosses the generation-0 threshold, and it
scans every young object of the process, not that thread's: in the lock-step episodes the
control tick paid 0.1-4 ms for generation 0/1 and 20-130 ms for a full collection, although the
executor itself allocates ~1 tracked object per tick. Inside `DeferredCollection` automatic
collection is off; the one that was due runs at the next allocation after the tick, in the
thread that makes it (in the daemon usually another thread, while the control thread sleeps).
Nothing is skipped, only moved: the generation counts keep growing while it is off.
"""

from __future__ import annotations

import gc
import time
from types import TracebackType


class DeferredCollection:
    """`with deferred:` around a tick; reusable (one per thread), allocation-free, not nested.

    Leaves the collector as it found it: when something else disabled it, it stays disabled.
    """

    __slots__ = ("_was_enabled",)

    def __init__(self) -> None:
        self._was_enabled = False

    def __enter__(self) -> None:
        self._was_enabled = gc.isenabled()
        if self._was_enabled:
            gc.disable()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if self._was_enabled:
            gc.enable()


class CollectionStats:
    """How long the process's garbage collections held the GIL, per generation (`gc.callbacks`).

    A collection in any thread stops the control thread for as long as it runs: this is how
    much of the loop's lateness it explains. `install()` once; `as_dict()` for `status`.
    """

    def __init__(self) -> None:
        self.count = [0, 0, 0]
        self.max_s = [0.0, 0.0, 0.0]
        self.over_1ms = [0, 0, 0]
        self._started = 0.0

    def install(self) -> CollectionStats:
        gc.callbacks.append(self._callback)
        return self

    def uninstall(self) -> None:
        if self._callback in gc.callbacks:
            gc.callbacks.remove(self._callback)

    def _callback(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
            return
        gen = info.get("generation", 2)
        took = time.perf_counter() - self._started
        self.count[gen] += 1
        if took > self.max_s[gen]:
            self.max_s[gen] = took
        if took > 0.001:
            self.over_1ms[gen] += 1

    def as_dict(self) -> dict[str, object]:
        return {"collections": list(self.count),
                "max_ms": [round(x * 1e3, 3) for x in self.max_s],
                "over_1ms": list(self.over_1ms)}

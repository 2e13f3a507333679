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

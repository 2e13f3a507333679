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
import threading
import time
from types import TracebackType
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from edge_agent.contract.status import GcFigures, GcWindow


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


class _Window:
    """Collections per generation: how many, the longest, how many over 1 ms and 5 ms — by the
    wall clock (how long the GIL was held) and by the collecting thread's own CPU time (how long
    it scanned): a collection long on the wall clock but short on CPU spent its time preempted,
    holding the GIL (`preempted_5ms`: over 5 ms wall, under half of that on CPU)."""

    __slots__ = ("count", "cpu_over_5ms", "max_cpu_collected", "max_cpu_s", "max_s",
                 "max_thread", "over_1ms", "over_5ms", "preempted_5ms")

    def __init__(self) -> None:
        self.count = [0, 0, 0]
        self.max_s = [0.0, 0.0, 0.0]
        self.over_1ms = [0, 0, 0]
        self.over_5ms = [0, 0, 0]
        self.max_cpu_s = [0.0, 0.0, 0.0]
        self.cpu_over_5ms = [0, 0, 0]
        self.preempted_5ms = [0, 0, 0]
        self.max_thread = [0, 0, 0]  # the ident of the thread that ran the longest one
        self.max_cpu_collected = [0, 0, 0]  # objects the most CPU-costly one freed

    def record(self, gen: int, took: float, cpu: float, collected: int = 0) -> None:
        self.count[gen] += 1
        if took > self.max_s[gen]:
            self.max_s[gen] = took
            self.max_thread[gen] = threading.get_ident()
        if cpu > self.max_cpu_s[gen]:
            self.max_cpu_s[gen] = cpu
            self.max_cpu_collected[gen] = collected
        if took > 0.001:
            self.over_1ms[gen] += 1
            if took > 0.005:
                self.over_5ms[gen] += 1
                if cpu > 0.005:
                    self.cpu_over_5ms[gen] += 1
                elif cpu < 0.5 * took:
                    self.preempted_5ms[gen] += 1

    def as_dict(self) -> GcWindow:
        return {"collections": list(self.count),
                "max_ms": [round(x * 1e3, 3) for x in self.max_s],
                "over_1ms": list(self.over_1ms), "over_5ms": list(self.over_5ms),
                "max_cpu_ms": [round(x * 1e3, 3) for x in self.max_cpu_s],
                "max_cpu_collected": list(self.max_cpu_collected),
                "cpu_over_5ms": list(self.cpu_over_5ms),
                "preempted_5ms": list(self.preempted_5ms),
                "max_thread": [_thread_name(i) for i in self.max_thread]}


def _thread_name(ident: int) -> str | None:
    if not ident:
        return None
    for t in threading.enumerate():
        if t.ident == ident:
            return t.name
    return f"ended thread {ident}"


class _Ours:
    __slots__ = ("_stats",)

    def __init__(self, stats: CollectionStats) -> None:
        self._stats = stats

    def __enter__(self) -> None:
        self._stats.explicit = True

    def __exit__(self, *exc: object) -> None:
        self._stats.explicit = False


class CollectionStats:
    """How long the process's garbage collections held the GIL, per generation (`gc.callbacks`).

    A collection in any thread stops the control thread for as long as it runs: this is how
    much of the loop's lateness it explains. `install()` once; `as_dict()` for `status`: the
    whole run, and the `after_startup` window (from `start_window()`: automatic collections
    only) beside the `idle` ones the daemon ran itself at safe points (daemon/heap.py).
    """

    def __init__(self) -> None:
        self.total = _Window()
        self.after_startup: _Window | None = None
        self.idle = _Window()
        self.explicit = False  # the collection running now was asked for at a safe point
        self._started = 0.0
        self._started_cpu = 0.0
        # objects in the permanent generation, noted by whoever froze them: counting them
        # (gc.get_freeze_count) walks the whole list with the GIL held — ms at 5e4 objects,
        # too long for every `status`
        self.frozen = 0

    @property
    def count(self) -> list[int]:
        return self.total.count

    @property
    def max_s(self) -> list[float]:
        return self.total.max_s

    def install(self) -> CollectionStats:
        gc.callbacks.append(self._callback)
        return self

    def uninstall(self) -> None:
        if self._callback in gc.callbacks:
            gc.callbacks.remove(self._callback)

    def start_window(self) -> None:
        self.after_startup = _Window()

    def ours(self) -> _Ours:
        """`with stats.ours(): gc.collect()` — counted as an idle collection."""
        return _Ours(self)

    def _callback(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
            self._started_cpu = time.thread_time()
            return
        gen = info.get("generation", 2)
        took = time.perf_counter() - self._started
        cpu = time.thread_time() - self._started_cpu  # the callback runs in the collecting thread
        freed = info.get("collected", 0)
        self.total.record(gen, took, cpu, freed)
        if self.explicit:
            self.idle.record(gen, took, cpu, freed)
        elif self.after_startup is not None:
            self.after_startup.record(gen, took, cpu, freed)

    def as_dict(self) -> GcFigures:
        return {**self.total.as_dict(),
                "after_startup": (None if self.after_startup is None
                                  else self.after_startup.as_dict()),
                "idle": self.idle.as_dict(), "frozen": self.frozen}

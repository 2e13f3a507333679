"""Garbage collection at safe points: no full collection while the robot moves.

A full (generation-2) collection scans every tracked object that is not frozen and holds the GIL
throughout: `status.loop.gc` showed 27-38 ms during tasks although start-up froze its heap
(`gc.freeze()`) — what start-up work, calibration and tasks left behind since is scanned again on
every automatic full collection, and a pause past `link.deadman_ms` while moving is a latched
deadman stop (docs/PROTOCOL.md §4). So, from READY on:

- automatic full collections are off (generation 2's threshold out of reach); generations 0 and
  1 (young objects only: well under a millisecond) run as before, outside the control tick
  (executor/collector.py);
- the full collection runs here, from the main thread's housekeeping, at a safe point: the
  executor idle or holding (no task moving, no jog) for `idle_s`, and something to collect (a
  generation-1 collection since the last one). Its survivors are NOT frozen: a frozen object is
  never collected again, and one that is alive now and later dropped as part of a reference
  cycle (a finished task's, a report's) would leak for good (it did: `python -m hil.soak
  --minutes 60` grew 185 MB/h while each idle collection froze its survivors). It scans what
  lives since the start-up work, bounded by what the daemon keeps (rings, caches, the task);
- once the start-up work after READY is done (estimators, model, calibration), what it loaded
  joins the frozen heap at once (`startup_done`); collections from then on are the
  `after_startup` window of `status.loop.gc` (tasks' pauses), ours are `idle` there. None of
  ours runs before: it would scan the start-up heap (77 ms seen on a loaded 2-CPU VM).

A daemon that never idles never runs a full collection: cyclic garbage waits for the next idle
moment (reference counting frees everything else at once).

The keeper also caps glibc's malloc arenas (`M_ARENA_MAX`) before the daemon's threads start:
glibc gives threads arenas of their own (up to 8 per CPU), each keeping its free memory; two
arenas for the whole process held 2-3 MB less of a loaded `--sim` daemon's RSS on a 2-CPU VM
(python -m hil.footprint, docs/INSTALL.md "Footprint"). `MALLOC_ARENA_MAX` (or
`GLIBC_TUNABLES=glibc.malloc.arena_max=N`) in the environment wins; without glibc it is a no-op.
"""

from __future__ import annotations

import gc
import os
import time

from edge_agent.daemon.procstart import resume_gc
from edge_agent.executor.collector import CollectionStats
from edge_agent.log import get_logger

_log = get_logger(__name__)

_OUT_OF_REACH = 1 << 30  # generation-1 collections before an automatic full one: never
MOVING_MODES = frozenset({"running", "manual"})
MALLOC_ARENAS = 2  # glibc malloc arenas for the whole process (see the module doc)
_M_ARENA_MAX = -8  # mallopt's parameter number (glibc malloc.h)


def cap_malloc_arenas(n: int = MALLOC_ARENAS) -> bool:
    """glibc's `mallopt(M_ARENA_MAX, n)` unless the environment chose; whether it was set.
    Threads started before it keep the arena they have: call it before starting any."""
    if "MALLOC_ARENA_MAX" in os.environ or "arena_max" in os.environ.get("GLIBC_TUNABLES", ""):
        return False
    try:
        import ctypes  # numpy imports it after READY anyway

        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):  # no libc symbols to reach, or not glibc
        return False
    return bool(mallopt(_M_ARENA_MAX, n))


class HeapKeeper:
    """`ready()` at READY, `startup_done()` after the start-up work, `tick()` from housekeeping."""

    def __init__(self, stats: CollectionStats, *, idle_s: float = 0.5,
                 min_interval_s: float = 5.0, malloc_arenas: int | None = MALLOC_ARENAS
                 ) -> None:
        self.stats = stats
        # built with the daemon, before any of its threads starts
        self.arenas_capped = malloc_arenas is not None and cap_malloc_arenas(malloc_arenas)
        self.idle_s = idle_s
        self.min_interval_s = min_interval_s
        self._idle_since: float | None = None
        self._last_at = -float("inf")
        self._saved_threshold: tuple[int, int, int] | None = None
        self.idle_collections = 0
        self._armed = False  # from startup_done(): before it, the start-up heap is unfrozen

    def ready(self) -> None:
        """Start-up garbage out of the collector's way; automatic full collections off."""
        gc.collect()
        self._freeze()
        t0, t1, t2 = gc.get_threshold()
        if self._saved_threshold is None:
            self._saved_threshold = (t0, t1, t2)
        gc.set_threshold(t0, t1, _OUT_OF_REACH)
        resume_gc()  # `edge-agent run` paused it from its start (daemon/procstart.py)

    def startup_done(self) -> None:
        """What the start-up work loaded (onnxruntime, numpy, calibration: ~10^5 objects) is
        never scanned again; the stats' `after_startup` window opens."""
        self._freeze()
        self.stats.start_window()
        self._armed = True

    def tick(self, now: float, mode: str) -> bool:
        """A full collection now if this is a safe point; True if it ran."""
        if not self._armed or mode in MOVING_MODES:
            self._idle_since = None
            return False
        if self._idle_since is None:
            self._idle_since = now
        if (now - self._idle_since < self.idle_s or now - self._last_at < self.min_interval_s
                or gc.get_count()[2] == 0):
            return False
        self._last_at = now
        t0 = time.perf_counter()
        with self.stats.ours():
            gc.collect()
        # no freeze here: a frozen object is never collected again, so one alive now that is
        # part of a cycle once dropped (a finished task's, a report's) would leak for good;
        # the 60-minute soak grew 185 MB/h while every idle collection froze its survivors
        self.idle_collections += 1
        _log.debug("idle_collection", ms=round((time.perf_counter() - t0) * 1e3, 3),
                   frozen=self.stats.frozen)
        return True

    def _freeze(self) -> None:
        gc.freeze()
        self.stats.frozen = gc.get_freeze_count()  # here, at a safe point: it walks the list

    def stop(self) -> None:
        """Give the interpreter its thresholds back (tests run many daemons in one process)."""
        if self._saved_threshold is not None:
            gc.set_threshold(*self._saved_threshold)
            self._saved_threshold = None

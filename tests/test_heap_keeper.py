"""daemon/heap.py: full collections only at safe points, counted apart in `status.loop.gc`."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from edge_agent.daemon.heap import HeapKeeper
from edge_agent.executor.collector import CollectionStats


class Cycle:
    def __init__(self) -> None:
        self.me = self


@pytest.fixture
def keeper() -> Iterator[HeapKeeper]:
    stats = CollectionStats().install()
    k = HeapKeeper(stats, idle_s=0.5, min_interval_s=5.0)
    try:
        yield k
    finally:
        k.stop()
        stats.uninstall()
        gc.unfreeze()
        gc.collect()


def test_no_automatic_full_collection_after_ready_while_young_ones_go_on(
        keeper: HeapKeeper) -> None:
    before = gc.get_threshold()
    keeper.ready()
    keeper.startup_done()
    assert gc.get_threshold()[:2] == before[:2] and gc.get_threshold()[2] > 10**6
    for _ in range(300_000):  # allocation enough for many young collections
        Cycle()
    win = keeper.stats.after_startup
    assert win is not None
    assert win.count[0] > 0 and win.count[2] == 0, win.as_dict()
    keeper.stop()
    assert gc.get_threshold() == before


def test_the_full_collection_runs_only_at_an_idle_safe_point(keeper: HeapKeeper) -> None:
    keeper.ready()
    for _ in range(50_000):
        Cycle()
    gc.collect(1)
    assert not keeper.tick(50.0, "idle") and not keeper.tick(51.0, "idle"), (
        "a full collection before the start-up work is done (its heap is not frozen yet)")
    keeper.startup_done()
    for _ in range(50_000):
        Cycle()
    gc.collect(1)  # the generation-1 collection that marks something to collect
    assert not keeper.tick(100.0, "running")
    assert not keeper.tick(100.4, "idle")  # idle, but not for long enough
    assert not keeper.tick(100.6, "manual")  # moving again: the idle time starts over
    assert not keeper.tick(101.0, "holding")
    assert keeper.tick(101.6, "holding")
    assert keeper.stats.idle.count[2] == 1
    assert keeper.stats.after_startup is not None and keeper.stats.after_startup.count[2] == 0
    assert not keeper.tick(102.0, "idle"), "at most one every min_interval_s"
    d = keeper.stats.as_dict()
    assert d["idle"]["collections"][2] == 1 and d["frozen"] > 0  # type: ignore[index]


def test_a_cycle_alive_at_an_idle_collection_is_freed_by_a_later_one(
        keeper: HeapKeeper) -> None:
    """Survivors of an idle collection are not frozen: one dropped later inside a reference
    cycle (a finished task's objects) is freed by the next idle collection, not kept for good."""
    import weakref

    keeper.ready()
    keeper.startup_done()
    alive = Cycle()
    ref = weakref.ref(alive)
    for _ in range(50_000):
        Cycle()
    gc.collect(1)
    assert keeper.tick(10.0, "idle") is False and keeper.tick(11.0, "idle")
    assert ref() is alive  # it survived, still referenced
    del alive  # now only its own cycle holds it
    for _ in range(50_000):
        Cycle()
    gc.collect(1)
    assert keeper.tick(21.0, "idle")  # idle since 10.0, the last one 10 s ago
    assert ref() is None, "a cycle dropped after an idle collection was never freed"


def test_start_up_pauses_the_collector_until_ready(keeper: HeapKeeper) -> None:
    from edge_agent.daemon.procstart import pause_gc, resume_gc

    pause_gc()  # what `edge-agent run` does first
    try:
        assert not gc.isenabled()
        keeper.ready()  # READY: one collection, then automatic collection is back
        assert gc.isenabled()
    finally:
        resume_gc()
        gc.enable()


def test_a_collector_someone_else_disabled_stays_disabled(keeper: HeapKeeper) -> None:
    from edge_agent.daemon.procstart import pause_gc, resume_gc

    gc.disable()
    try:
        pause_gc()
        keeper.ready()
        resume_gc()
        assert not gc.isenabled()
    finally:
        gc.enable()


_ARENAS_PROBE = r"""
import json, os, re, sys, threading
from edge_agent.daemon.heap import cap_malloc_arenas
capped = cap_malloc_arenas(2) if sys.argv[1] == "cap" else None
go = threading.Barrier(8)
def work():
    keep = [bytearray(4096) for _ in range(200)]  # malloc (not pymalloc) on this thread
    go.wait()
threads = [threading.Thread(target=work) for _ in range(8)]
for t in threads: t.start()
for t in threads: t.join()
maps = [l.split() for l in open("/proc/self/maps")]
spans = [(int(a, 16), int(b, 16), m[1]) for m in maps for a, b in [m[0].split("-")]]
arenas = sum(1 for (s, e, p), (s2, e2, p2) in zip(spans, spans[1:])
             if s % (64 << 20) == 0 and e == s2 and p2 == "---p" and e2 - s == 64 << 20)
print(json.dumps([capped, arenas]))
"""


@pytest.mark.parametrize("how", ["cap", "env"])
def test_the_malloc_arenas_are_capped_unless_the_environment_chose(how: str) -> None:
    """Eight threads that malloc at once share the main arena and one more once capped; with
    MALLOC_ARENA_MAX in the environment the cap leaves glibc's setting alone."""
    import json
    import os
    import subprocess
    import sys

    env = {**os.environ, **({"MALLOC_ARENA_MAX": "1"} if how == "env" else {})}
    env.pop("GLIBC_TUNABLES", None)
    out = subprocess.run([sys.executable, "-c", _ARENAS_PROBE, "cap"], env=env,
                         capture_output=True, text=True, timeout=60, check=True)
    capped, arenas = json.loads(out.stdout.strip().splitlines()[-1])
    if how == "cap":
        assert capped is True and arenas <= 1  # the main arena is [heap], not counted here
    else:
        assert capped is False and arenas == 0

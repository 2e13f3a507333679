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

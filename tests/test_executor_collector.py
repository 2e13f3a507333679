"""No garbage collection starts inside a control tick; the collector is left as it was found."""

from __future__ import annotations

import gc
import threading

from edge_agent.executor.collector import DeferredCollection
from edge_agent.executor.loop import RateLoop


def test_collection_is_off_inside_and_back_on_after() -> None:
    deferred = DeferredCollection()
    assert gc.isenabled()
    for _ in range(2):  # reusable
        with deferred:
            assert not gc.isenabled()
        assert gc.isenabled()


def test_a_disabled_collector_stays_disabled() -> None:
    gc.disable()
    try:
        with DeferredCollection():
            assert not gc.isenabled()
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_collector_back_on_after_a_tick_that_raises() -> None:
    deferred = DeferredCollection()
    try:
        with deferred:
            raise ValueError("tick failed")
    except ValueError:
        pass
    assert gc.isenabled()


def test_rate_loop_ticks_with_collection_deferred() -> None:
    seen: list[bool] = []
    done = threading.Event()

    def tick(now: float, index: int) -> None:
        seen.append(gc.isenabled())
        if len(seen) >= 5:
            done.set()

    loop = RateLoop(tick, 500.0)
    loop.start()
    try:
        assert done.wait(5.0)
    finally:
        loop.stop()
    assert seen[:5] == [False] * 5
    assert gc.isenabled()

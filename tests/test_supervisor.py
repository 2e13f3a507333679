"""The thread supervisor: declared stop order, health records, errors kept, bounded joins."""

from __future__ import annotations

import threading

import pytest

from edge_agent.daemon.supervisor import Supervisor


def test_members_stop_in_the_declared_order_not_the_start_order() -> None:
    sup = Supervisor(("loop", "comms", "store"))
    stopped: list[str] = []
    sup.adopt("store", lambda: stopped.append("store"))
    sup.adopt("comms", lambda: stopped.append("comms"))
    sup.adopt("loop", lambda: stopped.append("loop"))
    took = sup.stop()
    assert stopped == ["loop", "comms", "store"]
    assert list(took) == ["loop", "comms", "store"]
    assert sup.stop() == {}  # idempotent
    assert stopped == ["loop", "comms", "store"]


def test_an_undeclared_or_duplicate_member_is_refused() -> None:
    sup = Supervisor(("loop",))
    with pytest.raises(ValueError, match="stop order"):
        sup.adopt("mystery", lambda: None)
    sup.adopt("loop", lambda: None)
    with pytest.raises(ValueError, match="already"):
        sup.adopt("loop", lambda: None)


def test_a_part_that_fails_to_stop_does_not_keep_the_rest_up_and_says_why() -> None:
    sup = Supervisor(("bad", "good"))
    stopped: list[str] = []

    def bad() -> None:
        raise OSError("socket gone")

    sup.adopt("bad", bad)
    sup.adopt("good", lambda: stopped.append("good"))
    sup.stop()
    assert stopped == ["good"]
    health = {h.name: h for h in sup.health()}
    assert health["bad"].last_error == "OSError: socket gone"
    assert health["good"].last_error is None and health["good"].stopped_at is not None


def test_a_thread_s_exception_is_kept_for_health_and_its_liveness_is_real() -> None:
    sup = Supervisor(("work", "crash"))
    release = threading.Event()
    sup.spawn("work", lambda: release.wait(10.0))

    def crash() -> None:
        raise RuntimeError("estimators failed")

    sup.spawn("crash", crash)
    for t in threading.enumerate():  # (already gone, or about to be)
        if t.name == "crash":
            t.join(5.0)
    health = {h.name: h for h in sup.health()}
    assert health["work"].alive is True and health["work"].kind == "thread"
    assert health["crash"].alive is False
    assert health["crash"].last_error == "RuntimeError: estimators failed"
    release.set()
    sup.stop(join_s=5.0)
    assert sup.lingering() == []
    assert [h.alive for h in sup.health()] == [False, False]


def test_stop_sets_stopping_first_and_bounds_the_join_of_a_stuck_thread() -> None:
    sup = Supervisor(("stuck", "router"))
    never = threading.Event()
    seen_stopping = threading.Event()

    def stuck() -> None:
        never.wait(30.0)  # as a native import would: it does not look at `stopping`

    sup.spawn("stuck", stuck)
    sup.spawn("router", lambda: seen_stopping.set() if sup.stopping.wait(30.0) else None,
              join=False)
    took = sup.stop(join_s=0.2)
    assert sup.stopping.is_set()
    assert took["stuck"] < 2000  # bounded, not the thread's 30 s
    assert sup.lingering() == ["stuck"]  # `run` leaves without finalizing under it
    assert seen_stopping.wait(5.0)
    never.set()


def test_a_part_reports_liveness_when_it_can_and_none_when_it_cannot() -> None:
    sup = Supervisor(("loop", "outbox"))
    alive = [True]
    sup.adopt("loop", lambda: alive.__setitem__(0, False), alive=lambda: alive[0])
    sup.adopt("outbox", lambda: None)
    assert [(h.name, h.kind, h.alive) for h in sup.health()] == [
        ("loop", "part", True), ("outbox", "part", None)]
    sup.stop()
    assert [h.alive for h in sup.health()] == [False, False]
    assert set(sup.health()[0].as_dict()) == {"name", "kind", "alive", "started_at",
                                              "stopped_at", "last_error"}

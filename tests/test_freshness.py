"""Stale commands (commands/freshness.py) through the real CommandAPI, on a fake wall clock."""

from __future__ import annotations

from typing import Any

import pytest

from edge_agent.commands import MOTION_COMMANDS, CommandAPI, CommandContext, Freshness, Mode
from edge_agent.executor.latch import StopLatch
from edge_agent.vocab import StopCause


class Wall:
    def __init__(self, t: float = 1_700_000_000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def make(skew: float = 1.0) -> tuple[CommandAPI, Freshness, Wall, list[str]]:
    wall = Wall()
    fresh = Freshness(skew, wall_clock=wall)
    ran: list[str] = []
    api = CommandAPI(lambda: Mode.HOLDING, freshness=fresh, wall_clock=wall,
                     reset_min_interval_s=0.0)

    def record(args: dict[str, Any], ctx: CommandContext) -> dict[str, Any]:
        ran.append(ctx.id)
        return {}

    for name in ("task.start", "resume", "manual.enter", "manual.jog", "manual.exit", "reset",
                 "status", "task.cancel"):
        api.register(name, record)
    return api, fresh, wall, ran


def code(reply: Any) -> str | None:
    return None if reply.ok else reply.error.code.value


ARGS = {"task.start": {}, "resume": {"task_id": "t"}, "manual.enter": {},
        "manual.jog": {"dq": [0.1], "ttl_ms": 100}}


@pytest.mark.parametrize("name", sorted(MOTION_COMMANDS))
def test_a_motion_command_from_before_the_latest_stop_or_reset_is_stale(name: str) -> None:
    api, fresh, wall, ran = make(skew=1.0)
    wall.t += 100
    sent = wall.t
    wall.t += 5
    fresh.note_trip()
    wall.t += 5
    fresh.note_reset()
    reset_at = wall.t
    wall.t += 0.5
    # published before the stop, held on the way, delivered now: stale
    r = api.handle(name, {"v": 1, "id": "a", "ts": sent, **ARGS[name]}, source="test")
    assert code(r) == "stale" and "before the latest stop or reset" in r.error.message
    # published between the stop and the reset: stale too (a reset discards what was queued)
    r = api.handle(name, {"v": 1, "id": "b", "ts": reset_at - 1, **ARGS[name]}, source="test")
    assert code(r) == "stale"
    # inside the skew allowance after the reset: refused (the rule errs on the safe side) ...
    r = api.handle(name, {"v": 1, "id": "c", "ts": reset_at + 0.5, **ARGS[name]}, source="test")
    assert code(r) == "stale"
    # ... past it: runs; and without ts only the epoch rule applies
    wall.t = reset_at + 2
    assert api.handle(name, {"v": 1, "id": "d", "ts": reset_at + 1.5, **ARGS[name]},
                      source="test").ok
    assert api.handle(name, {"v": 1, "id": "e", **ARGS[name]}, source="test").ok
    assert ran == ["d", "e"] and api.counters["stale"] == 3


def test_the_epoch_rule_needs_no_clock() -> None:
    api, fresh, _, ran = make(skew=0.0)
    arrived = api.epoch()
    fresh.note_trip()
    fresh.note_reset()
    r = api.handle("task.start", {"v": 1, "id": "s"}, source="mqtt", arrived=arrived)
    assert code(r) == "stale" and "arrived before the latest stop or reset" in r.error.message
    # a reset that arrived before the latest trip was meant for an earlier stop
    arrived = api.epoch()
    fresh.note_trip()
    assert code(api.handle("reset", {"v": 1, "id": "r1"}, source="mqtt",
                           arrived=arrived)) == "stale"
    # ... but one that arrived before a reset only (nothing new tripped) is fine
    arrived = api.epoch()
    fresh.note_reset()
    assert api.handle("reset", {"v": 1, "id": "r2"}, source="mqtt", arrived=arrived).ok
    # what ends or observes motion is never stale
    arrived_old = api.epoch()
    fresh.note_trip()
    for name in ("manual.exit", "task.cancel", "status"):
        assert api.handle(name, {"v": 1, "id": f"x-{name}"}, source="mqtt",
                          arrived=arrived_old).ok, name
    assert ran == ["x-manual.exit", "x-status"]  # reset and cancel: no-ops while holding


def test_a_ts_ahead_of_the_daemon_clock_is_refused_and_an_estop_never_is() -> None:
    api, _, wall, _ = make(skew=1.0)
    api.register("estop", lambda a, c: {"latched": True})
    r = api.handle("status", {"v": 1, "id": "f", "ts": wall.t + 1.5}, source="test")
    assert code(r) == "clock_skew" and "ahead of the daemon's clock" in r.error.message
    assert api.handle("status", {"v": 1, "id": "g", "ts": wall.t + 0.9}, source="test").ok
    assert api.handle("estop", {"v": 1, "id": "h", "ts": wall.t + 99}, source="test").ok
    r = api.handle("task.start", {"v": 1, "id": "i", "ts": "now"}, source="test")
    assert code(r) == "bad_args" and "ts: expected a number" in r.error.message


def test_the_daemon_start_counts_as_a_reset() -> None:
    api, _, wall, _ = make(skew=1.0)
    r = api.handle("task.start", {"v": 1, "id": "old", "ts": wall.t - 60}, source="test")
    assert code(r) == "stale"


def test_the_latch_listener_marks_trips_resets_and_renewed_presses() -> None:
    wall = Wall()
    fresh = Freshness(0.0, wall_clock=wall)
    latch = StopLatch()
    latch.add_listener(fresh.on_latch)
    e0 = fresh.epoch()
    latch.trip(StopCause.ESTOP_LOCAL, 1.0)
    e1 = fresh.epoch()
    assert (e1.trips, e1.changes) == (e0.trips + 1, e0.changes + 1)
    latch.set_hardware_input(True, 2.0)  # a new cause
    latch.set_hardware_input(False, 3.0)  # a release is neither a trip nor a reset
    latch.set_hardware_input(True, 4.0)  # pressed again while latched: a stop all the same
    e2 = fresh.epoch()
    assert e2.trips == e1.trips + 2
    latch.set_hardware_input(False, 5.0)
    latch.reset(6.0)
    e3 = fresh.epoch()
    assert (e3.trips, e3.changes) == (e2.trips, e2.changes + 1)
    with pytest.raises(ValueError):
        Freshness(-1.0)

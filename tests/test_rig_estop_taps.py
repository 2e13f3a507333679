"""The simulated e-stop latches a press edge until a tick samples it (issue #15 item 7), pure.

Over the lock-step runner: presses and releases between two firmware ticks (no tick in between,
so a button sampled once per tick would never see them). Each press is still an ESTOP_EDGE,
`ESTOP_INPUT` for at least one tick, and (with the firmware's own hold) a latch. The daemon-level
test is tests/test_estop_taps_daemon.py.
"""

from __future__ import annotations

from pathlib import Path

from edge_agent.link.codec import EstopEdge, Status, StatusFlag
from edge_agent.robot import load_robot
from hil.lockstep import Lockstep
from hil.sim.harness import Session

ROBOT = load_robot(Path(__file__).resolve().parents[1] / "configs/robot/edge-arm-4.toml")


def _between_ticks(s: Session) -> None:
    """Run to just after the next tick: the following inject lands before the one after."""
    s.r.run_for(s.r.fw.next_tick_time() - s.r.now + 1e-6)


def test_taps_between_two_ticks_are_each_a_press() -> None:
    s = Session(Lockstep(ROBOT, seed=1))
    s.open()
    s.enable()
    for _ in range(3):  # three taps, each pressed and released between the same two ticks
        _between_ticks(s)
        s.r.inject("estop", "press")
        s.r.inject("estop", "release")
    s.r.run_for(0.02)
    edges = [e.pressed for e in s.host.of_type(EstopEdge)]
    assert edges == [True, False] * 3, edges
    pressed_statuses = [m for m in s.host.of_type(Status) if m.flags & StatusFlag.ESTOP_INPUT]
    assert len(pressed_statuses) >= 3
    st = s.status()
    assert not st.estop_input and st.flags & StatusFlag.ESTOP_LATCHED  # latched by the taps


def test_three_taps_in_one_tick_are_three_presses() -> None:
    s = Session(Lockstep(ROBOT, seed=1))
    s.open()
    _between_ticks(s)
    for _ in range(3):  # all between the same two ticks
        s.r.inject("estop", "press")
        s.r.inject("estop", "release")
    s.r.run_for(0.02)
    assert [e.pressed for e in s.host.of_type(EstopEdge)] == [True, False] * 3
    assert s.r.fw.counters["estop_edges"] == 6

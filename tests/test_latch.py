"""The stop latch: what latches, what a reset may clear, and what it never clears."""

from __future__ import annotations

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from edge_agent.executor.latch import (
    ESTOP_CAUSES,
    ResetRefused,
    StopCause,
    StopKind,
    StopLatch,
)


def test_remote_estop_latches_and_reset_clears_it() -> None:
    latch = StopLatch()
    latch.trip(StopCause.ESTOP_MQTT, now=1.0)
    assert latch.state.kind is StopKind.ESTOP
    assert latch.state.first_cause is StopCause.ESTOP_MQTT
    gen = latch.state.generation
    latch.reset(now=2.0)
    assert not latch.latched
    assert latch.state.generation > gen  # the executor sees a new generation: drop setpoints


def test_reset_refused_while_hardware_input_active() -> None:
    latch = StopLatch()
    latch.set_hardware_input(True, now=1.0)
    assert latch.state.kind is StopKind.ESTOP
    with pytest.raises(ResetRefused) as exc:
        latch.reset(now=2.0)
    assert exc.value.code == "estop_active"
    assert latch.latched
    latch.set_hardware_input(False, now=3.0)
    assert latch.latched  # releasing the button clears nothing by itself
    latch.reset(now=4.0)
    assert not latch.latched


def test_protective_stop_reset_refused_while_cause_present() -> None:
    latch = StopLatch()
    latch.set_condition(StopCause.LINK_FAULT, True, now=1.0)
    assert latch.state.kind is StopKind.PROTECTIVE
    with pytest.raises(ResetRefused) as exc:
        latch.reset(now=2.0)
    assert exc.value.code == "cause_present"
    assert "link_fault" in exc.value.message
    latch.set_condition(StopCause.LINK_FAULT, False, now=3.0)
    assert latch.latched
    latch.reset(now=4.0)
    assert not latch.latched


def test_estop_dominates_protective_stop() -> None:
    latch = StopLatch()
    latch.trip(StopCause.COLLISION, now=1.0)
    latch.trip(StopCause.ESTOP_FLEET, now=2.0)
    assert latch.state.kind is StopKind.ESTOP
    assert latch.state.first_cause is StopCause.ESTOP_FLEET
    assert set(latch.state.causes) == {StopCause.COLLISION, StopCause.ESTOP_FLEET}


def test_restore_relatches_saved_causes() -> None:
    a = StopLatch()
    a.trip(StopCause.ESTOP_INPUT, now=5.0)
    saved = a.to_dict()
    b = StopLatch()
    b.restore(saved, now=100.0)
    assert b.state.kind is StopKind.ESTOP
    b.reset(now=101.0)  # the input is not known to be active after a restart
    assert not b.latched


def test_restore_of_unknown_cause_still_stops() -> None:
    b = StopLatch()
    b.restore({"causes": {"some_future_cause": 1.0}}, now=1.0)
    assert b.latched


def test_listener_errors_do_not_break_the_latch() -> None:
    latch = StopLatch()
    seen: list[object] = []

    def bad(state: object, cause: object) -> None:
        raise RuntimeError("boom")

    latch.add_listener(bad)
    latch.add_listener(lambda s, c: seen.append(c))
    latch.trip(StopCause.ESTOP_LOCAL, now=1.0)
    assert latch.latched and seen == [StopCause.ESTOP_LOCAL]


class LatchMachine(RuleBasedStateMachine):
    """Whatever happens, a pressed hardware input keeps the latch set."""

    def __init__(self) -> None:
        super().__init__()
        self.latch = StopLatch()
        self.now = 0.0
        self.pressed = False
        self.present: set[StopCause] = set()

    @rule(cause=st.sampled_from(list(StopCause)))
    def trip(self, cause: StopCause) -> None:
        self.now += 0.01
        self.latch.trip(cause, self.now)

    @rule(active=st.booleans())
    def hardware(self, active: bool) -> None:
        self.now += 0.01
        self.pressed = active
        self.latch.set_hardware_input(active, self.now)

    @rule(cause=st.sampled_from([c for c in StopCause if c not in ESTOP_CAUSES]),
          present=st.booleans())
    def condition(self, cause: StopCause, present: bool) -> None:
        self.now += 0.01
        self.latch.set_condition(cause, present, self.now)
        (self.present.add if present else self.present.discard)(cause)

    @rule()
    def reset(self) -> None:
        self.now += 0.01
        try:
            self.latch.reset(self.now)
        except ResetRefused:
            assert self.pressed or self.present
        else:
            assert not self.pressed and not self.present

    @invariant()
    def pressed_input_is_always_latched(self) -> None:
        if self.pressed:
            assert self.latch.state.kind is StopKind.ESTOP

    @invariant()
    def present_condition_is_always_latched(self) -> None:
        if self.present:
            assert self.latch.latched


TestLatchMachine = LatchMachine.TestCase
TestLatchMachine.settings = settings(max_examples=200, stateful_step_count=40, deadline=None)

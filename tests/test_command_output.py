"""daemon/output.py: the control thread's COMMAND frames, sent as each tick ends or held to the
next deadline — and never sent across a latch change."""

from __future__ import annotations

from edge_agent.daemon.output import CommandOutput
from edge_agent.executor.latch import StopCause, StopLatch
from edge_agent.link.codec import Command, Mode


def _cmd(i: int) -> Command:
    return Command(Mode.POSITION, (0.01 * i, 0.0, 0.0, 0.0))


def _run(out: CommandOutput, latch: StopLatch, ticks: range) -> None:
    for i in ticks:
        out.begin_tick(latch.state)
        out.end_tick(_cmd(i), latch.state)


def test_immediate_mode_sends_each_frame_as_its_tick_ends() -> None:
    sent: list[Command] = []
    latch = StopLatch()
    _run(CommandOutput(sent.append, at_deadline=False), latch, range(4))
    assert sent == [_cmd(i) for i in range(4)]


def test_at_deadline_each_tick_sends_the_frame_the_last_one_computed() -> None:
    sent: list[Command] = []
    latch = StopLatch()
    out = CommandOutput(sent.append, at_deadline=True)
    _run(out, latch, range(4))
    # the first frame goes out at once and again at the next deadline; then one tick behind
    assert sent == [_cmd(0), _cmd(0), _cmd(1), _cmd(2)]
    assert out.discarded == 0


def test_a_held_frame_is_never_sent_across_a_latch_change() -> None:
    sent: list[Command] = []
    latch = StopLatch()
    out = CommandOutput(sent.append, at_deadline=True)
    _run(out, latch, range(3))  # holds _cmd(2)
    assert latch.trip(StopCause.ESTOP_MQTT, 1.0)
    n = len(sent)
    out.begin_tick(latch.state)  # the latch changed: _cmd(2) is dropped
    hold = Command(Mode.HOLD, (0.0, 0.0, 0.0, 0.0))
    out.end_tick(hold, latch.state)  # computed under the new latch: out at once
    assert sent[n:] == [hold] and out.discarded == 1
    out.begin_tick(latch.state)
    assert sent[n:] == [hold, hold]  # the held stream takes over again


def test_a_frame_computed_before_a_change_read_inside_the_tick_is_dropped() -> None:
    """The latch changes between begin_tick and the executor's computation: the frame was
    computed under the old state, so the next deadline drops it."""
    sent: list[Command] = []
    latch = StopLatch()
    out = CommandOutput(sent.append, at_deadline=True)
    _run(out, latch, range(2))
    before = latch.state
    out.begin_tick(before)
    latch.trip(StopCause.ESTOP_MQTT, 1.0)
    out.end_tick(_cmd(9), before)
    n = len(sent)
    out.begin_tick(latch.state)
    assert sent[n:] == [] and out.discarded == 1

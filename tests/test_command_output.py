"""daemon/output.py: the control thread's COMMAND frames, sent as each tick ends or handed to
the guardian timed for the next deadline — and the frame computed under a new latch state at
once. (What the guardian does with a timed frame: tests/test_guardian_rules.py; both together
through the real daemon core: tests/test_stop_model_daemon.py.)"""

from __future__ import annotations

from edge_agent.daemon.output import CommandOutput
from edge_agent.executor.latch import StopLatch
from edge_agent.link.codec import Command, GAt, Message, Mode
from edge_agent.vocab import StopCause

PERIOD = 0.002


def _cmd(i: int) -> Command:
    return Command(Mode.POSITION, (0.01 * i, 0.0, 0.0, 0.0))


def _due(i: int) -> float:
    return 100.0 + (i + 1) * PERIOD


def _run(out: CommandOutput, latch: StopLatch, ticks: range) -> None:
    for i in ticks:
        out.emit(_cmd(i), latch.state, _due(i))


def test_immediate_mode_sends_each_frame_as_its_tick_ends() -> None:
    sent: list[Message] = []
    latch = StopLatch()
    _run(CommandOutput(sent.append, at_deadline=False), latch, range(4))
    assert sent == [_cmd(i) for i in range(4)]


def test_at_deadline_each_frame_is_timed_for_the_next_deadline() -> None:
    sent: list[Message] = []
    latch = StopLatch()
    out = CommandOutput(sent.append, at_deadline=True)
    _run(out, latch, range(4))
    # the first frame also goes out at once (nothing waits at the guardian yet)
    assert sent == [_cmd(0)] + [GAt(round(_due(i) * 1e6), _cmd(i)) for i in range(4)]
    assert out.sent_at_once == 1


def test_after_a_latch_change_the_new_frame_goes_out_at_once_and_then_timed() -> None:
    """The immediate frame supersedes the timed one computed under the old state (the guardian
    drops a waiting G_AT on any immediate COMMAND, and on the STOP the latch sent)."""
    sent: list[Message] = []
    latch = StopLatch()
    out = CommandOutput(sent.append, at_deadline=True)
    _run(out, latch, range(3))
    assert latch.trip(StopCause.ESTOP_MQTT, 1.0)
    n = len(sent)
    hold = Command(Mode.HOLD, (0.0, 0.0, 0.0, 0.0))
    out.emit(hold, latch.state, _due(3))
    assert sent[n:] == [hold, GAt(round(_due(3) * 1e6), hold)]
    out.emit(hold, latch.state, _due(4))
    assert sent[n + 2 :] == [GAt(round(_due(4) * 1e6), hold)]
    assert out.sent_at_once == 2


def test_a_frame_computed_before_a_change_read_inside_the_tick_is_timed_and_the_next_is_not(
) -> None:
    """The latch changes after the executor read it: that frame still goes out timed (the STOP
    the latch sent dropped nothing yet, and the guardian refuses motion while latched); the
    next tick sees the new state and sends at once."""
    sent: list[Message] = []
    latch = StopLatch()
    out = CommandOutput(sent.append, at_deadline=True)
    _run(out, latch, range(2))
    before = latch.state
    latch.trip(StopCause.ESTOP_MQTT, 1.0)
    out.emit(_cmd(9), before, _due(2))
    assert sent[-1] == GAt(round(_due(2) * 1e6), _cmd(9))
    n = len(sent)
    out.emit(_cmd(10), latch.state, _due(3))
    assert sent[n:] == [_cmd(10), GAt(round(_due(3) * 1e6), _cmd(10))]

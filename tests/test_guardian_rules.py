"""The guardian's sans-IO rules: unit cases and a Hypothesis state machine over frames and time.

Default run: 150 state-machine examples of up to 60 steps. `EDGE_GUARDIAN_EXAMPLES=100000` for a
long run.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from edge_agent.link.codec import (
    Command,
    Enable,
    EstopEdge,
    Event,
    EventCode,
    GAt,
    GReset,
    GripperMode,
    GState,
    Hello,
    HelloAck,
    Message,
    Mode,
    Ping,
    Status,
    StatusFlag,
    Stop,
    StopCategory,
    StopReason,
)
from edge_agent.link.guardian_rules import Actions, GuardianFlag, GuardianRules, Limits
from edge_agent.robot import load_robot

ROBOT = Path(__file__).resolve().parents[1] / "configs" / "robot" / "edge-arm-4.toml"
LIMITS = Limits.from_robot(load_robot(ROBOT))
N = LIMITS.n_joints
Z = (0.0,) * N
DEADMAN = 0.05
HOLD_PERIOD = 0.01
ESTOP_STOP = Stop(StopCategory.CAT0, StopReason.ESTOP_INPUT)
EXAMPLES = int(os.environ.get("EDGE_GUARDIAN_EXAMPLES", "150"))


def status(pressed: bool) -> Status:
    return Status(0, StatusFlag.ESTOP_INPUT if pressed else StatusFlag(0), 0, Z, Z, Z,
                  0.0, 0.0, 0.0)


def position(q: tuple[float, ...] = (0.1, 1.0, -1.0, 0.0)) -> Command:
    return Command(Mode.POSITION, q, GripperMode.POSITION, 0.04, 0.8)


def moving(m: Message) -> bool:
    return (isinstance(m, Command) and m.moves) or (isinstance(m, Enable) and m.enable)


def up_rules(now: float = 0.0) -> GuardianRules:
    r = GuardianRules(LIMITS, now, deadman_s=DEADMAN, hold_period_s=HOLD_PERIOD)
    r.on_link(True, now)
    r.on_tty(status(False), now)
    return r


# --------------------------------------------------------------------------- unit cases


def test_limits_come_from_the_robot_description() -> None:
    assert N == 4
    assert LIMITS.q_min[1] == -0.3 and LIMITS.q_max[1] == 2.2
    assert LIMITS.current_max_a == 2.0 and LIMITS.stroke_max_m == 0.08


def test_commands_are_clamped_to_joint_and_gripper_limits() -> None:
    r = up_rules()
    acts = r.on_daemon(Command(Mode.POSITION, (9.0, -9.0, 0.0, 0.0), GripperMode.FORCE, 100.0,
                               50.0), 0.0)
    (cmd,) = acts.tty
    assert isinstance(cmd, Command)
    assert cmd.q == (2.8, -0.3, 0.0, 0.0)
    assert cmd.gripper_setpoint == 40.0 and cmd.gripper_current_limit == 2.0
    ok = position()
    assert r.on_daemon(ok, 0.001).tty == [ok]
    assert r.counters["clamped"] == 1


def test_unusable_commands_become_a_hold() -> None:
    r = up_rules()
    for bad in (position((math.nan, 0.0, 0.0, 0.0)), position((0.0, 0.0)),
                Command(Mode.POSITION, Z, GripperMode.POSITION, math.inf, 1.0)):
        (cmd,) = r.on_daemon(bad, 0.0).tty
        assert cmd == LIMITS.hold()
    assert r.counters["rejected"] == 3


def test_estop_edge_stops_first_latches_and_refuses_reset_until_released() -> None:
    r = up_rules()
    acts = r.on_tty(EstopEdge(1, True), 0.0)
    assert acts.tty == [ESTOP_STOP]
    assert acts.daemon[-1] == GState(True, True, False, True, StopReason.ESTOP_INPUT, 0)
    assert r.on_daemon(position(), 0.0).tty == []
    assert r.on_daemon(Enable(True), 0.0).tty == []
    assert r.on_daemon(Enable(False), 0.0).tty == [Enable(False)]
    assert r.on_daemon(Ping(5), 0.0).tty == [Ping(5)]
    assert r.on_daemon(Command(Mode.HOLD, Z), 0.0).tty == [Command(Mode.HOLD, Z)]
    refused = r.on_daemon(GReset(), 0.0).daemon
    assert refused == [GState(True, True, False, True, StopReason.RESET_REFUSED, 0)]
    assert r.on_tty(EstopEdge(2, True), 0.0).tty == [ESTOP_STOP]  # again, although latched
    r.on_tty(EstopEdge(3, False), 0.0)
    cleared = r.on_daemon(GReset(), 0.0).daemon
    assert cleared == [GState(False, False, False, True, StopReason.NONE,
                              int(GuardianFlag.NEED_ENABLE))]
    assert r.on_daemon(position(), 0.0).tty == []  # no motion before a new ENABLE(1)
    assert r.on_daemon(Enable(True), 0.0).tty == [Enable(True)]
    assert r.on_daemon(position(), 0.0).tty == [position()]


def test_status_with_the_input_active_latches_when_the_edge_frame_was_lost() -> None:
    r = up_rules()
    assert r.on_tty(status(True), 0.0).tty == [ESTOP_STOP]
    assert r.on_tty(status(True), 0.001).tty == []  # a steady input is not a new edge


def test_remote_stop_is_forwarded_and_latches_with_its_reason() -> None:
    r = up_rules()
    stop = Stop(StopCategory.CAT0, StopReason.ESTOP_REMOTE)
    acts = r.on_daemon(stop, 0.0)
    assert acts.tty == [stop] and r.state.cause == StopReason.ESTOP_REMOTE
    r.on_daemon(GReset(), 0.0)
    assert not r.latched
    r.on_daemon(Stop(StopCategory.CAT2, StopReason.COLLISION), 0.0)
    r.on_tty(EstopEdge(1, True), 0.0)
    assert r.cause == StopReason.ESTOP_INPUT  # an e-stop outranks a protective stop


def test_link_fault_latches_and_reset_waits_for_the_link() -> None:
    r = up_rules()
    acts = r.on_link(False, 0.0)
    assert acts.daemon[-1].latched and acts.daemon[-1].cause == StopReason.LINK_FAULT
    assert r.on_daemon(GReset(), 0.0).daemon[-1].cause == StopReason.RESET_REFUSED
    r.on_link(True, 0.1)
    assert r.on_tty(status(True), 0.1).tty == [ESTOP_STOP]  # input unknown across the outage
    r.on_tty(status(False), 0.2)
    r.on_daemon(GReset(), 0.2)
    assert not r.latched


def test_deadman_holds_and_latches_until_reset_enable_and_a_new_command() -> None:
    """A daemon silent past the deadman may wake up with stale setpoints: the guardian holds and
    latches (DEADMAN); the daemon's next COMMAND ends the hold stream but moves nothing until
    G_RESET + ENABLE(1)."""
    r = up_rules()
    assert r.on_tick(1.0).tty == []  # not armed before the first command
    r.on_daemon(position(), 1.0)
    assert r.next_deadline() <= 1.0 + DEADMAN
    acts = r.on_tick(1.0 + DEADMAN)
    assert acts.tty == [LIMITS.hold()] and r.state.deadman_hold
    assert r.latched and r.state.cause == StopReason.DEADMAN
    assert acts.daemon[-1].latched and acts.daemon[-1].cause == StopReason.DEADMAN
    assert r.counters["deadman_trips"] == 1
    assert r.next_deadline() == 1.0 + DEADMAN + HOLD_PERIOD
    assert r.on_daemon(position(), 1.2).tty == []  # the stale setpoint: dropped
    assert not r.state.deadman_hold and r.latched and r.state.cause == StopReason.DEADMAN
    assert r.on_daemon(LIMITS.hold(), 1.21).tty == [LIMITS.hold()]  # a hold passes
    r.on_daemon(GReset(), 1.22)
    assert not r.latched
    assert r.on_daemon(position(), 1.23).tty == []  # still no motion before ENABLE(1)
    r.on_daemon(Enable(True), 1.24)
    assert r.on_daemon(position(), 1.25).tty == [position()]


def test_a_silence_inside_a_hold_stream_holds_without_latching_unless_motion_follows() -> None:
    """Idle (or start-up work): the daemon streams HOLD; a pause past the deadman holds but is
    no stop. The stream resuming with motion straight after the silence is: it may be stale."""
    r = up_rules()
    r.on_daemon(Enable(True), 0.0)
    r.on_daemon(LIMITS.hold(), 0.0)
    assert r.on_tick(0.1).tty == [LIMITS.hold()] and r.state.deadman_hold and not r.latched
    r.on_daemon(LIMITS.hold(), 0.11)  # the stream is back, still holding
    assert not r.state.deadman_hold and not r.latched
    assert r.on_daemon(position(), 0.115).tty == [position()]  # a task starts: moves
    r.on_daemon(LIMITS.hold(), 0.12)
    r.on_tick(0.145)  # the G_STATE due (every half deadman) ...
    r.on_tick(0.17)  # ... and the deadman, as the loop ticks: holds, no latch
    assert r.state.deadman_hold and not r.latched
    r.on_tick(0.2)
    assert r.on_daemon(position(), 0.21).tty == [] and r.latched  # motion right after silence
    assert r.state.cause == StopReason.DEADMAN


def test_commands_queued_while_the_guardian_stalled_trip_the_deadman_first() -> None:
    """The guardian itself was stopped (its timer never fired) while the daemon kept sending:
    the first queued COMMAND past the deadman latches, and it and the rest are dropped."""
    r = up_rules()
    r.on_daemon(Enable(True), 0.0)
    assert r.on_daemon(position(), 0.0).tty == [position()]
    outs = [r.on_daemon(position(), 1.5) for _ in range(5)]  # read at once after the stall
    assert r.latched and r.state.cause == StopReason.DEADMAN
    assert all(not any(moving(m) for m in a.tty) for a in outs)
    assert r.counters["deadman_trips"] == 1 and r.counters["dropped_motion"] == 5


def test_motion_let_through_before_a_freeze_is_not_written_after_it() -> None:
    """The sequence hil.guardian_freeze_loop caught (the rig's record: the guardian stopped in
    user space, seq 504 read 3 ms before the SIGSTOP, seq 505 POSITION read 8 ms after the
    SIGCONT 1.5 s later): the rules let a POSITION through at t=0, the process was frozen before
    its write, and it woke at t=1.5 with the frame in hand. Judged again on the fresh clock it
    is not written; the deadman trips (latched, hold stream) and the daemon's frames queued
    meanwhile move nothing until G_RESET + ENABLE(1)."""
    r = up_rules()
    r.on_daemon(Enable(True), 0.0)
    assert r.on_daemon(position(), 0.0).tty == [position()]  # the decision ...
    assert r.before_write(position(), 0.0001) is None  # ... written at once: fine
    assert r.after_write(position(), 0.0002) is None
    assert r.on_daemon(position(), 0.005).tty == [position()]  # the next decision ...
    refused = r.before_write(position(), 1.5)  # ... and the freeze before its write
    assert refused is not None and not any(moving(m) for m in refused.tty)
    assert r.latched and r.state.cause == StopReason.DEADMAN and r.state.deadman_hold
    assert refused.daemon[-1].latched and refused.daemon[-1].cause == StopReason.DEADMAN
    assert r.counters["stale_dropped"] == 1 and r.counters["deadman_trips"] == 1
    assert r.on_tick(1.5).tty == [LIMITS.hold()]  # the hold stream
    queued = [r.on_daemon(m, 1.5) for m in (position(), position(),
                                            Stop(StopCategory.CAT2, StopReason.DEADMAN),
                                            LIMITS.hold())]
    assert not any(moving(m) for a in queued for m in a.tty)
    r.on_daemon(GReset(), 1.51)
    assert r.on_daemon(position(), 1.511).tty == []  # no motion before ENABLE(1)
    r.on_daemon(Enable(True), 1.512)
    assert r.on_daemon(position(), 1.513).tty == [position()]
    assert r.before_write(position(), 1.5131) is None


def test_a_hold_queued_ahead_of_setpoints_while_the_guardian_was_frozen_does_not_rearm_it(
        ) -> None:
    """The other sequence the loop caught (guardian stopped in sendto, 1.57 s): the daemon's
    executor held for a tick when its measurements went stale (seq 13210 HOLD, read 6 ms before
    the freeze), then sent the trajectory's next two setpoints and HOLDs into the socketpair.
    After the wake the queued HOLD came first: read on a fresh clock it re-armed the deadman as a
    live hold stream would, and seq 13212/13213 POSITION went out. A gap in the guardian's own
    time while the stream moved is a deadman trip, whatever the first frame after it is."""
    r = up_rules()
    r.on_daemon(Enable(True), 0.0)
    for i in range(5):  # moving, ticked as the loop does
        assert r.on_daemon(position(), i * 0.005).tty == [position()]
        r.on_tick(i * 0.005 + 0.001)
    r.on_daemon(LIMITS.hold(), 0.025)  # the stale-measurement hold, then the freeze
    woke = 0.025 + 1.57
    acts = [r.on_tick(woke), r.on_tty(status(False), woke)]
    assert r.latched and r.state.cause == StopReason.DEADMAN and r.counters["stalls"] == 1
    acts += [r.on_daemon(m, woke) for m in (LIMITS.hold(), position(), position(), LIMITS.hold(),
                                            Stop(StopCategory.CAT2, StopReason.DEADMAN))]
    assert not any(moving(m) for a in acts for m in a.tty)
    assert r.counters["dropped_motion"] == 2


def test_a_gap_while_idle_only_holds_and_ticks_at_the_deadlines_are_no_gap() -> None:
    """No motion within a deadman time before the gap: nothing to protect, no stop. A loop
    that ticks at next_deadline() never sees a gap, however long it runs."""
    r = up_rules()
    r.on_daemon(Enable(True), 0.0)
    r.on_daemon(LIMITS.hold(), 0.0)
    r.on_tick(2.0)
    assert not r.latched and r.counters["stalls"] == 0
    t = 2.0
    for i in range(100):  # a 200 Hz stream: back, moving, holding, then silent for 40 s
        if i < 60:
            r.on_daemon(position() if 0 < i < 40 else LIMITS.hold(), t)
        next_cmd = t + 0.005 if i < 59 else t + 1.0
        while r.next_deadline() < next_cmd:
            r.on_tick(r.next_deadline())
        t = next_cmd
    assert r.counters["stalls"] == 0 and not r.latched and r.state.deadman_hold


def test_a_freeze_between_the_check_and_the_write_is_followed_by_a_stop() -> None:
    """The freeze fell after before_write, before the frame left: it may have gone out stale,
    so STOP(CAT2, DEADMAN) goes to the tty at once (the firmware holds and latches) and the
    deadman trips. ENABLE(1) is motion too; HOLD, STOP and PING are never held back."""
    r = up_rules()
    r.on_daemon(Enable(True), 0.0)
    r.on_daemon(position(), 0.0)
    assert r.before_write(position(), 0.0001) is None
    stale = r.after_write(position(), 1.5)
    assert stale is not None and stale.tty == [Stop(StopCategory.CAT2, StopReason.DEADMAN)]
    assert r.latched and r.state.cause == StopReason.DEADMAN
    assert r.counters["stale_written"] == 1
    r = up_rules()
    r.on_daemon(GReset(), 0.0)
    assert r.before_write(Enable(True), 1.0) is not None and r.latched
    for m in (LIMITS.hold(), Stop(StopCategory.CAT2, StopReason.PROTECTIVE), Ping(1),
              Enable(False)):
        assert r.before_write(m, 9.0) is None and r.after_write(m, 9.0) is None


def test_the_stall_bound_is_the_firmwares_deadman_when_it_is_shorter() -> None:
    """The firmware trips after its own deadman (HELLO deadman_ms) of silence: motion held back
    longer than that would reach a tripped robot even when the guardian's deadman is longer."""
    r = GuardianRules(LIMITS, 0.0, deadman_s=0.25, hello=Hello(deadman_ms=100))
    assert r.stall_bound_s == 0.1
    r.on_link(True, 0.0)
    r.on_daemon(Enable(True), 0.0)
    r.on_daemon(position(), 0.0)
    assert r.before_write(position(), 0.09) is None
    assert r.before_write(position(), 0.11) is not None and r.latched
    assert GuardianRules(LIMITS, 0.0, deadman_s=0.05, hello=Hello(deadman_ms=100)
                         ).stall_bound_s == 0.05


def fw_status(*, deadman: bool) -> Status:
    return Status(0, StatusFlag.DEADMAN_TRIPPED if deadman else StatusFlag(0), 0, Z, Z, Z,
                  0.0, 0.0, 0.0)


def test_a_firmware_deadman_trip_latches_the_guardian_once_per_trip() -> None:
    """The guardian itself stalled and the firmware's deadman tripped: whatever the daemon had
    queued meanwhile must not move the arm. The flag stays set until ENABLE(1) reaches the
    firmware, so only its rising edge latches (else no reset could ever pass)."""
    for report in (fw_status(deadman=True), Event(0, EventCode.DEADMAN_TRIP, 120)):
        r = up_rules()
        r.on_daemon(Enable(True), 0.0)
        assert r.on_daemon(position(), 0.0).tty == [position()]
        acts = r.on_tty(report, 0.01)
        assert r.latched and r.state.cause == StopReason.DEADMAN, report
        assert acts.daemon[-1].cause == StopReason.DEADMAN
        assert r.on_daemon(position(), 0.011).tty == [], report
    r.on_tty(fw_status(deadman=True), 0.012)
    r.on_daemon(GReset(), 0.02)
    assert not r.latched
    r.on_tty(fw_status(deadman=True), 0.021)  # still tripped: not a new trip
    assert not r.latched
    r.on_daemon(Enable(True), 0.022)
    r.on_tty(fw_status(deadman=False), 0.023)
    assert r.on_daemon(position(), 0.024).tty == [position()]
    r.on_tty(fw_status(deadman=True), 0.2)  # a new trip
    assert r.latched and r.counters["fw_deadman_reports"] == 3


def test_motion_after_a_firmware_trip_while_holding_latches_unless_enable_cleared_it() -> None:
    """The firmware tripped while the daemon only held (a stalled rig: no STATUS, the executor
    holds; then no command read in time): that is no stop yet, but the firmware now holds until
    ENABLE(1) and drops motion. Motion sent without one latches DEADMAN — the daemon sees a stop
    instead of a task commanding a held arm until it fails (3 x transfer not_converged)."""
    for report in (fw_status(deadman=True), Event(0, EventCode.DEADMAN_TRIP, 100)):
        r = up_rules()
        r.on_daemon(Enable(True), 0.0)
        r.on_daemon(LIMITS.hold(), 0.0)
        r.on_tty(report, 0.01)
        assert not r.latched, report  # a trip inside a hold only holds
        assert r.on_daemon(LIMITS.hold(), 0.011).tty == [LIMITS.hold()]
        assert r.on_daemon(position(), 0.012).tty == []
        assert r.latched and r.state.cause == StopReason.DEADMAN, report
        # an ENABLE(1) (a task start, a resume) clears the firmware's trip: motion passes
        r = up_rules()
        r.on_daemon(Enable(True), 0.0)
        r.on_daemon(LIMITS.hold(), 0.0)
        r.on_tty(report, 0.01)
        r.on_daemon(Enable(True), 0.011)
        assert r.on_daemon(position(), 0.012).tty == [position()] and not r.latched


def test_state_goes_out_every_half_deadman_by_default_as_the_daemons_heartbeat() -> None:
    r = GuardianRules(LIMITS, 0.0, deadman_s=0.05)
    assert r.state_period_s == 0.025
    r.on_tick(0.0)
    assert r.next_deadline() == 0.025 and r.on_tick(0.025).daemon
    assert GuardianRules(LIMITS, 0.0, deadman_s=5.0).state_period_s == 1.0


def test_daemon_lost_holds_for_good() -> None:
    r = up_rules()
    acts = r.on_daemon_lost(3.0)
    assert acts.tty == [LIMITS.hold()]
    assert r.state.flags & GuardianFlag.DAEMON_LOST
    assert r.on_tick(3.0 + HOLD_PERIOD).tty == [LIMITS.hold()]


def test_state_goes_out_on_change_and_once_a_period() -> None:
    r = GuardianRules(LIMITS, 0.0, realtime=True, state_period_s=1.0)
    first = r.on_tick(0.0).daemon
    assert first == [GState(False, False, False, False, StopReason.NONE,
                            int(GuardianFlag.REALTIME))]
    assert r.on_tick(0.5).daemon == []
    assert r.next_deadline() == 1.0
    assert r.on_tick(1.0).daemon == first
    acked = r.on_tty(HelloAck(1, True, N), 1.1).daemon
    assert acked[-1].flags & GuardianFlag.SESSION_OPEN
    assert r.on_tty(HelloAck(2, False, N), 1.2).daemon[-1].flags & GuardianFlag.VERSION_MISMATCH


def test_start_latched_blocks_motion_until_reset() -> None:
    r = GuardianRules(LIMITS, 0.0, start_latched=StopReason.PROTECTIVE)
    r.on_link(True, 0.0)
    r.on_tty(status(False), 0.0)
    assert r.on_daemon(position(), 0.0).tty == []
    r.on_daemon(GReset(), 0.0)
    r.on_daemon(Enable(True), 0.0)
    assert r.on_daemon(position(), 0.0).tty == [position()]


def at(t: float, cmd: Command | None = None) -> GAt:
    return GAt(round(t * 1e6), cmd or position())


def test_a_timed_command_goes_out_at_its_deadline_through_the_command_rules() -> None:
    r = up_rules()
    r.on_daemon(Enable(True), 0.0)
    assert r.on_daemon(at(0.002), 0.0001).tty == []
    assert r.next_deadline() == 0.002
    assert r.on_tick(0.0019).tty == []
    far = position((9.0, 9.0, 9.0, 9.0))
    assert r.on_tick(0.002).tty == [position()]  # at its deadline, not before
    assert r.counters["timed_released"] == 1 and r.counters["timed_late"] == 0
    assert r.next_deadline() > 0.002
    r.on_daemon(at(0.004, far), 0.0021)
    out = r.on_tick(0.004).tty
    assert len(out) == 1 and out[0] == LIMITS.clamp(far) != far  # clamped like any COMMAND
    assert r.state.deadman_hold is False and r.counters["clamped"] == 1


def test_a_timed_command_already_due_goes_out_at_once_and_counts_late() -> None:
    r = up_rules()
    r.on_daemon(Enable(True), 0.0)
    assert r.on_daemon(at(0.010), 0.0112).tty == [position()]
    assert r.counters["timed_late"] == 1
    assert abs(r.max_release_late_s - 0.0012) < 1e-9


def test_a_timed_command_further_ahead_than_the_deadman_is_refused() -> None:
    r = up_rules()
    r.on_daemon(Enable(True), 0.0)
    assert r.on_daemon(at(1.0 + DEADMAN + 0.001), 1.0).tty == []
    assert r.counters["timed_rejected"] == 1 and r.next_deadline() < 1.0 + DEADMAN
    r.on_daemon(at(1.0 + DEADMAN), 1.0)  # exactly the deadman ahead: accepted
    assert r.counters["timed_rejected"] == 1


def test_a_newer_timed_command_sends_the_waiting_one_first() -> None:
    """The daemon computes a frame only after the previous one's deadline: on its clock that
    one is due, even when the guardian's clock reads a few µs behind."""
    r = up_rules()
    r.on_daemon(Enable(True), 0.0)
    a, b = (position((x, 0.0, 0.0, 0.0)) for x in (0.1, 0.2))
    r.on_daemon(at(0.004, a), 0.001)
    assert r.on_daemon(at(0.006, b), 0.00399).tty == [a]
    assert r.on_tick(0.005).tty == []
    assert r.on_tick(0.006).tty == [b]
    assert r.counters["timed_released"] == 2


def test_nothing_computed_before_a_stop_goes_out_after_it() -> None:
    """A waiting G_AT is dropped by an e-stop edge, a STOP from the daemon, a link fault, an
    immediate COMMAND and the daemon's loss; a G_AT that moves is refused while latched."""
    for stop in ("edge", "daemon_stop", "link", "immediate", "daemon_lost"):
        r = up_rules()
        r.on_daemon(Enable(True), 0.0)
        r.on_daemon(at(0.002), 0.0)
        if stop == "edge":
            r.on_tty(EstopEdge(0, True), 0.001)
        elif stop == "daemon_stop":
            r.on_daemon(Stop(StopCategory.CAT2, StopReason.PROTECTIVE), 0.001)
        elif stop == "link":
            r.on_link(False, 0.001)
        elif stop == "immediate":
            assert r.on_daemon(LIMITS.hold(), 0.001).tty == [LIMITS.hold()]
        else:
            r.on_daemon_lost(0.001)
        assert not any(moving(m) for m in r.on_tick(0.002).tty), stop
        assert r.counters["timed_dropped"] == 1 and r.counters["timed_released"] == 0, stop
    r = up_rules()
    r.on_daemon(Stop(StopCategory.CAT0, StopReason.ESTOP_REMOTE), 0.0)
    r.on_daemon(at(0.002), 0.0)
    assert r.on_tick(0.002).tty == [] and r.counters["dropped_motion"] == 1
    r.on_daemon(at(0.004, LIMITS.hold()), 0.002)
    assert r.on_tick(0.004).tty == [LIMITS.hold()]  # a hold passes the latch


# --------------------------------------------------------------------------- state machine

finite_q = st.floats(-10, 10, allow_nan=False)
any_q = st.one_of(finite_q, st.just(math.nan), st.just(math.inf))


class GuardianMachine(RuleBasedStateMachine):
    """Random frames and time; the safety invariants must hold after every step."""

    def __init__(self) -> None:
        super().__init__()
        self.t = 0.0
        self.r = GuardianRules(LIMITS, 0.0, deadman_s=DEADMAN, hold_period_s=HOLD_PERIOD)
        self.link = False
        self.known_pressed = False  # what the frames have told the guardian since the link came up
        self.pressed = False  # the physical input
        self.last_cmd: float | None = None
        self.first_hold_after_cmd: float | None = None
        self.last_hold: float | None = None
        self.daemon_lost = False
        self.pending: float | None = None  # the deadline of the G_AT that may still go out
        self.cleared_at: float | None = None  # when a reset last cleared the latch
        self.fw_tripped = False  # the last STATUS showed DEADMAN_TRIPPED
        self.last_cmd_moved = False  # the last COMMAND that reached the rules asked for motion
        self.pending_moved = False  # ... and the G_AT waiting
        self.moved_at: float | None = None  # a COMMAND that moves reached the rules

    # every input goes through here
    def step(self, acts: Actions, latched_before: bool, need_enable_before: bool,
             reset: bool = False, released_before: int | None = None) -> Actions:
        if released_before is not None and self.r.counters["timed_released"] > released_before:
            # a G_AT went out: the one that waited, at or after its deadline, and nothing
            # dropped it (no latch, STOP, immediate COMMAND or daemon loss since it came)
            assert self.pending is not None and self.t >= self.pending - 2e-6
            self.pending = None
            self.last_cmd_moved = self.pending_moved
            self.moved_at = self.t if self.pending_moved else self.moved_at
            self.last_cmd = self.t
            self.first_hold_after_cmd = None
            self.last_hold = None
        if self.r.latched and not latched_before:
            self.pending = None  # every latch drops a waiting G_AT
        for m in acts.tty:
            if moving(m):
                assert not latched_before and not self.r.latched, f"motion while latched: {m}"
            if isinstance(m, Command) and m.moves:
                assert not need_enable_before, "motion after a clear without ENABLE(1)"
            if isinstance(m, Command):
                assert len(m.q) == N
                for v, lo, hi in zip(m.q, LIMITS.q_min, LIMITS.q_max, strict=True):
                    assert lo <= v <= hi
                assert 0.0 <= m.gripper_current_limit <= LIMITS.current_max_a
                if m == LIMITS.hold():
                    if self.last_cmd is not None and self.first_hold_after_cmd is None:
                        self.first_hold_after_cmd = self.t
                    self.last_hold = self.t
        if latched_before and not self.r.latched:
            self.cleared_at = self.t
            assert reset and not self.known_pressed and self.link, "latch cleared unsafely"
        return acts

    def feed_tty(self, msg: Message) -> Actions:
        lb, ne = self.r.latched, self.r.need_enable
        return self.step(self.r.on_tty(msg, self.t), lb, ne)

    def feed_daemon(self, msg: Message) -> Actions:
        lb, ne = self.r.latched, self.r.need_enable
        rel = self.r.counters["timed_released"]
        if isinstance(msg, GAt):
            due = msg.at_us / 1e6
            old_due = self.pending is not None
            new_due = self.t >= due - 2e-6
            acts = self.step(self.r.on_daemon(msg, self.t), lb, ne)
            # the waiting one goes out first; the new one at once if it came late, else it waits
            assert self.r.counters["timed_released"] - rel == old_due + new_due
            if old_due:
                self.last_cmd_moved = self.pending_moved
                self.moved_at = self.t if self.pending_moved else self.moved_at
            if new_due:
                self.last_cmd_moved = msg.cmd.moves
                self.moved_at = self.t if msg.cmd.moves else self.moved_at
            self.pending = None if new_due else due
            self.pending_moved = msg.cmd.moves
            if old_due or new_due:
                self.last_cmd = self.t
                self.first_hold_after_cmd = self.last_hold = None
            return acts
        if isinstance(msg, Command | Stop):
            self.pending = None
        acts = self.step(self.r.on_daemon(msg, self.t), lb, ne, reset=isinstance(msg, GReset),
                         released_before=rel)
        if isinstance(msg, Command):
            self.last_cmd = self.t
            self.last_cmd_moved = msg.moves
            if msg.moves:
                self.moved_at = self.t
            self.first_hold_after_cmd = None
            self.last_hold = None
        return acts

    @precondition(lambda self: self.link)
    @rule(via_edge=st.booleans())
    def press(self, via_edge: bool) -> None:
        edge = via_edge or not self.known_pressed or not self.r.latched
        self.pressed = True
        if edge:
            self.pending = None  # a latch drops a waiting G_AT, latched before or not
        acts = self.feed_tty(EstopEdge(0, True) if via_edge else status(True))
        self.known_pressed = True
        self.fw_tripped = self.fw_tripped and via_edge  # a STATUS without DEADMAN_TRIPPED
        if edge:
            assert acts.tty[:1] == [ESTOP_STOP], "a press edge without a stop frame"
        assert self.r.latched

    @precondition(lambda self: self.link)
    @rule(via_edge=st.booleans())
    def release(self, via_edge: bool) -> None:
        self.pressed = False
        self.feed_tty(EstopEdge(0, False) if via_edge else status(False))
        self.known_pressed = False
        self.fw_tripped = self.fw_tripped and via_edge

    @precondition(lambda self: self.link)
    @rule()
    def status_frame(self) -> None:
        if self.pressed and (not self.known_pressed or not self.r.latched):
            self.pending = None  # a press edge the guardian learns from STATUS: a latch
        self.feed_tty(status(self.pressed))
        self.known_pressed = self.pressed
        self.fw_tripped = False

    @rule()
    def link_down(self) -> None:
        self.pending = None
        self.r.on_link(False, self.t)
        self.link = False
        self.known_pressed = False
        self.fw_tripped = False
        assert self.r.latched

    @precondition(lambda self: not self.link)
    @rule()
    def link_up(self) -> None:
        self.r.on_link(True, self.t)
        self.link = True
        self.status_frame()

    @precondition(lambda self: not self.daemon_lost)
    @rule(mode=st.sampled_from(Mode), gmode=st.sampled_from(GripperMode),
          q=st.lists(any_q, min_size=N - 1, max_size=N + 1)
          | st.lists(finite_q, min_size=N, max_size=N),
          sp=st.floats(-100, 100), cur=st.floats(-5, 5))
    def command(self, mode: Mode, gmode: GripperMode, q: list[float], sp: float,
                cur: float) -> None:
        self.feed_daemon(Command(mode, tuple(q), gmode, sp, cur))

    @precondition(lambda self: not self.daemon_lost)
    @rule(mode=st.sampled_from(Mode), q=st.lists(finite_q, min_size=N, max_size=N),
          delay=st.floats(-0.005, 0.02))
    def timed_command(self, mode: Mode, q: list[float], delay: float) -> None:
        due = max(0.0, self.t + delay)
        self.feed_daemon(GAt(round(due * 1e6), Command(mode, tuple(q))))

    @precondition(lambda self: not self.daemon_lost)
    @rule(on=st.booleans())
    def enable(self, on: bool) -> None:
        self.feed_daemon(Enable(on))

    @precondition(lambda self: not self.daemon_lost)
    @rule(reason=st.sampled_from(StopReason), cat=st.sampled_from(StopCategory))
    def remote_stop(self, reason: StopReason, cat: StopCategory) -> None:
        stop = Stop(cat, reason)
        assert self.feed_daemon(stop).tty[:1] == [stop]
        assert self.r.latched

    @precondition(lambda self: not self.daemon_lost)
    @rule()
    def reset(self) -> None:
        was = self.r.latched
        acts = self.feed_daemon(GReset())
        if was and (self.known_pressed or not self.link):
            assert self.r.latched
            assert acts.daemon[-1].cause == StopReason.RESET_REFUSED

    @precondition(lambda self: not self.daemon_lost)
    @rule()
    def daemon_goes_away(self) -> None:
        self.daemon_lost = True
        self.pending = None
        lb, ne = self.r.latched, self.r.need_enable
        acts = self.step(self.r.on_daemon_lost(self.t), lb, ne)
        assert LIMITS.hold() in acts.tty

    @precondition(lambda self: self.link)
    @rule(via_event=st.booleans())
    def firmware_deadman(self, via_event: bool) -> None:
        """The firmware reports its deadman tripped (the guardian was too slow)."""
        # a latch drops a waiting G_AT: a trip that interrupts motion, or a press seen here
        if ((via_event or not self.fw_tripped) and self.last_cmd_moved) or (
                not via_event and self.pressed
                and (not self.known_pressed or not self.r.latched)):
            self.pending = None
        self.feed_tty(Event(0, EventCode.DEADMAN_TRIP, 100) if via_event
                      else Status(0, StatusFlag.DEADMAN_TRIPPED | (
                          StatusFlag.ESTOP_INPUT if self.pressed else StatusFlag(0)),
                          0, Z, Z, Z, 0.0, 0.0, 0.0))
        edge = via_event or not self.fw_tripped
        self.known_pressed = self.known_pressed or self.pressed
        self.fw_tripped = self.fw_tripped or not via_event
        if edge and self.last_cmd_moved:  # a flag still set is no new trip (a reset must pass)
            assert self.r.latched and self.r.state.cause in (
                StopReason.DEADMAN, StopReason.ESTOP_INPUT, self.r.cause)

    @precondition(lambda self: not self.daemon_lost)
    @rule(dt=st.floats(DEADMAN * 1.01, 2.0),
          first=st.sampled_from(("tick", "status", "hold", "position")))
    def guardian_stalls(self, dt: float, first: str) -> None:
        """This process does not run for `dt` (no ticks: SIGSTOP), then one input and a tick.
        When the stream moved within a deadman time before the gap, the deadman trips first:
        nothing read after the gap moves, whatever comes first (a queued HOLD included)."""
        moved = self.moved_at is not None and self.moved_at >= self.t - DEADMAN
        self.t += dt
        self.pending = None if moved else self.pending
        if first == "status" and self.link:
            self.status_frame()
        elif first in ("hold", "position"):
            acts = self.feed_daemon(LIMITS.hold() if first == "hold" else position())
            assert not (moved and any(moving(m) for m in acts.tty)), "motion after a stall"
        else:  # a tick (or no link: no STATUS comes, the loop's timer ticks)
            self.tick()
        if moved:
            assert self.r.latched and self.r.state.cause in (
                StopReason.DEADMAN, StopReason.ESTOP_INPUT, self.r.cause)
        self.last_cmd = None  # the hold stream's timing assumes a loop that ticked meanwhile
        self.tick()

    @rule(dt=st.floats(0.0, 0.3))
    def advance(self, dt: float) -> None:
        """Time passes; the caller ticks at every deadline the rules ask for, as the loop does."""
        target = self.t + dt
        while self.r.next_deadline() <= target:
            self.t = max(self.t, self.r.next_deadline())
            self.tick()
        self.t = target
        self.tick()

    def tick(self) -> None:
        lb, ne = self.r.latched, self.r.need_enable
        rel = self.r.counters["timed_released"]
        self.step(self.r.on_tick(self.t), lb, ne, released_before=rel)

    @invariant()
    def a_silent_stream_ends_in_a_hold_within_the_deadman_time(self) -> None:
        if self.last_cmd is not None and self.t - self.last_cmd >= DEADMAN:
            assert self.r.state.deadman_hold
            if not self.last_cmd_moved:
                return  # a silence inside a hold stream only holds
            # latched at the trip; only a reset since then (G_RESET, not a COMMAND) clears it
            tripped_at = self.last_cmd + DEADMAN
            assert self.r.latched or (self.cleared_at is not None
                                      and self.cleared_at >= tripped_at - 1e-9), (
                "a deadman trip that does not latch")
            assert self.first_hold_after_cmd is not None
            assert self.first_hold_after_cmd <= self.last_cmd + DEADMAN + 1e-9
            assert self.last_hold is not None and self.t - self.last_hold < HOLD_PERIOD + 1e-9

    @invariant()
    def a_timed_command_is_never_held_past_its_deadline(self) -> None:
        if self.pending is not None:
            assert self.r.next_deadline() <= self.pending

    @invariant()
    def the_latch_holds_while_the_input_is_known_active(self) -> None:
        if self.known_pressed:
            assert self.r.latched


GuardianMachine.TestCase.settings = settings(max_examples=EXAMPLES, stateful_step_count=60,
                                             deadline=None)
TestGuardianRules = GuardianMachine.TestCase

"""The stop model in the executor: latched → HOLD only; reset → no motion until a new command;
controlled hold keeps the grip; resume rechecks preconditions; collision and jog loss trip."""

from __future__ import annotations

from executor_fake import Bench
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from edge_agent.executor.tasks import State
from edge_agent.link.codec import Command, GripperMode, Mode
from edge_agent.vocab import StopCause


def _still(cmd: Command) -> bool:
    return cmd.mode == Mode.HOLD and cmd.gripper_mode == GripperMode.HOLD


def _in_lift(b: Bench) -> None:
    b.start()
    assert b.run_until(lambda: b.ex.state is State.LIFT, 20.0)
    b.step(20)


def test_latched_estop_sends_only_hold_and_freezes_the_task() -> None:
    b = Bench()
    b.start()
    b.step(100)
    assert b.ex.state is State.APPROACH
    b.latch.trip(StopCause.ESTOP_MQTT, b.now)
    n = len(b.commands)
    b.step(200)
    assert all(_still(c) for _, c in b.commands[n:])
    assert b.ex.mode == "estop"
    assert b.of("task_frozen")[0]["state"] == "approach"
    assert b.ex.saved_task is not None and b.done() is None
    # Commands are refused while latched.
    assert b.ex.start_task(b.now, "t2").code == "estop_active"
    assert b.ex.resume(b.now).code == "estop_active"
    assert b.ex.manual_enter(b.now).code == "estop_active"


def test_after_reset_nothing_moves_until_resume_which_starts_from_the_measured_pose() -> None:
    b = Bench()
    b.start()
    b.step(100)
    b.latch.trip(StopCause.DEADMAN, b.now)
    b.step(10)
    assert b.ex.mode == "protective_stop"
    b.arm.q[0] += 0.05  # the arm was pushed while stopped: the old setpoint is stale
    assert b.ex.reset(b.now).ok
    assert b.ex.mode == "holding"
    n = len(b.commands)
    b.step(300)
    assert all(_still(c) for _, c in b.commands[n:])
    assert b.ex.resume(b.now, "t1").ok
    measured = list(b.arm.q)
    cmd = b.step()
    assert cmd.mode == Mode.POSITION
    limits = [j.velocity_max_rad_s * b.dt for j in b.robot.joints]
    assert all(abs(c - m) <= lim + 1e-9 for c, m, lim in zip(cmd.q, measured, limits, strict=True))
    assert b.run_until(lambda: b.done() is not None, 40.0)
    assert b.outcome() == "success"


def test_reset_without_a_saved_task_goes_idle_and_stays_still() -> None:
    b = Bench()
    b.step(10)
    b.latch.trip(StopCause.ESTOP_LOCAL, b.now)
    b.step(10)
    assert b.ex.reset(b.now).ok and b.ex.mode == "idle"
    n = len(b.commands)
    b.step(200)
    assert all(_still(c) for _, c in b.commands[n:])


def test_reset_is_refused_while_the_input_is_active_or_the_cause_present() -> None:
    b = Bench()
    b.step(5)
    b.latch.set_hardware_input(True, b.now)
    r = b.ex.reset(b.now)
    assert not r.ok and r.code == "estop_active" and b.ex.mode == "estop"
    b.latch.set_hardware_input(False, b.now)
    b.latch.set_condition(StopCause.LINK_FAULT, True, b.now)
    r = b.ex.reset(b.now)
    assert not r.ok and r.code == "cause_present"
    b.latch.set_condition(StopCause.LINK_FAULT, False, b.now)
    assert b.ex.reset(b.now).ok


def test_cancel_is_a_controlled_hold_that_keeps_the_grip() -> None:
    b = Bench()
    _in_lift(b)
    force = b.arm.force
    assert force > 8.0
    r = b.ex.cancel(b.now)
    b.events += b.ex.drain_events()
    assert r.ok and b.outcome() == "aborted"
    n = len(b.commands)
    b.step(100)
    assert all(_still(c) for _, c in b.commands[n:])
    assert b.arm.force == force and b.ex.mode == "holding"


def test_resume_fails_the_task_when_the_part_is_no_longer_gripped() -> None:
    b = Bench()
    _in_lift(b)
    b.latch.trip(StopCause.ESTOP_MQTT, b.now)
    b.step(5)
    b.arm.force = 0.0  # the part slipped out during the stop
    b.step(5)
    assert b.ex.reset(b.now).ok and b.ex.mode == "holding"
    r = b.ex.resume(b.now)
    b.events += b.ex.drain_events()
    assert not r.ok and r.code == "refused"
    done = b.done()
    assert done is not None and done["outcome"] == "failed"
    assert b.ex.resume(b.now).code == "nothing_to_resume"
    assert _still(b.step())


def test_resume_while_carrying_keeps_the_grip_and_completes() -> None:
    b = Bench(weak=0.5)  # a weak gripper: dropping back to the bare setpoint would loosen it
    _in_lift(b)
    b.latch.trip(StopCause.ESTOP_MQTT, b.now)
    b.step(10)
    held = b.arm.force
    assert b.ex.reset(b.now).ok
    assert b.ex.resume(b.now).ok
    b.step(40)
    assert b.arm.force >= 0.9 * held
    assert b.run_until(lambda: b.done() is not None, 40.0)
    assert b.outcome() == "success"


def test_no_resume_after_an_unclean_restart_or_manual_mode() -> None:
    b = Bench()
    _in_lift(b)
    b.latch.trip(StopCause.ESTOP_MQTT, b.now)
    b.step(5)
    snap = b.ex.to_snapshot()
    assert snap["saved_task"] is not None
    for clean in (False, True):
        b2 = Bench()
        b2.ex.restore(snap, 0.0, clean=clean)
        b2.step(3)
        assert (b2.ex.saved_task is not None) is clean
    assert b.ex.reset(b.now).ok and b.ex.manual_enter(b.now).ok
    b.events += b.ex.drain_events()
    assert b.outcome() == "aborted"
    assert b.ex.manual_exit(b.now).ok
    assert b.ex.resume(b.now).code == "nothing_to_resume"


def test_collision_current_trips_a_protective_stop() -> None:
    b = Bench()
    b.start()
    b.step(50)
    b.arm.extra_current = 5.0  # base joint: 6 A, far above its expected ~1 A
    b.step(10)
    assert b.ex.mode == "protective_stop"
    assert StopCause.COLLISION in b.latch.state.causes
    assert b.of("collision")[0]["joint"] == "base_yaw"
    assert _still(b.commands[-1][1])


def test_jog_is_slow_a_deadman_and_refused_while_predicted() -> None:
    b = Bench()
    b.step(5)
    assert b.ex.manual_jog(b.now, [0.1, 0, 0, 0], 100).code == "not_admitted"
    assert b.ex.manual_enter(b.now).ok and b.ex.mode == "manual"
    assert b.ex.manual_jog(b.now, [0.1, 0, 0, 0], 500).code == "bad_args"
    assert b.ex.manual_jog(b.now, [5.0, 0, 0, 0], 100).ok
    q0 = b.arm.q[0]
    cmd = b.step(10)
    assert cmd.mode == Mode.POSITION and cmd.gripper_mode == GripperMode.HOLD
    speed = (b.arm.q[0] - q0) / (10 * b.dt)
    assert 0 < speed <= 0.25 * b.robot.joints[0].velocity_max_rad_s + 1e-6
    b.step(30)  # ttl 100 ms ran out while moving: the stream is lost
    assert b.ex.mode == "protective_stop"
    assert StopCause.JOG_LOST in b.latch.state.causes and _still(b.commands[-1][1])
    assert b.ex.reset(b.now).ok and b.ex.mode == "idle"  # manual mode ended with the stop
    assert b.ex.manual_enter(b.now).ok
    b.arm.predicted = True
    b.step()
    assert b.ex.manual_jog(b.now, [0.1, 0, 0, 0], 100).code == "refused"
    b.arm.predicted = False
    b.step()
    assert b.ex.manual_jog(b.now, [0.0, 0.0, 0.02], 100, frame="cartesian").ok
    z0 = b.arm.kin.forward(b.arm.q)[2]
    b.step(15)
    assert b.arm.kin.forward(b.arm.q)[2] > z0
    assert b.ex.manual_exit(b.now).ok and b.ex.mode == "idle"


class StopModel(RuleBasedStateMachine):
    """Random commands, ticks, trips and resets: never motion while latched; a reset alone
    never moves the robot (only start/resume/jog permit motion again)."""

    def __init__(self) -> None:
        super().__init__()
        self.b = Bench()
        self.b.step(5)
        self.permitted = False  # a command since the last latch change allows motion
        self.gen = self.b.latch.state.generation

    def _watch_latch(self) -> None:
        if self.b.latch.state.generation != self.gen:
            self.gen = self.b.latch.state.generation
            self.permitted = False

    @rule(n=st.integers(1, 60))
    def tick(self, n: int) -> None:
        for _ in range(n):
            cmd = self.b.step()
            self._watch_latch()
            if self.b.latch.state.latched or not self.permitted:
                assert _still(cmd), (cmd, self.b.ex.mode)

    @rule(cause=st.sampled_from([StopCause.ESTOP_MQTT, StopCause.DEADMAN,
                                 StopCause.LINK_FAULT, StopCause.ESTOP_INPUT]),
          n=st.integers(0, 20))
    def trip(self, cause: StopCause, n: int) -> None:
        if cause is StopCause.ESTOP_INPUT:
            self.b.latch.set_hardware_input(True, self.b.now)
        else:
            self.b.latch.trip(cause, self.b.now)
        self._watch_latch()
        self.tick(n)

    @rule(n=st.integers(0, 60))
    def release_and_reset(self, n: int) -> None:
        self.b.latch.set_hardware_input(False, self.b.now)
        self.b.ex.reset(self.b.now)
        self._watch_latch()
        self.tick(n)

    @rule(n=st.integers(0, 80))
    def start(self, n: int) -> None:
        if self.b.ex.start_task(self.b.now, f"t{self.b.now}").ok:
            self.permitted = True
            self.tick(n)

    @rule()
    def cancel(self) -> None:
        self.b.ex.cancel(self.b.now)

    @rule()
    def resume(self) -> None:
        if self.b.ex.resume(self.b.now).ok:
            self.permitted = True

    @rule(v=st.floats(-0.5, 0.5))
    def jog(self, v: float) -> None:
        self.b.ex.manual_enter(self.b.now)
        if self.b.ex.manual_jog(self.b.now, [v, 0.0, 0.0, 0.0], 100).ok:
            self.permitted = True
        self._watch_latch()

    @rule()
    def manual_exit(self) -> None:
        self.b.ex.manual_exit(self.b.now)

    @invariant()
    def mode_matches_latch(self) -> None:
        kind = self.b.latch.state.kind
        if kind is not None:
            assert self.b.ex.mode == kind.value


TestStopModel = StopModel.TestCase
TestStopModel.settings = settings(max_examples=60, stateful_step_count=20, deadline=None)


def test_a_new_task_is_refused_while_a_part_is_held_in_the_air() -> None:
    b = Bench()
    _in_lift(b)
    b.step(150)  # well above the table now
    assert b.ex.cancel(b.now).ok and b.ex.mode == "holding"
    r = b.ex.start_task(b.now, "t2")
    assert not r.ok and r.code == "refused"


def test_stale_joint_readings_mean_hold_not_motion() -> None:
    b = Bench()
    b.start()
    b.step(50)
    b.arm.stale = True
    n = len(b.commands)
    b.step(20)
    assert all(_still(c) for _, c in b.commands[n:])
    assert b.ex.counters.no_measurement == 20
    b.arm.stale = False
    assert b.step().mode == Mode.POSITION  # the task goes on once the readings are back

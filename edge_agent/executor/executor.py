"""The executor: pure `tick(now, snapshot) -> Command`, the stop model, and the operator commands.

Pure: every method takes `now` explicitly; no threads, no I/O, no sleeping — the daemon's control
thread and the lock-step runner run the same code. Not thread-safe: the daemon serialises
`tick()` and the command methods (one lock, held for one tick's ~0.1 ms). The running task's
attempts, controllers and decisions are the `TaskDriver`'s (driver.py), which the executor owns.

Stop model (DESIGN.md): the `StopLatch` is the truth. While it is latched every tick returns
`Command(HOLD, gripper HOLD)` — never a position setpoint, never a gripper motion — and a running
task is frozen and saved. Any latch change (`generation`) discards every setpoint, controller
and jog; after a reset the machine is in `holding` (task saved: `resume` possible), back in
`diagnostic`, or `idle`, and nothing moves until a new command. A collision (joint current)
trips the latch itself; so does a jog stream lost while moving; a sensor lost past its bound
trips `sensor_bound` (conditions.py), and both stay present — a reset refused — while the sensor
is lost or the overcurrent lasts.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from edge_agent.executor.conditions import StopConditions
from edge_agent.executor.context import DecisionRecord, Event, EventLog, TickInputs
from edge_agent.executor.controllers import Measured, Vec3, measure
from edge_agent.executor.driver import TaskDriver
from edge_agent.executor.faults import FaultPolicy, FaultRecord
from edge_agent.executor.kinematics import ArmKinematics, IKFailure
from edge_agent.executor.latch import ResetRefused, StopLatch
from edge_agent.executor.machine import Trigger, is_motion, mode_of
from edge_agent.executor.manual import JogController
from edge_agent.executor.manual_commands import ManualCommands
from edge_agent.executor.monitor import CollisionMonitor, SensorRing
from edge_agent.executor.paths import task_points
from edge_agent.executor.policy import ExpertPolicy
from edge_agent.executor.records import (
    CommandResult,
    Counters,
    ExecutorSnapshot,
    Outcome,
    TaskProgress,
    vec3,
)
from edge_agent.executor.tasks import TASKS, ExecutorConfig, State
from edge_agent.link.codec import Command
from edge_agent.policy_seam import Policy
from edge_agent.robot import RobotDescription
from edge_agent.sensors.readings import Snapshot, Source
from edge_agent.vocab import ErrorCode, EventType, StopCause, StopKind
from edge_agent.vocab import Mode as ExecMode

if TYPE_CHECKING:
    from edge_agent.contract.status_parts import ExecutorStatus, TaskInfo

SNAPSHOT_VERSION = 1
_MAX_DT = 0.1  # a longer gap between ticks is integrated as this (no giant PID steps)


class Executor(ManualCommands):
    """Runs pick-and-place tasks under the stop latch; see the module doc."""

    def __init__(self, robot: RobotDescription, latch: StopLatch, policy: Policy | None = None,
                 config: ExecutorConfig | None = None, *,
                 decision_sink: Callable[[DecisionRecord], None] | None = None) -> None:
        cfg = (config or ExecutorConfig()).check()
        self.robot = robot
        self.kin = ArmKinematics.of(robot)
        self.cfg = cfg
        self.latch = latch
        self.counters = Counters()
        self._in = TickInputs(SensorRing(cfg.diagnostic_window_s, cfg.diagnostic_sample_hz))
        self._events = EventLog(self._in)
        self._driver = TaskDriver(robot, self.kin, cfg,
                                  policy or ExpertPolicy(band_n=cfg.grip_force_band_n),
                                  self._in, self._events, self.counters, decision_sink)
        self._machine = self._driver.machine
        self.faults: FaultPolicy = self._driver.faults  # L1/L2/L3 budgets, the L3 count
        self._gen = -1  # the first tick syncs with whatever the latch says
        self._monitor = CollisionMonitor(robot, cfg.collision_current_factor,
                                         cfg.collision_floor_fraction,
                                         cfg.collision_baseline_tau_s, cfg.collision_persist_s)
        self._jog = JogController(robot, self.kin, cfg.manual_speed_fraction,
                                  cfg.manual_cartesian_speed_m_s)
        self._conditions = StopConditions(robot, latch, self._events.emit)
        self._ticked = False

    # -- reading -------------------------------------------------------------------------
    @property
    def policy(self) -> Policy:
        return self._driver.decisions.policy

    @policy.setter
    def policy(self, policy: Policy) -> None:
        """Swap the policy (the daemon, once its router is ready); the next decision asks it."""
        self._driver.decisions.policy = policy

    @property
    def fault_record(self) -> FaultRecord | None:
        """The last L3 diagnosis (kept until the next)."""
        return self._driver.fault_record

    @property
    def on_fault_record(self) -> Callable[[FaultRecord], None] | None:
        return self._driver.on_fault_record

    @on_fault_record.setter
    def on_fault_record(self, fn: Callable[[FaultRecord], None] | None) -> None:
        """Called with each new fault record on the control thread (it must only enqueue)."""
        self._driver.on_fault_record = fn

    @property
    def state(self) -> State:
        return self._machine.state

    @property
    def mode(self) -> ExecMode:
        """The externally visible mode (`state.mode`, the admission matrix's column)."""
        return self.mode_at(self.latch.state.kind)

    def mode_at(self, stop: StopKind | None) -> ExecMode:
        """The mode under the latch state `stop` that the caller read: a `state` message built
        from one latch read never says protective_stop without its `stop` (a trip between two
        reads of the latch did, 12-07 CI)."""
        return mode_of(stop, self._machine.state, self._driver.has_saved_task())

    @property
    def has_measurement(self) -> bool:
        """A usable joint measurement has been seen (a task can be planned from it)."""
        return self._in.measured is not None

    @property
    def saved_task(self) -> TaskInfo | None:
        task = self._driver.task
        return task.as_dict() if task is not None and self._driver.has_saved_task() else None

    @property
    def task(self) -> TaskInfo | None:
        task = self._driver.task
        return task.as_dict() if task is not None else None

    @property
    def object_estimate(self) -> Vec3 | None:
        """The camera's object pose now (`ObjectEstimate.current`: measured or predicted)."""
        return self._in.object.current()

    @property
    def object_samples(self) -> int:
        return self._in.object.samples

    def status(self) -> ExecutorStatus:
        return {"mode": self.mode, "state": self.state.value, "task": self.task,
                "saved": self._driver.has_saved_task(), "l3_count": self.faults.l3_count,
                "counters": self.counters.as_dict()}

    def drain_events(self) -> list[Event]:
        """Events since the last call, oldest first (task_done, attempt_failed, ...)."""
        return self._events.drain()

    def sensor_snapshot(self) -> tuple[tuple[float, Measured], ...]:
        """The ring's samples as they are: cheap, for a stop listener (`window_of` converts)."""
        return self._in.ring.snapshot()

    # -- the tick ------------------------------------------------------------------------
    def tick(self, now: float, snapshot: Snapshot) -> Command:
        """One control period: the command frame to send now."""
        inp = self._in
        dt = min(max(now - inp.now, 0.0), _MAX_DT) if self._ticked else 0.0
        self._ticked = True
        inp.now = now
        self.counters.ticks += 1
        m = measure(self.kin, snapshot)
        if m is not None:
            inp.measured = m
            inp.ring.add(now, m)
        else:
            self.counters.no_measurement += 1
        pose = snapshot.object_pose
        if pose is not None and pose.source is Source.MEASURED:
            inp.object.add(pose.value, pose.t_fw, pose.t_host)
        inp.object.predicted = pose.value if pose and pose.source is Source.PREDICTED else None
        inp.predicted = snapshot.q_source is Source.PREDICTED
        self._conditions.update(now, snapshot)  # sensor_bound, a collision's overcurrent
        ls = self.latch.state
        if ls.generation != self._gen:
            self._sync_latch(now)
        if ls.kind is not None or m is None:
            return self._driver.hold()
        joint = self._monitor.update(now, m.current, dt)
        if joint is not None:
            self.counters.collisions += 1
            self._events.emit({"type": EventType.COLLISION, "detail": self._monitor.last_trip,
                               "joint": self.robot.joints[joint].name})
            self.latch.trip(StopCause.COLLISION, now)
            self._sync_latch(now)
            return self._driver.hold()
        st = self._machine.state
        if st is State.MANUAL:
            cmd = self._manual_tick(now, m, dt)
        elif is_motion(st):
            cmd = self._driver.tick(now, m, dt)
        else:
            return self._driver.hold()
        # A trip from another thread during this tick: never send its motion.
        return cmd if self.latch.state.generation == self._gen else self._driver.hold()

    def _sync_latch(self, now: float) -> None:
        """The latch changed: drop every setpoint; freeze a running task; follow the latch.

        Any change counts, even a trip and a reset that both happened between two ticks: a
        running task is frozen and saved either way, and nothing moves until a new command.
        """
        ls = self.latch.state
        self._gen = ls.generation
        self._in.now = max(self._in.now, now)
        fsm = self._machine
        before = fsm.state
        self._driver.freeze(before, ls.kind, ls.first_cause)
        self._jog.stop()
        self._monitor.reset()
        if ls.kind is not None:
            fsm.fire(Trigger.ESTOP if ls.kind is StopKind.ESTOP else Trigger.PROTECTIVE_STOP)
        elif is_motion(before):
            fsm.fire(Trigger.HOLD)
        elif before is State.MANUAL:
            fsm.fire(Trigger.MANUAL_EXIT)
        else:
            fsm.fire(Trigger.REARM)
        if fsm.state is not before:
            self._mode_changed()

    def _mode_changed(self) -> None:
        self._events.emit({"type": EventType.MODE_CHANGED, "mode": self.mode, "state": self.state})

    # -- commands ------------------------------------------------------------------------
    def _pre(self, now: float) -> None:
        """Every command first catches up with the latch (a trip since the last tick)."""
        self._in.now = max(self._in.now, now)
        if self.latch.state.generation != self._gen:
            self._sync_latch(now)

    def _refuse_by_mode(self, command: str) -> CommandResult | None:
        mode = self.mode
        if mode == ExecMode.ESTOP:
            return CommandResult.refuse(ErrorCode.ESTOP_ACTIVE, f"{command}: e-stop latched")
        if mode == ExecMode.PROTECTIVE_STOP:
            return CommandResult.refuse(ErrorCode.NOT_ADMITTED,
                                        f"{command}: protective stop latched; reset first")
        if mode == ExecMode.RUNNING:
            return CommandResult.refuse(ErrorCode.BUSY, f"{command}: a task is running")
        return None

    def start_task(self, now: float, task_id: str, task: str = "pick_place",
                   object_xyz: Sequence[float] | None = None,
                   place_xyz: Sequence[float] | None = None) -> CommandResult:
        """Start a task (idle or holding); the object defaults to the camera's estimate."""
        self._pre(now)
        refused = self._refuse_by_mode("task.start")
        if refused is not None:
            return refused
        if self.mode in (ExecMode.DIAGNOSTIC, ExecMode.MANUAL):
            return CommandResult.refuse(ErrorCode.NOT_ADMITTED,
                                        f"task.start refused in {self.mode}")
        spec = TASKS.get(task)
        if spec is None:
            return CommandResult.refuse(ErrorCode.BAD_ARGS, f"unknown task {task!r}")
        m = self._in.measured
        if m is None:
            return CommandResult.refuse(ErrorCode.REFUSED, "no joint measurement yet")
        if (m.gripper_force >= self.cfg.part_lost_force_n
                and m.tool[2] - self.robot.table_z_m > self.cfg.approach_clearance_m):
            # The approach opens the gripper: that would drop a part held up in the air.
            return CommandResult.refuse(ErrorCode.REFUSED, "a part is held above the table; "
                                        "set it down (manual mode) first")
        try:
            obj = vec3(object_xyz) if object_xyz is not None else self._in.object.current()
            if obj is None:
                return CommandResult.refuse(ErrorCode.REFUSED,
                                            "no object pose: no camera estimate, none given")
            place = (vec3(place_xyz) if place_xyz is not None
                     else (*self.cfg.default_place_xy_m, obj[2]))
        except (TypeError, ValueError) as exc:
            return CommandResult.refuse(ErrorCode.BAD_ARGS, f"object/place: {exc}")
        for pt in task_points(spec, obj, place, self.cfg):
            sol = self.kin.inverse(pt, q_seed=m.q)
            if isinstance(sol, IKFailure):
                return CommandResult.refuse(ErrorCode(sol.reason.value), sol.message)
        self._driver.start(now, m, TaskProgress(task_id, spec, obj, place, now))
        return CommandResult.accept(task_id=task_id, object=list(obj), place=list(place))

    def cancel(self, now: float) -> CommandResult:
        """task.cancel: a running task → controlled hold (aborted); a saved task is dropped."""
        self._pre(now)
        if self.mode == ExecMode.MANUAL:
            return CommandResult.refuse(ErrorCode.NOT_ADMITTED, "task.cancel: use manual.exit")
        task = self._driver.task
        if task is None:
            return CommandResult.accept("no task")
        trigger = Trigger.HOLD if is_motion(self._machine.state) else None
        self._driver.end(now, Outcome.ABORTED, "cancelled", trigger)
        return CommandResult.accept(task_id=task.task_id)

    def resume(self, now: float, task_id: str | None = None) -> CommandResult:
        """Resume the saved task from the measured pose, if its preconditions still hold."""
        self._pre(now)
        refused = self._refuse_by_mode("resume")
        if refused is not None:
            return refused
        task = self._driver.task
        if (self.mode != ExecMode.HOLDING or task is None or not self._driver.has_saved_task()
                or task.state is None):
            return CommandResult.refuse(ErrorCode.NOTHING_TO_RESUME, "no saved task to resume")
        if task_id is not None and task_id != task.task_id:
            return CommandResult.refuse(ErrorCode.NOTHING_TO_RESUME,
                                        f"the saved task is {task.task_id}, not {task_id}")
        state = task.state
        if not self._driver.resume(now, self._in.measured):
            return CommandResult.refuse(ErrorCode.REFUSED,
                                        f"precondition of {state.value} failed; task failed")
        return CommandResult.accept(task_id=task.task_id, state=state.value)

    def reset(self, now: float) -> CommandResult:
        """Reset the latch (if allowed), or leave diagnostic; never moves the robot."""
        self._pre(now)
        if self.latch.state.latched:
            try:
                self.latch.reset(now)
            except ResetRefused as exc:
                return CommandResult.refuse(ErrorCode(exc.code), exc.message)
            self._sync_latch(now)
            return CommandResult.accept(mode=self.mode)
        if self._machine.state is State.DIAGNOSTIC:
            self._driver.leave_diagnostic()
            self._mode_changed()
            return CommandResult.accept(mode=self.mode)
        if self.mode == ExecMode.MANUAL:
            return CommandResult.refuse(ErrorCode.NOT_ADMITTED, "reset: use manual.exit")
        return CommandResult.accept("nothing latched", mode=self.mode)

    # -- persistence ---------------------------------------------------------------------
    def to_snapshot(self) -> ExecutorSnapshot:
        """What must survive a restart: the L3 count, diagnostic, the saved task."""
        return {"v": SNAPSHOT_VERSION, "faults": self.faults.to_dict(),
                "diagnostic": self._driver.was_diagnostic(), "fault_record": self.fault_record,
                "saved_task": self.saved_task}

    def restore(self, data: Mapping[str, Any], now: float, *, clean: bool) -> None:
        """Restore a snapshot before the first tick; `clean=False` (unclean restart) drops the
        saved task: no resume after an unclean restart."""
        self._driver.restore(data, now, clean=clean)

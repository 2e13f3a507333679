"""The executor: pure `tick(now, snapshot) -> Command`, the stop model, and the operator commands.

Pure: every method takes `now` explicitly; no threads, no I/O, no sleeping — the daemon's control
thread and the lock-step runner run the same code. Not thread-safe: the daemon serialises
`tick()` and the command methods (one lock, held for one tick's ~0.1 ms).

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
from typing import Any

from edge_agent.executor.conditions import StopConditions
from edge_agent.executor.controllers import GripController, Measured, Vec3, measure
from edge_agent.executor.kinematics import IKFailure
from edge_agent.executor.latch import ResetRefused, StopLatch
from edge_agent.executor.machine import Trigger, is_motion
from edge_agent.executor.manual import JogController, JogFrame
from edge_agent.executor.monitor import CollisionMonitor
from edge_agent.executor.paths import task_points
from edge_agent.executor.policy import ExpertPolicy
from edge_agent.executor.records import CommandResult, Outcome, TaskRun, vec3
from edge_agent.executor.run import Event, TaskRunner
from edge_agent.executor.tasks import TASKS, ExecutorConfig, GripperAction, State
from edge_agent.link.codec import Command, GripperMode, Mode
from edge_agent.policy_seam import Policy
from edge_agent.robot import RobotDescription
from edge_agent.sensors.readings import Snapshot, Source
from edge_agent.vocab import ErrorCode, EventType, StopCause, StopKind
from edge_agent.vocab import Mode as ExecMode

SNAPSHOT_VERSION = 1
_MAX_DT = 0.1  # a longer gap between ticks is integrated as this (no giant PID steps)


class Executor(TaskRunner):
    """Runs pick-and-place tasks under the stop latch; see the module doc."""

    def __init__(self, robot: RobotDescription, latch: StopLatch, policy: Policy | None = None,
                 config: ExecutorConfig | None = None, *,
                 decision_sink: Callable[[Event], None] | None = None) -> None:
        cfg = (config or ExecutorConfig()).check()
        super().__init__(robot, policy or ExpertPolicy(band_n=cfg.grip_force_band_n), cfg,
                         decision_sink)
        self.latch = latch
        self._gen = -1  # the first tick syncs with whatever the latch says
        self._monitor = CollisionMonitor(robot, cfg.collision_current_factor,
                                         cfg.collision_floor_fraction,
                                         cfg.collision_baseline_tau_s, cfg.collision_persist_s)
        self._jog = JogController(robot, self.kin, cfg.manual_speed_fraction,
                                  cfg.manual_cartesian_speed_m_s)
        self._conditions = StopConditions(robot, latch, self._emit)
        self._ticked = False

    # -- reading -------------------------------------------------------------------------
    @property
    def state(self) -> State:
        return self._fsm.state

    @property
    def mode(self) -> ExecMode:
        """The externally visible mode (`state.mode`, the admission matrix's column)."""
        kind = self.latch.state.kind
        if kind is StopKind.ESTOP:
            return ExecMode.ESTOP
        if kind is StopKind.PROTECTIVE:
            return ExecMode.PROTECTIVE_STOP
        st = self._fsm.state
        if is_motion(st):
            return ExecMode.RUNNING
        if st in (State.ESTOP, State.PROTECTIVE_STOP):  # reset, not yet ticked
            return ExecMode.HOLDING if self.has_saved_task() else ExecMode.IDLE
        return ExecMode(st.value)

    @property
    def has_measurement(self) -> bool:
        """A usable joint measurement has been seen (a task can be planned from it)."""
        return self._last is not None

    @property
    def saved_task(self) -> dict[str, Any] | None:
        return self._run.as_dict() if self._run is not None and self._saved else None

    @property
    def task(self) -> dict[str, Any] | None:
        return self._run.as_dict() if self._run is not None else None

    @property
    def object_estimate(self) -> Vec3 | None:
        """The camera's object pose averaged over its last distinct samples."""
        return self._object.estimate()

    @property
    def object_samples(self) -> int:
        return self._object.samples

    def status(self) -> dict[str, Any]:
        return {"mode": self.mode, "state": self.state.value, "task": self.task,
                "saved": self._saved, "l3_count": self.faults.l3_count,
                "counters": self.counters.as_dict()}

    def sensor_window(self) -> dict[str, Any]:
        """The last seconds of raw measurements (the diagnostic window's ring) as plain data."""
        return self._ring.window()

    def sensor_snapshot(self) -> tuple[Any, ...]:
        """The ring's samples as they are: cheap, for a stop listener (`window_of` converts)."""
        return self._ring.snapshot()

    # -- the tick ------------------------------------------------------------------------
    def tick(self, now: float, snapshot: Snapshot) -> Command:
        """One control period: the command frame to send now."""
        dt = min(max(now - self._now, 0.0), _MAX_DT) if self._ticked else 0.0
        self._ticked = True
        self._now = now
        self.counters.ticks += 1
        m = measure(self.kin, snapshot)
        if m is not None:
            self._last = m
            self._ring.add(now, m)
        else:
            self.counters.no_measurement += 1
        pose = snapshot.object_pose
        if pose is not None and pose.source is Source.MEASURED:
            self._object.add(pose.value, pose.t_fw, pose.t_host)
        self._predicted = snapshot.q_source is Source.PREDICTED
        self._conditions.update(now, snapshot)  # sensor_bound, a collision's overcurrent
        ls = self.latch.state
        if ls.generation != self._gen:
            self._sync_latch(now)
        if ls.kind is not None or m is None:
            return self._hold()
        joint = self._monitor.update(now, m.current, dt)
        if joint is not None:
            self.counters.collisions += 1
            self._emit(EventType.COLLISION, joint=self.robot.joints[joint].name,
                       detail=self._monitor.last_trip)
            self.latch.trip(StopCause.COLLISION, now)
            self._sync_latch(now)
            return self._hold()
        st = self._fsm.state
        if st is State.MANUAL:
            cmd = self._manual_tick(now, m, dt)
        elif is_motion(st):
            cmd = self._motion_tick(now, m, dt)
        else:
            return self._hold()
        # A trip from another thread during this tick: never send its motion.
        return cmd if self.latch.state.generation == self._gen else self._hold()

    def _manual_tick(self, now: float, m: Measured, dt: float) -> Command:
        if self._predicted:
            self._jog.stop()
            return self._hold()
        sp, lost = self._jog.update(now, m.q, dt)
        if lost:
            self.counters.jog_lost += 1
            self._emit(EventType.JOG_LOST)
            if self.cfg.jog_loss_trips:
                self.latch.trip(StopCause.JOG_LOST, now)
                self._sync_latch(now)
        if sp is None:
            return self._hold()
        return Command(Mode.POSITION, sp, GripperMode.HOLD, 0.0, 0.0)

    def _sync_latch(self, now: float) -> None:
        """The latch changed: drop every setpoint; freeze a running task; follow the latch.

        Any change counts, even a trip and a reset that both happened between two ticks: a
        running task is frozen and saved either way, and nothing moves until a new command.
        """
        ls = self.latch.state
        self._gen = ls.generation
        self._now = max(self._now, now)
        before = self._fsm.state
        self._path = None
        self._grip = None
        self._jog.stop()
        self._monitor.reset()
        if is_motion(before) and self._run is not None:
            self._saved = True
            self._attempt = None
            self._emit(EventType.TASK_FROZEN, task_id=self._run.task_id, state=before.value,
                       stop=ls.kind.value if ls.kind else None,
                       cause=ls.first_cause.value if ls.first_cause else None)
        if ls.kind is not None:
            self._fsm.fire(Trigger.ESTOP if ls.kind is StopKind.ESTOP else
                           Trigger.PROTECTIVE_STOP)
        elif is_motion(before):
            self._fsm.fire(Trigger.HOLD)
        elif before is State.MANUAL:
            self._fsm.fire(Trigger.MANUAL_EXIT)
        else:
            self._fsm.fire(Trigger.REARM)
        if self._fsm.state is not before:
            self._emit(EventType.MODE_CHANGED, mode=self.mode, state=self._fsm.state.value)

    # -- commands ------------------------------------------------------------------------
    def _pre(self, now: float) -> None:
        """Every command first catches up with the latch (a trip since the last tick)."""
        self._now = max(self._now, now)
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
        m = self._last
        if m is None:
            return CommandResult.refuse(ErrorCode.REFUSED, "no joint measurement yet")
        if (m.gripper_force >= self.cfg.part_lost_force_n
                and m.tool[2] - self.robot.table_z_m > self.cfg.approach_clearance_m):
            # The approach opens the gripper: that would drop a part held up in the air.
            return CommandResult.refuse(ErrorCode.REFUSED, "a part is held above the table; "
                                        "set it down (manual mode) first")
        try:
            obj = vec3(object_xyz) if object_xyz is not None else self._object.estimate()
            if obj is None:
                return CommandResult.refuse(ErrorCode.REFUSED,
                                            "no object pose: no camera estimate, none given")
            place = (vec3(place_xyz) if place_xyz is not None
                     else (*self.cfg.default_place_xy_m, obj[2]))
        except (TypeError, ValueError) as exc:
            return CommandResult.refuse(ErrorCode.BAD_ARGS, f"object/place: {exc}")
        run = TaskRun(task_id, spec, obj, place, now)
        for pt in task_points(spec, obj, place, self.cfg):
            sol = self.kin.inverse(pt, q_seed=m.q)
            if isinstance(sol, IKFailure):
                return CommandResult.refuse(ErrorCode(sol.reason.value), sol.message)
        if self._run is not None:  # a saved task in holding is superseded
            self._end_task(now, Outcome.ABORTED, f"superseded by task {task_id}", None)
        self._run = run
        self.faults.begin_task()
        self.faults.begin_subgoal()
        self._fsm.fire(Trigger.START)
        self._next_decision = now
        self._emit(EventType.TASK_STARTED, task_id=task_id, task=task, object=list(obj),
                   place=list(place))
        self._begin_attempt(now, m, None)
        return CommandResult.accept(task_id=task_id, object=list(obj), place=list(place))

    def cancel(self, now: float) -> CommandResult:
        """task.cancel: a running task → controlled hold (aborted); a saved task is dropped."""
        self._pre(now)
        if self.mode == ExecMode.MANUAL:
            return CommandResult.refuse(ErrorCode.NOT_ADMITTED, "task.cancel: use manual.exit")
        if self._run is None:
            return CommandResult.accept("no task")
        task_id = self._run.task_id
        trigger = Trigger.HOLD if is_motion(self._fsm.state) else None
        self._end_task(now, Outcome.ABORTED, "cancelled", trigger)
        return CommandResult.accept(task_id=task_id)

    def resume(self, now: float, task_id: str | None = None) -> CommandResult:
        """Resume the saved task from the measured pose, if its preconditions still hold."""
        self._pre(now)
        refused = self._refuse_by_mode("resume")
        if refused is not None:
            return refused
        run, m = self._run, self._last
        if self.mode != ExecMode.HOLDING or run is None or not self._saved or run.state is None:
            return CommandResult.refuse(ErrorCode.NOTHING_TO_RESUME, "no saved task to resume")
        if task_id is not None and task_id != run.task_id:
            return CommandResult.refuse(ErrorCode.NOTHING_TO_RESUME,
                                        f"the saved task is {run.task_id}, not {task_id}")
        state = run.state
        if m is None or not self._fsm.fire(Trigger.resume(state)):
            self._end_task(now, Outcome.FAILED, f"resume: precondition of {state.value} failed "
                           "(part no longer gripped)", None)
            return CommandResult.refuse(ErrorCode.REFUSED,
                                        f"precondition of {state.value} failed; task failed")
        self._saved = False
        spec = run.spec.spec(state)
        self._next_decision = now
        self._emit(EventType.TASK_RESUMED, task_id=run.task_id, state=state.value)
        cmd_grip = run.grip_limit_a
        self._begin_attempt(now, m, None)
        if spec.gripper is GripperAction.GRIP and state is not State.GRASP:
            # Carrying: continue from the force the gripper holds (it kept it during the stop).
            g = self.robot.gripper
            self._grip = GripController(self.robot, self.cfg.grip_force_n,
                                        cmd_grip if cmd_grip is not None
                                        else g.current_nominal_a)
            self._grip.start_bumpless(m.gripper_current, m.gripper_force)
            run.grip_limit_a = self._grip.current_limit_a
        return CommandResult.accept(task_id=run.task_id, state=state.value)

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
        if self._fsm.state is State.DIAGNOSTIC:
            self._diagnostic = False
            self.faults.clear_l3()
            self._fsm.fire(Trigger.FINISH)
            self._emit(EventType.MODE_CHANGED, mode=self.mode, state=self._fsm.state.value)
            return CommandResult.accept(mode=self.mode)
        if self.mode == ExecMode.MANUAL:
            return CommandResult.refuse(ErrorCode.NOT_ADMITTED, "reset: use manual.exit")
        return CommandResult.accept("nothing latched", mode=self.mode)

    def manual_enter(self, now: float) -> CommandResult:
        """Enter manual mode (idle, holding, diagnostic); a saved task is given up."""
        self._pre(now)
        refused = self._refuse_by_mode("manual.enter")
        if refused is not None or self.mode == ExecMode.MANUAL:
            return refused or CommandResult.accept("already in manual")
        if self._run is not None:
            self._end_task(now, Outcome.ABORTED, "manual mode entered", None)
        self._jog.stop()
        self._fsm.fire(Trigger.MANUAL_ENTER)
        self._emit(EventType.MODE_CHANGED, mode=self.mode, state=self._fsm.state.value)
        return CommandResult.accept(mode=self.mode)

    def manual_jog(self, now: float, velocity: Sequence[float], ttl_ms: int,
                   frame: str = "joint") -> CommandResult:
        """One jog message: velocity in `frame` (joint rad/s, cartesian m/s) for ttl_ms."""
        self._pre(now)
        refused = self._refuse_by_mode("manual.jog")
        if refused is not None:
            return refused
        if self.mode != ExecMode.MANUAL:
            return CommandResult.refuse(ErrorCode.NOT_ADMITTED, "manual.jog: manual.enter first")
        if self._predicted:
            return CommandResult.refuse(ErrorCode.REFUSED, "manual.jog: a joint is predicted")
        if ttl_ms > self.cfg.jog_ttl_max_ms:
            return CommandResult.refuse(ErrorCode.BAD_ARGS,
                                        f"ttl_ms must be <= {self.cfg.jog_ttl_max_ms}")
        try:
            jf = JogFrame(frame)
        except ValueError:
            return CommandResult.refuse(ErrorCode.BAD_ARGS, f"unknown jog frame {frame!r}")
        why = self._jog.command(now, jf, velocity, ttl_ms)
        if why is not None:
            return CommandResult.refuse(ErrorCode.BAD_ARGS, why)
        return CommandResult.accept()

    def manual_exit(self, now: float) -> CommandResult:
        self._pre(now)
        if self._fsm.state is not State.MANUAL:
            return self._refuse_by_mode("manual.exit") or CommandResult.accept("not in manual")
        self._jog.stop()
        self._fsm.fire(Trigger.MANUAL_EXIT)
        self._emit(EventType.MODE_CHANGED, mode=self.mode, state=self._fsm.state.value)
        return CommandResult.accept(mode=self.mode)

    # -- persistence ---------------------------------------------------------------------
    def to_snapshot(self) -> dict[str, Any]:
        """What must survive a restart: the L3 count, diagnostic, the saved task."""
        return {"v": SNAPSHOT_VERSION, "faults": self.faults.to_dict(),
                "diagnostic": self._diagnostic, "fault_record": self.fault_record,
                "saved_task": self.saved_task}

    def restore(self, data: Mapping[str, Any], now: float, *, clean: bool) -> None:
        """Restore a snapshot before the first tick; `clean=False` (unclean restart) drops the
        saved task: no resume after an unclean restart."""
        faults = data.get("faults")
        if isinstance(faults, Mapping):
            self.faults.restore(faults)
        record = data.get("fault_record")
        self.fault_record = dict(record) if isinstance(record, Mapping) else None
        if data.get("diagnostic") is True:
            self._diagnostic = True
            self._fsm.force(State.DIAGNOSTIC)
            return
        saved = data.get("saved_task")
        if clean and isinstance(saved, Mapping):
            run = TaskRun.from_dict(saved, TASKS, now)
            if run is not None:
                self._run, self._saved = run, True
                self._fsm.force(State.HOLDING)

"""Running a task: attempts, the state's controller, guards, policy decisions and L1/L2/L3 faults.

`TaskRunner` is the part of the `Executor` that drives a motion state: it starts an attempt
(plans the tool path, builds the one controller the state runs, applies the L2 alternative),
steps it every tick, asks the policy at the decision rate, checks the L1 timeout, and hands a
failed attempt to the `FaultPolicy` (retry with an alternative, task failed, or diagnostic).
The `Executor` (executor.py) adds the stop model, the commands and persistence on top.

A lost part may be re-grasped when the policy proposes it and the machine's guard holds: see
regrasp.py.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from edge_agent.executor.controllers import (
    GripController,
    Measured,
    PathController,
    PathTuning,
    Vec3,
    plan_path,
)
from edge_agent.executor.faults import (
    FaultPolicy,
    Verdict,
    gain_scale,
    gripper_current_limit,
)
from edge_agent.executor.kinematics import ArmKinematics, IKFailure
from edge_agent.executor.machine import TaskMachine, Trigger
from edge_agent.executor.monitor import ObjectEstimate, SensorRing
from edge_agent.executor.paths import path_waypoints, task_points
from edge_agent.executor.records import Attempt, Counters, Outcome, TaskRun
from edge_agent.executor.regrasp import part_at_rest, regrasp_blocker
from edge_agent.executor.tasks import (
    Alternative,
    ControllerKind,
    ExecutorConfig,
    FailureKind,
    GripperAction,
    State,
    StateSpec,
    SubGoal,
)
from edge_agent.link.codec import Command, GripperMode, Mode
from edge_agent.policy_seam import OBS_DIM, POLICY_STATES, Action, Observation, Policy
from edge_agent.robot import RobotDescription
from edge_agent.vocab import EventType

Event = dict[str, Any]
SETTLED_RAD_S = 0.05  # joints slower than this count as settled at a target
PART_LOST_AFTER_S = 0.05


class TaskRunner:
    """Attempts, controllers and fault handling of the running task (see module doc)."""

    def __init__(self, robot: RobotDescription, policy: Policy, config: ExecutorConfig,
                 decision_sink: Callable[[Event], None] | None) -> None:
        self.robot = robot
        self.kin = ArmKinematics.of(robot)
        self.cfg = config
        self.policy = policy
        self.decision_sink = decision_sink
        self.faults = FaultPolicy(config.max_attempts, config.l3_threshold)
        self.counters = Counters()
        self._fsm = TaskMachine(self)
        self._ring = SensorRing(config.diagnostic_window_s, config.diagnostic_sample_hz)
        self._events: list[Event] = []
        self._tuning = PathTuning(speed_fraction=config.speed_fraction,
                                  waypoint_tolerance_m=config.waypoint_tolerance_m)
        g = robot.gripper
        self._open_cmd = (GripperMode.POSITION, g.stroke_max_m, g.current_nominal_a)
        self._open_min = g.stroke_max_m - config.gripper_open_margin_m
        self._decision_period = 1.0 / config.decision_hz
        self._run: TaskRun | None = None
        self._saved = False  # _run is frozen by a stop and may be resumed
        self._spec: StateSpec | None = None
        self._attempt: Attempt | None = None
        self._path: PathController | None = None
        self._grip: GripController | None = None
        self._next_decision = 0.0
        self._pending: tuple[Any, Observation, Attempt | None] | None = None
        self._prev_obs = (0.0, 0.0, 0.0)  # t, gripper opening, grip force at the last decision
        self._now = 0.0
        self._last: Measured | None = None
        self._diagnostic = False
        self._predicted = False  # joint positions are Kalman-predicted (set per tick)
        self._object = ObjectEstimate()  # fed by the Executor's tick from the camera
        try:
            self._camera_latency_s = robot.sensor("object_pose").latency_s
        except KeyError:
            self._camera_latency_s = 0.0
        self._regrasp_cache: tuple[float, Vec3 | None, str] | None = None
        self.fault_record: dict[str, Any] | None = None
        # Called with each new fault record (control thread; must only enqueue): the reports
        self.on_fault_record: Callable[[dict[str, Any]], None] | None = None

    # -- events --------------------------------------------------------------------------
    def _emit(self, type_: EventType, **fields: Any) -> None:
        self._events.append({"type": type_, "t": round(self._now, 6), **fields})

    def drain_events(self) -> list[Event]:
        """Events since the last call, oldest first (task_done, attempt_failed, ...)."""
        out, self._events = self._events, []
        return out

    # -- guards (called by the machine) --------------------------------------------------
    def subgoal_met(self) -> bool:
        m, spec, att, p = self._last, self._spec, self._attempt, self._path
        if m is None or spec is None or att is None or att.part_lost_at is not None:
            return False
        sg = spec.sub_goal
        if sg is SubGoal.GRIP_IN_BAND:
            return (att.in_band_since is not None
                    and self._now - att.in_band_since >= self.cfg.grip_dwell_s)
        if sg is SubGoal.GRIPPER_OPENED:
            return m.gripper_pos >= self._open_min and m.gripper_force <= self.cfg.released_force_n
        if p is None or not p.at_last_point or m.joint_speed > SETTLED_RAD_S:
            return False
        if p.goal_error(m) > self.cfg.tool_tolerance_m:
            return False
        if sg is SubGoal.TOOL_AT_TARGET:
            return m.gripper_pos >= self._open_min
        if sg is SubGoal.CARRY_AT_TARGET:
            return m.gripper_force >= self.cfg.part_lost_force_n
        return True

    def has_saved_task(self) -> bool:
        return self._run is not None and self._saved

    def precondition_holds(self) -> bool:
        run, m = self._run, self._last
        if run is None or run.state is None or m is None:
            return False
        spec = run.spec.spec(run.state)
        if spec.gripper is GripperAction.GRIP and spec.state is not State.GRASP:
            return m.gripper_force >= self.cfg.part_lost_force_n
        return True

    def was_diagnostic(self) -> bool:
        return self._diagnostic

    def regrasp_allowed(self) -> bool:
        return self.regrasp_verdict()[0] is not None

    def regrasp_verdict(self) -> tuple[Vec3 | None, str]:
        """The re-grasp guard: (the part's measured position, "") when a re-grasp may start
        now, else (None, why not). Evaluated once per tick."""
        c = self._regrasp_cache
        if c is not None and c[0] == self._now:
            return c[1], c[2]
        target, why = self._regrasp_check()
        self._regrasp_cache = (self._now, target, why)
        return target, why

    def _regrasp_check(self) -> tuple[Vec3 | None, str]:
        run, spec, att, m, c = self._run, self._spec, self._attempt, self._last, self.cfg
        if run is None or spec is None or att is None or m is None or att.part_lost_at is None:
            return None, "no lost part to re-grasp"
        if spec.regrasp_to is None:
            return None, f"a part lost in {spec.state.value} is not re-grasped"
        f = self.faults
        why = regrasp_blocker(c, m, regrasps=run.regrasps, predicted=self._predicted,
                              attempts_spent=(f"{spec.state.value}: {f.attempt} attempts spent"
                                              if f.attempt >= f.max_attempts else ""),
                              l3_reached=f.l3_count >= f.l3_threshold)
        if why:
            return None, why
        lost_since = att.low_force_since if att.low_force_since is not None else att.part_lost_at
        pose, why = part_at_rest(c, self._object, self._now, lost_since + self._camera_latency_s,
                                 self.robot.table_z_m)
        if pose is None:
            return None, why
        for pt in task_points(run.spec, pose, run.place_xyz, c):
            sol = self.kin.inverse(pt, q_seed=m.q)
            if isinstance(sol, IKFailure):
                return None, f"{sol.reason.value}: {sol.message}"
        return pose, ""

    # -- attempts ------------------------------------------------------------------------
    def _begin_attempt(self, now: float, m: Measured, alt: Alternative | None) -> Command:
        run = self._run
        assert run is not None
        st = self._fsm.state
        spec = run.spec.spec(st)
        self._spec = spec
        att = Attempt(st, self.faults.attempt, now, self.cfg.timeout(st, spec.timeout_s), alt)
        self._attempt = att
        run.state = st
        run.attempts = max(run.attempts, self.faults.total_attempts)
        self._prev_obs = (now, m.gripper_pos, m.gripper_force)
        self._path = None
        if spec.controller is ControllerKind.JOINT_POSITION:
            plan = plan_path(self.kin, m.q, m.tool_xyz,
                             path_waypoints(spec.path, run.object_xyz, run.place_xyz, self.cfg),
                             self.cfg.path_step_m)
            if isinstance(plan, IKFailure):
                return self._fail(now, m, FailureKind.NOT_CONVERGED, plan.message)
            self._path = PathController(self.robot, plan, self._tuning, gain_scale(alt))
            self._path.start(m.q)
        if spec.controller is ControllerKind.GRIPPER_FORCE:
            g = self.robot.gripper
            limit = gripper_current_limit(alt, g.current_nominal_a, g.current_max_a)
            retry = self._grip is not None
            self._grip = GripController(self.robot, self.cfg.grip_force_n, limit)
            if retry and m.gripper_force >= self._grip.tuning.contact_force_n:
                # Close again from the force held now, not from the bare target: lowering the
                # setpoint first would loosen the grip the retry is meant to strengthen.
                self._grip.start_bumpless(m.gripper_current, m.gripper_force)
            run.grip_limit_a = limit
        elif spec.gripper is GripperAction.OPEN:
            self._grip = None
            run.grip_limit_a = None
        self._emit(EventType.ATTEMPT_STARTED, task_id=run.task_id, state=st.value,
                   attempt=att.number, alternative=alt.name if alt else None)
        return self._compose(spec, m, 0.0)

    def _compose(self, spec: StateSpec, m: Measured, dt: float) -> Command:
        if self._path is not None:
            mode, q = Mode.POSITION, self._path.update(m, dt)
        else:
            mode, q = Mode.HOLD, m.q
        if spec.gripper is GripperAction.OPEN:
            return Command(mode, q, *self._open_cmd)
        if self._grip is not None:
            return Command(mode, q, GripperMode.FORCE, self._grip.update(m.gripper_force, dt),
                           self._grip.current_limit_a)
        return Command(mode, q, GripperMode.HOLD, 0.0, 0.0)

    def _motion_tick(self, now: float, m: Measured, dt: float) -> Command:
        spec, att = self._spec, self._attempt
        assert spec is not None and att is not None
        if att.part_lost_at is not None:
            return self._part_lost_tick(now, m, att)
        cmd = self._compose(spec, m, dt)
        f = m.gripper_force
        if spec.sub_goal is SubGoal.GRIP_IN_BAND:
            if abs(f - self.cfg.grip_force_n) <= self.cfg.grip_force_band_n:
                att.in_band_since = att.in_band_since if att.in_band_since is not None else now
            else:
                att.in_band_since = None
        elif spec.gripper is GripperAction.GRIP:
            if not f >= self.cfg.part_lost_force_n:
                if att.low_force_since is None:
                    att.low_force_since = now
                elif now - att.low_force_since >= PART_LOST_AFTER_S:
                    return self._fail(now, m, FailureKind.PART_LOST,
                                      f"grip force {f:.2f} N while carrying")
            else:
                att.low_force_since = None
        out = self._policy_step(now, m)
        if out is not None:
            return out
        if now - att.started >= att.timeout_s:
            return self._fail(now, m, self._classify(m),
                              f"sub-goal {spec.sub_goal.value} not met in {att.timeout_s:.2f} s")
        return cmd

    def _policy_step(self, now: float, m: Measured) -> Command | None:
        """Poll a decision in flight (a remote backend), or ask for one when it is due; the
        command of a transition the decision caused, else None."""
        if self._pending is not None:
            out = self._poll_pending(now, m)
            if out is not None:
                return out
        if now >= self._next_decision:
            self._next_decision = now + self._decision_period
            return self._decide(now, m)
        return None

    def _part_lost_tick(self, now: float, m: Measured, att: Attempt) -> Command:
        """The re-grasp window: hold still, ask the policy, fail the task when it runs out."""
        out = self._policy_step(now, m)
        if out is not None:
            return out
        lost_at = att.part_lost_at
        assert lost_at is not None
        if now - lost_at >= self.cfg.regrasp_window_s:
            _, why = self.regrasp_verdict()
            return self._end_task(now, Outcome.FAILED,
                                  f"{att.state.value} failed (part_lost): no re-grasp within "
                                  f"{self.cfg.regrasp_window_s:g} s"
                                  + (f" ({why})" if why else ""), Trigger.HOLD)
        return self._hold()

    def _start_regrasp(self, now: float, m: Measured, target: Vec3) -> Command:
        """The machine accepted a re-grasp: the task goes on from the approach to `target`."""
        run, att = self._run, self._attempt
        assert run is not None and att is not None
        run.regrasps += 1
        self.counters.regrasps += 1
        self._emit(EventType.REGRASP, task_id=run.task_id, state=att.state.value,
                   object=[round(v, 5) for v in target], old_object=list(run.object_xyz),
                   regrasp=run.regrasps)
        run.object_xyz = target
        self.faults.begin_subgoal()
        return self._begin_attempt(now, m, None)

    # -- decisions -----------------------------------------------------------------------
    def observe(self, now: float, m: Measured) -> Observation:
        """The policy's input vector (layout and units: policy.OBS_FIELDS)."""
        spec, att = self._spec, self._attempt
        assert spec is not None and att is not None
        v = [0.0] * OBS_DIM
        if spec.state in POLICY_STATES:
            v[POLICY_STATES.index(spec.state)] = 1.0
        elapsed = now - att.started
        err = self._path.goal_error(m) if self._path is not None else 0.0
        t0, pos0, f0 = self._prev_obs
        span = now - t0
        g = self.robot.gripper
        limit = self._grip.current_limit_a if self._grip else g.current_nominal_a
        v[6:] = [
            elapsed, elapsed / att.timeout_s, float(att.number - 1), err,
            min(100.0, err / self.cfg.tool_tolerance_m), m.joint_speed, m.gripper_pos,
            (m.gripper_pos - pos0) / span if span > 0 else 0.0, m.gripper_force,
            m.gripper_force - self.cfg.grip_force_n,
            (m.gripper_force - f0) / span if span > 0 else 0.0,
            now - att.in_band_since if att.in_band_since is not None else 0.0,
            limit / g.current_max_a, m.gripper_current / limit,
            1.0 if self.subgoal_met() else 0.0, 1.0 if self._predicted else 0.0,
            self.faults.l3_count / self.faults.l3_threshold,
            *self._part_lost_fields(now, att),
        ]
        self._prev_obs = (now, m.gripper_pos, m.gripper_force)
        return Observation(spec.state, tuple(v))

    def _part_lost_fields(self, now: float, att: Attempt) -> tuple[float, float, float]:
        """part_lost_hold, part_lost_elapsed_frac, regrasp_ok (see policy.OBS_FIELDS)."""
        if att.part_lost_at is None:
            return 0.0, 0.0, 0.0
        frac = (now - att.part_lost_at) / self.cfg.regrasp_window_s
        return 1.0, frac, 1.0 if self.regrasp_allowed() else 0.0

    def _decide(self, now: float, m: Measured) -> Command | None:
        """One decision. A policy with `begin(obs)` (the inference router) is never waited
        for: a decision still in flight is polled on the next ticks and applied when it comes —
        to the attempt it was asked for, or dropped if that attempt has ended."""
        if self._pending is not None:
            return None  # the previous decision is still in flight: this slot is skipped
        obs = self.observe(now, m)
        begin = getattr(self.policy, "begin", None)
        if begin is None:
            try:
                action = self.policy.decide(obs)
            except Exception:  # a broken policy is an inference failure, not a crash
                action = None
            return self._apply(now, m, obs, action)
        try:
            pending = begin(obs)
            done = pending.poll()
        except Exception:
            return self._apply(now, m, obs, None)
        if done:
            return self._apply(now, m, obs, pending.action)
        self._pending = (pending, obs, self._attempt)
        return None

    def _poll_pending(self, now: float, m: Measured) -> Command | None:
        assert self._pending is not None
        pending, obs, att = self._pending
        if att is not self._attempt:  # the attempt it was asked for is over
            self._pending = None
            self.counters.stale_decisions += 1
            return None
        try:
            done = pending.poll()
        except Exception:
            done, pending = True, None
        if not done:
            return None
        self._pending = None
        return self._apply(now, m, obs, pending.action if pending is not None else None)

    def _apply(self, now: float, m: Measured, obs: Observation, action: object
               ) -> Command | None:
        if not isinstance(action, Action) or not all(math.isfinite(x) for x in obs.vector):
            self.counters.inference_failures += 1
            self._sink(obs, None, False)
            return None
        self.counters.decisions += 1
        if action is Action.ADVANCE:
            if self._fsm.fire(Trigger.ADVANCE):
                self._sink(obs, action, True)
                return self._advanced(now, m)
            self.counters.advance_refused += 1
            self._sink(obs, action, False)
            return None
        att = self._attempt
        if action is Action.RETRY_ALTERNATIVE and att is not None and att.part_lost_at is not None:
            if self._fsm.fire(Trigger.REGRASP):
                target, _ = self.regrasp_verdict()
                assert target is not None  # the guard just held, this tick
                self._sink(obs, action, True)
                return self._start_regrasp(now, m, target)
            self.counters.regrasp_refused += 1
            _, why = self.regrasp_verdict()
            self._emit(EventType.REGRASP_REFUSED, task_id=self._run.task_id if self._run else None,
                       state=att.state.value, reason=why)
            self._sink(obs, action, False)
            return None
        self._sink(obs, action, True)
        if action is Action.ABORT:
            self.counters.policy_aborts += 1
            return self._end_task(now, Outcome.ABORTED, "aborted by the policy", Trigger.HOLD)
        if action is Action.RETRY_ALTERNATIVE:
            self.counters.policy_retries += 1
            return self._fail(now, m, self._classify(m), "policy asked for retry_alternative")
        return None

    def _sink(self, obs: Observation, action: Action | None, accepted: bool) -> None:
        if self.decision_sink is not None:
            self.decision_sink({"t": self._now, "state": obs.state.value,
                                "observation": obs.vector,
                                "action": action.name.lower() if action is not None else None,
                                "accepted": accepted})

    def _advanced(self, now: float, m: Measured) -> Command:
        done = self._attempt
        if done is not None:
            self.faults.attempt_succeeded(done.state, self._fsm.state is State.IDLE)
            self._emit(EventType.SUBGOAL_REACHED, state=done.state.value, attempt=done.number,
                       duration_s=round(now - done.started, 4))
        if self._fsm.state is State.IDLE:
            return self._end_task(now, Outcome.SUCCESS, "task done", None)
        self.faults.begin_subgoal()
        return self._begin_attempt(now, m, None)

    # -- failures ------------------------------------------------------------------------
    def _classify(self, m: Measured) -> FailureKind:
        spec = self._spec
        assert spec is not None
        f, c = m.gripper_force, self.cfg
        if spec.state is State.GRASP:
            return FailureKind.GRIP_STRONG if f > c.grip_force_n + c.grip_force_band_n \
                else FailureKind.GRIP_WEAK
        if spec.gripper is GripperAction.GRIP and not f >= c.part_lost_force_n:
            return FailureKind.PART_LOST
        if spec.state is State.RELEASE:
            return FailureKind.NOT_RELEASED
        return FailureKind.NOT_CONVERGED

    def _fail(self, now: float, m: Measured, kind: FailureKind, detail: str) -> Command:
        run, spec, att = self._run, self._spec, self._attempt
        assert run is not None and spec is not None and att is not None
        self.counters.attempts_failed += 1
        run.failures.append(f"{att.state.value}:{kind.value}")
        d = self.faults.attempt_failed(now, att.state, kind, spec.alternatives_for(kind), detail,
                                       fatal=kind is FailureKind.PART_LOST)
        self._emit(EventType.ATTEMPT_FAILED, task_id=run.task_id, state=att.state.value,
                   attempt=att.number, kind=kind.value, detail=detail, verdict=d.verdict.value,
                   alternative=d.alternative.name if d.alternative else None,
                   l3_count=d.l3_count)
        if d.verdict is Verdict.DIAGNOSTIC:
            return self._enter_diagnostic(now, m)
        if (d.verdict is Verdict.TASK_FAILED and kind is FailureKind.PART_LOST
                and spec.regrasp_to is not None and self.cfg.regrasp_window_s > 0):
            return self._open_regrasp_window(now, att)
        if d.verdict is Verdict.TASK_FAILED:
            why = "no retry helps" if kind is FailureKind.PART_LOST else \
                f"{att.number} attempts spent"
            return self._end_task(now, Outcome.FAILED,
                                  f"{att.state.value} failed ({kind.value}): {why}", Trigger.HOLD)
        self._fsm.fire(Trigger.RETRY)
        return self._begin_attempt(now, m, d.alternative)

    def _open_regrasp_window(self, now: float, att: Attempt) -> Command:
        """A lost part: hold still and let the policy propose a re-grasp (see the module doc)."""
        run = self._run
        assert run is not None
        att.part_lost_at = now
        self._path = None
        self._grip = None
        self._emit(EventType.PART_LOST_HOLD, task_id=run.task_id, state=att.state.value,
                   window_s=self.cfg.regrasp_window_s)
        return self._hold()

    def _enter_diagnostic(self, now: float, m: Measured) -> Command:
        run, att = self._run, self._attempt
        self.fault_record = {
            "time": now, "state": att.state.value if att else None,
            "task_id": run.task_id if run else None,
            "attempts": run.attempts if run else 0, "l3_count": self.faults.l3_count,
            "last_failures": [f.as_dict() for f in self.faults.last_failures(
                self.faults.l3_threshold)],
            "sensor_window": self._ring.window(),
        }
        self._diagnostic = True
        cmd = self._end_task(now, Outcome.FAILED,
                             f"{self.faults.l3_count} failed attempts in a row: diagnostic",
                             Trigger.DIAGNOSE)
        if self.on_fault_record is not None:
            self.on_fault_record(self.fault_record)  # the repair report (it only enqueues)
        window = self.fault_record["sensor_window"]
        self._emit(EventType.DIAGNOSTIC, record={**self.fault_record, "sensor_window": {
            "samples": window["samples"], "sample_hz": window["sample_hz"]}})
        return cmd

    def _end_task(self, now: float, outcome: Outcome, message: str,
                  trigger: str | None) -> Command:
        run = self._run
        if trigger is not None:
            self._fsm.fire(trigger)
        if run is not None:
            self._emit(EventType.TASK_DONE, task_id=run.task_id, outcome=outcome.value,
                       message=message,
                       attempts=run.attempts, duration_s=round(now - run.started_at, 4),
                       failures=list(run.failures))
        self._run = None
        self._saved = False
        self._spec = None
        self._attempt = None
        self._path = None
        self._grip = None
        return self._hold()

    def _hold(self) -> Command:
        """Joints hold the measured position; the gripper keeps its opening and force."""
        q = self._last.q if self._last is not None else self.robot.home
        return Command(Mode.HOLD, q, GripperMode.HOLD, 0.0, 0.0)

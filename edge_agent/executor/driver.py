"""Driving the task: attempts, the state's controller, guards, and what a decision or failure does.

The `TaskDriver` is the part of the `Executor` that runs a motion state: it starts an attempt
(plans the tool path, builds the one controller the state runs, applies the L2 alternative),
steps it every tick, asks the policy through its `PolicyClient` (decisions.py), checks the L1
timeout, and hands a failed attempt to the fault policy (faults.py: retry with an alternative,
task failed, the re-grasp window, or diagnostic). It is also the machine's guard object. The
`Executor` (executor.py) owns it and adds the stop model, the commands and persistence; it reads
the driver only through the public names here.

A lost part may be re-grasped when the policy proposes it and the machine's guard holds: see
regrasp.py.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any, cast

from edge_agent.executor.context import DecisionRecord, EventLog, TickInputs
from edge_agent.executor.controllers import Measured, Vec3
from edge_agent.executor.decisions import PolicyClient
from edge_agent.executor.faults import (
    FaultPolicy,
    FaultRecord,
    NextStep,
    after_failure,
    classify,
    fault_record,
    published_record,
    task_failed_message,
)
from edge_agent.executor.kinematics import ArmKinematics
from edge_agent.executor.machine import TaskMachine, Trigger, is_motion
from edge_agent.executor.observation import observe
from edge_agent.executor.records import Attempt, Counters, Outcome, TaskProgress
from edge_agent.executor.regrasp import RegraspGuard
from edge_agent.executor.state_control import StateControl
from edge_agent.executor.tasks import (
    TASKS,
    Alternative,
    ExecutorConfig,
    FailureKind,
    GripperAction,
    State,
    StateSpec,
)
from edge_agent.link.codec import Command
from edge_agent.policy_seam import Action, Observation, Policy
from edge_agent.robot import RobotDescription
from edge_agent.vocab import EventType, StopCause, StopKind

PART_LOST_AFTER_S = 0.05  # grip force low this long while carrying: the part is lost


class TaskDriver:
    """The running task's attempts, controllers, decisions and failures (see module doc)."""

    def __init__(self, robot: RobotDescription, kin: ArmKinematics, config: ExecutorConfig,
                 policy: Policy, inputs: TickInputs, events: EventLog, counters: Counters,
                 decision_sink: Callable[[DecisionRecord], None] | None) -> None:
        self._robot = robot
        self._cfg = config
        self.faults = FaultPolicy(config.max_attempts, config.l3_threshold)
        self.decisions = PolicyClient(policy, 1.0 / config.decision_hz, counters, decision_sink)
        self.machine = TaskMachine(self)
        self._control = StateControl(robot, kin, config)
        self._in = inputs
        self._events = events
        self._counters = counters
        self._task: TaskProgress | None = None
        self._saved = False  # _task is frozen by a stop and may be resumed
        self._spec: StateSpec | None = None
        self._attempt: Attempt | None = None
        self._prev_obs = (0.0, 0.0, 0.0)  # t, gripper opening, grip force at the last decision
        self._diagnostic = False
        self._regrasp = RegraspGuard(config, robot, kin)
        self.fault_record: FaultRecord | None = None
        # Called with each new fault record (control thread; must only enqueue): the reports
        self.on_fault_record: Callable[[FaultRecord], None] | None = None

    # -- reading -------------------------------------------------------------------------
    @property
    def task(self) -> TaskProgress | None:
        """The running task, or the one a stop froze (see `has_saved_task`)."""
        return self._task

    # -- guards (called by the machine) --------------------------------------------------
    def subgoal_met(self) -> bool:
        m, spec, att = self._in.measured, self._spec, self._attempt
        if m is None or spec is None or att is None:
            return False
        return self._control.subgoal_met(spec, att, m, self._in.now)

    def has_saved_task(self) -> bool:
        """The task is frozen by a stop and may be resumed."""
        return self._task is not None and self._saved

    def precondition_holds(self) -> bool:
        task, m = self._task, self._in.measured
        if task is None or task.state is None or m is None:
            return False
        spec = task.spec.spec(task.state)
        if spec.gripper is GripperAction.GRIP and spec.state is not State.GRASP:
            return m.gripper_force >= self._cfg.part_lost_force_n
        return True

    def was_diagnostic(self) -> bool:
        """The machine is (or was, before a stop) in diagnostic."""
        return self._diagnostic

    def regrasp_allowed(self) -> bool:
        return self.regrasp_verdict()[0] is not None

    def regrasp_verdict(self) -> tuple[Vec3 | None, str]:
        """The re-grasp guard: (the part's measured position, "") when a re-grasp may start
        now, else (None, why not). Evaluated once per tick."""
        inp = self._in
        return self._regrasp.verdict(inp.now, self.faults, self._task, self._spec, self._attempt,
                                     inp.measured, predicted=inp.predicted, objects=inp.object)

    # -- the task's life -----------------------------------------------------------------
    def start(self, now: float, m: Measured, task: TaskProgress) -> None:
        """Start `task` (a saved task in holding is superseded)."""
        if self._task is not None:
            self.end(now, Outcome.ABORTED, f"superseded by task {task.task_id}", None)
        self._task = task
        self.faults.begin_task()
        self.faults.begin_subgoal()
        self.machine.fire(Trigger.START)
        self.decisions.decide_now(now)
        self._events.emit({"type": EventType.TASK_STARTED, "task_id": task.task_id,
                           "task": task.spec.name, "object": list(task.object_xyz),
                           "place": list(task.place_xyz)})
        self._begin_attempt(now, m, None)

    def resume(self, now: float, m: Measured | None) -> bool:
        """Re-enter the saved task's state from the measured pose; False (and the task ended
        `failed`) when its precondition no longer holds."""
        task = self._task
        assert task is not None and task.state is not None
        state = task.state
        if m is None or not self.machine.fire(Trigger.resume(state)):
            self.end(now, Outcome.FAILED, f"resume: precondition of {state.value} failed "
                     "(part no longer gripped)", None)
            return False
        self._saved = False
        self.decisions.decide_now(now)
        self._events.emit({"type": EventType.TASK_RESUMED, "task_id": task.task_id,
                           "state": state.value})
        grip_limit = task.grip_limit_a
        self._begin_attempt(now, m, None)
        if task.spec.spec(state).gripper is GripperAction.GRIP and state is not State.GRASP:
            # Carrying: continue from the force the gripper holds (it kept it during the stop).
            task.grip_limit_a = self._control.hold_grip(m, grip_limit)
        return True

    def freeze(self, before: State, stop: StopKind | None, cause: StopCause | None) -> None:
        """The latch changed: drop every setpoint; a task running in `before` is saved."""
        self._control.drop()
        if is_motion(before) and self._task is not None:
            self._saved = True
            self._attempt = None
            self._events.emit({"type": EventType.TASK_FROZEN, "task_id": self._task.task_id,
                               "state": before.value, "stop": stop,
                               "cause": cause})

    def end(self, now: float, outcome: Outcome, message: str, trigger: str | None) -> Command:
        """End the task (`task_done`), fire `trigger` first; the hold command."""
        task = self._task
        if trigger is not None:
            self.machine.fire(trigger)
        if task is not None:
            self._events.emit({"type": EventType.TASK_DONE, "task_id": task.task_id,
                               "outcome": outcome.value, "message": message,
                               "attempts": task.attempts,
                               "duration_s": round(now - task.started_at, 4),
                               "failures": list(task.failures)})
        self._task = None
        self._saved = False
        self._spec = None
        self._attempt = None
        self._control.drop()
        return self.hold()

    def leave_diagnostic(self) -> None:
        """An operator reset acknowledges the L3 failures."""
        self._diagnostic = False
        self.faults.clear_l3()
        self.machine.fire(Trigger.FINISH)

    def hold(self) -> Command:
        """Joints hold the measured position; the gripper keeps its opening and force."""
        return self._control.hold(self._in.measured)

    # -- persistence ---------------------------------------------------------------------
    def restore(self, data: Mapping[str, Any], now: float, *, clean: bool) -> None:
        """See `Executor.restore`."""
        faults = data.get("faults")
        if isinstance(faults, Mapping):
            self.faults.restore(faults)
        record = data.get("fault_record")
        self.fault_record = cast(FaultRecord, dict(record)) if isinstance(record, Mapping) \
            else None
        if data.get("diagnostic") is True:
            self._diagnostic = True
            self.machine.force(State.DIAGNOSTIC)
            return
        saved = data.get("saved_task")
        if clean and isinstance(saved, Mapping):
            task = TaskProgress.from_dict(saved, TASKS, now)
            if task is not None:
                self._task, self._saved = task, True
                self.machine.force(State.HOLDING)

    # -- attempts ------------------------------------------------------------------------
    def _begin_attempt(self, now: float, m: Measured, alt: Alternative | None) -> Command:
        task = self._task
        assert task is not None
        st = self.machine.state
        spec = task.spec.spec(st)
        self._spec = spec
        att = Attempt(st, self.faults.attempt, now, self._cfg.timeout(st, spec.timeout_s), alt)
        self._attempt = att
        task.state = st
        task.attempts = max(task.attempts, self.faults.total_attempts)
        self._prev_obs = (now, m.gripper_pos, m.gripper_force)
        failure = self._control.start(spec, m, task, alt)
        if failure is not None:
            return self._fail(now, m, FailureKind.NOT_CONVERGED, failure.message)
        self._events.emit({"type": EventType.ATTEMPT_STARTED, "task_id": task.task_id,
                           "state": st.value, "attempt": att.number,
                           "alternative": alt.name if alt else None})
        return self._control.compose(spec, m, 0.0)

    def tick(self, now: float, m: Measured, dt: float) -> Command:
        """One tick of a motion state: the command to send."""
        spec, att = self._spec, self._attempt
        assert spec is not None and att is not None
        if att.part_lost_at is not None:
            return self._part_lost_tick(now, m, att)
        cmd = self._control.compose(spec, m, dt)
        if att.track_grip(spec, m.gripper_force, now, self._cfg) >= PART_LOST_AFTER_S:
            return self._fail(now, m, FailureKind.PART_LOST,
                              f"grip force {m.gripper_force:.2f} N while carrying")
        out = self._policy_step(now, m)
        if out is not None:
            return out
        if now - att.started >= att.timeout_s:
            return self._fail(now, m, classify(spec, m.gripper_force, self._cfg),
                              f"sub-goal {spec.sub_goal.value} not met in {att.timeout_s:.2f} s")
        return cmd

    def _part_lost_tick(self, now: float, m: Measured, att: Attempt) -> Command:
        """The re-grasp window: hold still, ask the policy, fail the task when it runs out."""
        out = self._policy_step(now, m)
        if out is not None:
            return out
        lost_at = att.part_lost_at
        assert lost_at is not None
        if now - lost_at >= self._cfg.regrasp_window_s:
            _, why = self.regrasp_verdict()
            return self.end(now, Outcome.FAILED,
                            f"{att.state.value} failed (part_lost): no re-grasp within "
                            f"{self._cfg.regrasp_window_s:g} s" + (f" ({why})" if why else ""),
                            Trigger.HOLD)
        return self.hold()

    def _start_regrasp(self, now: float, m: Measured, target: Vec3) -> Command:
        """The machine accepted a re-grasp: the task goes on from the approach to `target`."""
        task, att = self._task, self._attempt
        assert task is not None and att is not None
        task.regrasps += 1
        self._counters.regrasps += 1
        self._events.emit({"type": EventType.REGRASP, "task_id": task.task_id,
                           "state": att.state.value, "object": [round(v, 5) for v in target],
                           "old_object": list(task.object_xyz), "regrasp": task.regrasps})
        task.object_xyz = target
        self.faults.begin_subgoal()
        return self._begin_attempt(now, m, None)

    # -- decisions -----------------------------------------------------------------------
    def _observe(self, now: float, m: Measured) -> Observation:
        """The policy's input vector now (layout and units: policy_seam.OBS_FIELDS)."""
        spec, att = self._spec, self._attempt
        assert spec is not None and att is not None
        obs = observe(now, m, spec.state, att, self._prev_obs, self._control, self._cfg,
                      self._robot.gripper.current_max_a, self.faults,
                      subgoal_met=self.subgoal_met(), predicted=self._in.predicted,
                      regrasp_ok=att.part_lost_at is not None and self.regrasp_allowed())
        self._prev_obs = (now, m.gripper_pos, m.gripper_force)
        return obs

    def _policy_step(self, now: float, m: Measured) -> Command | None:
        """Apply a decision in flight that came, or ask for one when it is due; the command of
        a transition the decision caused, else None."""
        d = self.decisions.poll(self._attempt)
        if d is not None:
            out = self._apply(now, m, d.obs, d.action)
            if out is not None:
                return out
        d = self.decisions.ask_if_due(now, self._attempt, lambda: self._observe(now, m))
        return self._apply(now, m, d.obs, d.action) if d is not None else None

    def _apply(self, now: float, m: Measured, obs: Observation, action: object
               ) -> Command | None:
        journal = self.decisions.journal
        if not isinstance(action, Action) or not all(math.isfinite(x) for x in obs.vector):
            self._counters.inference_failures += 1
            journal(now, obs, None, False)
            return None
        self._counters.decisions += 1
        if action is Action.ADVANCE:
            if self.machine.fire(Trigger.ADVANCE):
                journal(now, obs, action, True)
                return self._advanced(now, m)
            self._counters.advance_refused += 1
            journal(now, obs, action, False)
            return None
        att = self._attempt
        if action is Action.RETRY_ALTERNATIVE and att is not None and att.part_lost_at is not None:
            if self.machine.fire(Trigger.REGRASP):
                target, _ = self.regrasp_verdict()
                assert target is not None  # the guard just held, this tick
                journal(now, obs, action, True)
                return self._start_regrasp(now, m, target)
            self._counters.regrasp_refused += 1
            _, why = self.regrasp_verdict()
            self._events.emit({"type": EventType.REGRASP_REFUSED,
                               "task_id": self._task.task_id if self._task else None,
                               "state": att.state.value, "reason": why})
            journal(now, obs, action, False)
            return None
        journal(now, obs, action, True)
        if action is Action.ABORT:
            self._counters.policy_aborts += 1
            return self.end(now, Outcome.ABORTED, "aborted by the policy", Trigger.HOLD)
        if action is Action.RETRY_ALTERNATIVE:
            assert self._spec is not None
            self._counters.policy_retries += 1
            return self._fail(now, m, classify(self._spec, m.gripper_force, self._cfg),
                              "policy asked for retry_alternative")
        return None

    def _advanced(self, now: float, m: Measured) -> Command:
        done = self._attempt
        if done is not None:
            self.faults.attempt_succeeded(done.state, self.machine.state is State.IDLE)
            self._events.emit({"type": EventType.SUBGOAL_REACHED, "state": done.state.value,
                               "attempt": done.number, "duration_s": round(now - done.started, 4)})
        if self.machine.state is State.IDLE:
            return self.end(now, Outcome.SUCCESS, "task done", None)
        self.faults.begin_subgoal()
        return self._begin_attempt(now, m, None)

    # -- failures (faults.py decides, the driver carries it out) -------------------------
    def _fail(self, now: float, m: Measured, kind: FailureKind, detail: str) -> Command:
        task, spec, att = self._task, self._spec, self._attempt
        assert task is not None and spec is not None and att is not None
        self._counters.attempts_failed += 1
        task.failures.append(f"{att.state.value}:{kind.value}")
        d = self.faults.attempt_failed(now, att.state, kind, spec.alternatives_for(kind), detail,
                                       fatal=kind is FailureKind.PART_LOST)
        self._events.emit({"type": EventType.ATTEMPT_FAILED, "task_id": task.task_id,
                           "state": att.state.value, "attempt": att.number, "kind": kind.value,
                           "detail": detail, "verdict": d.verdict.value,
                           "alternative": d.alternative.name if d.alternative else None,
                           "l3_count": d.l3_count})
        step = after_failure(d, kind, spec, self._cfg)
        if step is NextStep.DIAGNOSTIC:
            return self._enter_diagnostic(now)
        if step is NextStep.REGRASP_WINDOW:
            att.part_lost_at = now  # hold still; the policy may propose a re-grasp
            self._control.drop()
            self._events.emit({"type": EventType.PART_LOST_HOLD, "task_id": task.task_id,
                               "state": att.state.value, "window_s": self._cfg.regrasp_window_s})
            return self.hold()
        if step is NextStep.TASK_FAILED:
            return self.end(now, Outcome.FAILED, task_failed_message(att.state, kind, att.number),
                            Trigger.HOLD)
        self.machine.fire(Trigger.RETRY)
        return self._begin_attempt(now, m, d.alternative)

    def _enter_diagnostic(self, now: float) -> Command:
        task, att = self._task, self._attempt
        record = fault_record(now, att.state if att else None, task.task_id if task else None,
                              task.attempts if task else 0, self.faults, self._in.ring.window())
        self.fault_record = record
        self._diagnostic = True
        cmd = self.end(now, Outcome.FAILED,
                       f"{self.faults.l3_count} failed attempts in a row: diagnostic",
                       Trigger.DIAGNOSE)
        if self.on_fault_record is not None:
            self.on_fault_record(record)  # the repair report (it only enqueues)
        self._events.emit({"type": EventType.DIAGNOSTIC, "record": published_record(record)})
        return cmd

"""The executor's `transitions` state machine, built from the task tables, with the guards.

The machine says which transitions exist and whether their guards hold (the policy proposes,
the machine disposes); the executor performs the effects after a transition fired. States and
triggers are data: every motion state of the task gets `advance` (guarded by its sub-goal),
`retry` (re-enter: a new attempt) and `resume_<state>` (guarded by its precondition); a state
with `regrasp_to` gets `regrasp` (guarded by the re-grasp guard: a lost part seen at rest,
reachable, budgets left).
"""

from __future__ import annotations

from typing import Any, Protocol

from transitions import Machine, MachineError

from edge_agent.executor.tasks import MOTION_STATES, PICK_PLACE, State, TaskSpec
from edge_agent.vocab import Mode, StopKind


class Trigger:
    """Trigger names (strings, as `transitions` wants them)."""

    START = "start"
    ADVANCE = "advance"
    RETRY = "retry"
    REGRASP = "regrasp"  # after a lost part: back to the approach of the part where it lies
    HOLD = "hold"  # controlled hold: cancel, policy abort, a failed task
    FINISH = "finish"  # back to idle: the task is over, or a reset left diagnostic
    DIAGNOSE = "diagnose"
    ESTOP = "estop"
    PROTECTIVE_STOP = "protective_stop"
    REARM = "rearm"  # the latch was reset
    MANUAL_ENTER = "manual_enter"
    MANUAL_EXIT = "manual_exit"

    @staticmethod
    def resume(state: State) -> str:
        return f"resume_{state.value}"


class Guards(Protocol):
    """What the machine asks the executor before it lets a guarded transition fire."""

    def subgoal_met(self) -> bool: ...

    def regrasp_allowed(self) -> bool: ...

    def has_saved_task(self) -> bool: ...

    def precondition_holds(self) -> bool: ...

    def was_diagnostic(self) -> bool: ...


class _Model:
    state: str = State.IDLE.value


class TaskMachine:
    """A thin, typed face on a queued `transitions.Machine`."""

    def __init__(self, guards: Guards, task: TaskSpec = PICK_PLACE) -> None:
        self._model = _Model()
        self.fired = 0  # incremented by every transition that happened (reflexive ones too)
        self._machine: Any = Machine(
            model=self._model,
            states=[s.value for s in State],
            transitions=build_transitions(guards, task),
            initial=State.IDLE.value,
            queued=True,
            auto_transitions=False,
            ignore_invalid_triggers=False,
            after_state_change=self._count,
        )

    def _count(self) -> None:
        self.fired += 1

    @property
    def state(self) -> State:
        return State(self._model.state)

    def fire(self, trigger: str) -> bool:
        """Fire `trigger`; True if a transition happened (False: invalid here or guard failed)."""
        before = self.fired
        try:
            self._model.trigger(trigger)  # type: ignore[attr-defined]
        except MachineError:
            return False
        return self.fired != before

    def can(self, trigger: str) -> bool:
        """Whether `trigger` exists from the current state (guards not evaluated)."""
        return trigger in self._machine.get_triggers(self._model.state)

    def force(self, state: State) -> None:
        """Restore a state without a transition (start-up from a snapshot only)."""
        self._machine.set_state(state.value, model=self._model)


def build_transitions(guards: Guards, task: TaskSpec) -> list[dict[str, Any]]:
    """The transition table, as `transitions` dicts, derived from the task's state table."""
    motion = [s.state.value for s in task.states]
    idle, holding = State.IDLE.value, State.HOLDING.value
    stops = [State.ESTOP.value, State.PROTECTIVE_STOP.value]
    out: list[dict[str, Any]] = [
        {"trigger": Trigger.START, "source": [idle, holding], "dest": task.first.value},
        {"trigger": Trigger.HOLD, "source": [*motion, idle], "dest": holding},
        {"trigger": Trigger.FINISH, "source": [holding, State.DIAGNOSTIC.value, *motion],
         "dest": idle},
        {"trigger": Trigger.DIAGNOSE, "source": [*motion, idle, holding],
         "dest": State.DIAGNOSTIC.value},
        {"trigger": Trigger.ESTOP, "source": [s.value for s in State if s is not State.ESTOP],
         "dest": State.ESTOP.value},
        {"trigger": Trigger.PROTECTIVE_STOP,
         "source": [s.value for s in State if s.value not in stops],
         "dest": State.PROTECTIVE_STOP.value},
        # A reset: back to holding when a task is saved (resume possible), back to diagnostic
        # when the stop interrupted one (only its own reset leaves it), else to idle.
        {"trigger": Trigger.REARM, "source": stops, "dest": holding,
         "conditions": [guards.has_saved_task]},
        {"trigger": Trigger.REARM, "source": stops, "dest": State.DIAGNOSTIC.value,
         "conditions": [guards.was_diagnostic]},
        {"trigger": Trigger.REARM, "source": stops, "dest": idle},
        {"trigger": Trigger.MANUAL_ENTER, "source": [idle, holding, State.DIAGNOSTIC.value],
         "dest": State.MANUAL.value},
        {"trigger": Trigger.MANUAL_EXIT, "source": State.MANUAL.value,
         "dest": State.DIAGNOSTIC.value, "conditions": [guards.was_diagnostic]},
        {"trigger": Trigger.MANUAL_EXIT, "source": State.MANUAL.value, "dest": idle},
    ]
    for spec in task.states:
        s = spec.state.value
        out.append({"trigger": Trigger.ADVANCE, "source": s, "dest": spec.next.value,
                    "conditions": [guards.subgoal_met]})
        out.append({"trigger": Trigger.RETRY, "source": s, "dest": s})
        if spec.regrasp_to is not None:
            out.append({"trigger": Trigger.REGRASP, "source": s, "dest": spec.regrasp_to.value,
                        "conditions": [guards.regrasp_allowed]})
        out.append({"trigger": Trigger.resume(spec.state), "source": holding, "dest": s,
                    "conditions": [guards.has_saved_task, guards.precondition_holds]})
    return out


def is_motion(state: State) -> bool:
    return state in MOTION_STATES


def mode_of(stop: StopKind | None, state: State, task_saved: bool) -> Mode:
    """The executor's externally visible mode (`state.mode`, the admission matrix's column):
    the latch first, then the machine's state (`running` for every motion state)."""
    if stop is StopKind.ESTOP:
        return Mode.ESTOP
    if stop is StopKind.PROTECTIVE:
        return Mode.PROTECTIVE_STOP
    if is_motion(state):
        return Mode.RUNNING
    if state in (State.ESTOP, State.PROTECTIVE_STOP):  # reset, not yet ticked
        return Mode.HOLDING if task_saved else Mode.IDLE
    return Mode(state.value)

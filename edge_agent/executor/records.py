"""Value types of the executor: task outcomes, command results, the running task and attempt.

Outcomes follow pyrobosim's style (an enum plus a human message); refusal codes are
`vocab.ErrorCode` members, the very codes the command layer replies with.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING, Any, TypedDict

from edge_agent.executor.faults import FaultRecord
from edge_agent.executor.tasks import (
    Alternative,
    ExecutorConfig,
    GripperAction,
    State,
    StateSpec,
    SubGoal,
    TaskSpec,
)
from edge_agent.vocab import ErrorCode

if TYPE_CHECKING:  # the status contract (TypedDicts) is not imported on the start-up path
    from edge_agent.contract.status_parts import TaskInfo

Vec3 = tuple[float, float, float]


class Outcome(StrEnum):
    SUCCESS = "success"
    FAILED = "failed"  # attempt budget spent, precondition failed, diagnostic, part lost
    ABORTED = "aborted"  # cancelled by an operator, aborted by the policy, superseded


@dataclass(frozen=True, slots=True)
class CommandResult:
    """The executor's answer to a command: ok with a result, or a refusal code and message."""

    ok: bool
    code: str | None = None
    message: str = ""
    result: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def accept(cls, message: str = "", **result: Any) -> CommandResult:
        return cls(True, None, message, result)

    @classmethod
    def refuse(cls, code: ErrorCode, message: str) -> CommandResult:
        return cls(False, code.value, message)


@dataclass(frozen=True, slots=True)
class TaskResult:
    outcome: Outcome
    message: str
    reasons: tuple[str, ...] = ()


@dataclass
class TaskProgress:
    """The running task, or the one frozen by a stop (saved for `resume`)."""

    task_id: str
    spec: TaskSpec
    object_xyz: Vec3
    place_xyz: Vec3
    started_at: float
    state: State | None = None  # the motion state it is in (or was in when frozen)
    attempts: int = 0  # all attempts, every sub-goal
    failures: list[str] = field(default_factory=list)
    grip_limit_a: float | None = None  # the finger current limit of the grip that holds the part
    regrasps: int = 0  # re-grasps after a lost part (accepted policy proposals)

    def as_dict(self) -> TaskInfo:
        return {"task_id": self.task_id, "task": self.spec.name,
                "object": list(self.object_xyz), "place": list(self.place_xyz),
                "state": self.state.value if self.state else None, "attempts": self.attempts,
                "failures": list(self.failures), "grip_limit_a": self.grip_limit_a,
                "regrasps": self.regrasps}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], tasks: Mapping[str, TaskSpec],
                  now: float) -> TaskProgress | None:
        """Rebuild a saved task; None when anything is missing or out of place."""
        try:
            spec = tasks[str(data["task"])]
            obj = vec3(data["object"])
            place = vec3(data["place"])
            state = State(data["state"])
            if not spec.has(state):
                return None
            grip = data.get("grip_limit_a")
            return cls(str(data["task_id"]), spec, obj, place, now, state,
                       int(data.get("attempts", 0)), [str(f) for f in data.get("failures", [])],
                       float(grip) if grip is not None else None,
                       int(data.get("regrasps", 0)))
        except (KeyError, TypeError, ValueError):
            return None


def vec3(v: Any) -> Vec3:
    """[x, y, z] as three finite floats (ValueError / TypeError otherwise)."""
    if len(v) != 3:
        raise ValueError(f"expected [x, y, z], got {list(v)}")
    x, y, z = (float(a) for a in v)
    if not all(math.isfinite(a) for a in (x, y, z)):
        raise ValueError(f"not finite: {list(v)}")
    return (x, y, z)


@dataclass
class Attempt:
    """One attempt at one state's sub-goal."""

    state: State
    number: int
    started: float
    timeout_s: float
    alternative: Alternative | None = None
    in_band_since: float | None = None  # grip force inside the band since
    low_force_since: float | None = None  # carrying: grip force below part_lost since
    part_lost_at: float | None = None  # the part was declared lost: the re-grasp window runs

    def track_grip(self, spec: StateSpec, force_n: float, now: float,
                   cfg: ExecutorConfig) -> float:
        """Follow the grip force at `now`: in the grasp, how long it has been inside the band
        (`in_band_since`); while carrying, how long it has been too low to hold the part —
        returned (0.0 when it is not low, or the state does not carry)."""
        if spec.sub_goal is SubGoal.GRIP_IN_BAND:
            if abs(force_n - cfg.grip_force_n) <= cfg.grip_force_band_n:
                self.in_band_since = self.in_band_since if self.in_band_since is not None else now
            else:
                self.in_band_since = None
        elif spec.gripper is GripperAction.GRIP:
            if force_n >= cfg.part_lost_force_n:
                self.low_force_since = None
            elif self.low_force_since is None:
                self.low_force_since = now
            else:
                return now - self.low_force_since
        return 0.0


@dataclass
class Counters:
    ticks: int = 0
    decisions: int = 0
    advance_refused: int = 0
    inference_failures: int = 0
    policy_retries: int = 0
    regrasps: int = 0  # accepted re-grasp proposals
    regrasp_refused: int = 0  # re-grasp proposals the guard refused
    policy_aborts: int = 0
    attempts_failed: int = 0
    collisions: int = 0
    jog_lost: int = 0
    no_measurement: int = 0
    stale_decisions: int = 0  # answered after their attempt ended (dropped)

    def as_dict(self) -> dict[str, int]:
        return dict(self.__dict__)


class ExecutorSnapshot(TypedDict):
    """`Executor.to_snapshot()`: what must survive a restart (`restore` reads it back)."""

    v: int
    faults: dict[str, Any]
    diagnostic: bool
    fault_record: FaultRecord | None
    saved_task: TaskInfo | None

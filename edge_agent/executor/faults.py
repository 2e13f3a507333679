"""Failure handling: L1/L2/L3 budgets, what a failed attempt leads to, the fault record. Pure.

- L1 (the executor measures it): an attempt that misses its sub-goal by the state's timeout fails.
- L2: a failed attempt is retried with the next configured alternative for its failure kind;
  at most `max_attempts` attempts per sub-goal, a policy `retry_alternative` spends the same
  budget; once spent, the task fails (controlled hold).
- L3: failed attempts in a row, across sub-goals and tasks; it survives restarts (`to_dict` /
  `restore`); reaching `l3_threshold` means `diagnostic`. What resets it is a successful attempt
  *at a sub-goal that failed* (the fault went away) or a completed task. A success at some other
  sub-goal does not: with a permanent gripper fault every task's approach succeeds and every
  grasp fails, and that robot must still reach diagnostic at exactly the threshold.

A failed attempt is `classify`-ed from what the sensors say, `FaultPolicy.attempt_failed` gives
the verdict, and `after_failure` turns it into the driver's next step (retry, hold in the
re-grasp window after a lost part, fail the task, or diagnostic with a `FaultRecord`).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, TypedDict

from edge_agent.executor.tasks import (
    Alternative,
    AltKind,
    ExecutorConfig,
    FailureKind,
    GripperAction,
    State,
    StateSpec,
)

_RETRY = Alternative(AltKind.RETRY)


class Verdict(StrEnum):
    RETRY = "retry"  # try the sub-goal again with `alternative`
    TASK_FAILED = "task_failed"  # the sub-goal's budget is spent
    DIAGNOSTIC = "diagnostic"  # L3 threshold reached


@dataclass(frozen=True, slots=True)
class Failure:
    """One failed attempt, kept for the fault record."""

    t: float
    state: State
    kind: FailureKind
    attempt: int
    detail: str = ""

    def as_dict(self) -> dict[str, Any]:
        return {"t": round(self.t, 4), "state": self.state.value, "kind": self.kind.value,
                "attempt": self.attempt, "detail": self.detail}


@dataclass(frozen=True, slots=True)
class FaultDecision:
    verdict: Verdict
    alternative: Alternative | None  # RETRY only
    attempt: int  # the number of the next attempt (RETRY) or of the failed one
    l3_count: int


class FaultPolicy:
    """Counts attempts of the current sub-goal and consecutive failures; decides what follows."""

    def __init__(self, max_attempts: int = 3, l3_threshold: int = 5, history: int = 32) -> None:
        if max_attempts < 1 or l3_threshold < 1:
            raise ValueError("max_attempts and l3_threshold must be >= 1")
        self.max_attempts = max_attempts
        self.l3_threshold = l3_threshold
        self.l3_count = 0
        self.attempt = 0  # 1-based number of the running attempt of the current sub-goal
        self.total_attempts = 0  # attempts of the current task, all sub-goals
        self._kind_counts: dict[FailureKind, int] = {}
        self._failing: set[State] = set()  # states with failures in the present L3 run
        self.history: deque[Failure] = deque(maxlen=history)

    # -- the task and its sub-goals ------------------------------------------------------
    def begin_task(self) -> None:
        self.total_attempts = 0
        self.attempt = 0

    def begin_subgoal(self) -> None:
        """A new sub-goal starts: its first attempt, no alternative used yet."""
        self.attempt = 1
        self.total_attempts += 1
        self._kind_counts.clear()

    def attempt_succeeded(self, state: State, task_done: bool = False) -> bool:
        """The running attempt reached its sub-goal; True when that reset the L3 count."""
        if task_done or state in self._failing:
            reset = self.l3_count > 0
            self.l3_count = 0
            self._failing.clear()
            return reset
        return False

    def attempt_failed(self, now: float, state: State, kind: FailureKind,
                       alternatives: Sequence[Alternative], detail: str = "",
                       fatal: bool = False) -> FaultDecision:
        """Record a failed attempt and say what comes next (`fatal`: no retry can help)."""
        self.l3_count += 1
        self._failing.add(state)
        self.history.append(Failure(now, state, kind, self.attempt, detail))
        if self.l3_count >= self.l3_threshold:
            return FaultDecision(Verdict.DIAGNOSTIC, None, self.attempt, self.l3_count)
        if fatal or self.attempt >= self.max_attempts:
            return FaultDecision(Verdict.TASK_FAILED, None, self.attempt, self.l3_count)
        n = self._kind_counts.get(kind, 0)
        self._kind_counts[kind] = n + 1
        # The k-th failure of a kind uses the k-th alternative; past the end, the last one again.
        alt = alternatives[min(n, len(alternatives) - 1)] if alternatives else _RETRY
        self.attempt += 1
        self.total_attempts += 1
        return FaultDecision(Verdict.RETRY, alt, self.attempt, self.l3_count)

    def clear_l3(self) -> None:
        """An operator reset (leaving diagnostic) acknowledges the failures."""
        self.l3_count = 0
        self._failing.clear()

    def last_failures(self, n: int = 5) -> list[Failure]:
        return list(self.history)[-n:]

    # -- persistence ---------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return {"l3_count": self.l3_count, "failing_states": sorted(s.value for s in self._failing),
                "last_failures": [f.as_dict() for f in self.last_failures(self.l3_threshold)]}

    def restore(self, data: Mapping[str, Any]) -> None:
        raw = data.get("l3_count", 0)
        self.l3_count = raw if isinstance(raw, int) and raw >= 0 else 0
        self._failing = set()
        for name in data.get("failing_states", ()) or ():
            try:
                self._failing.add(State(name))
            except ValueError:
                continue
        self.history.clear()
        for item in data.get("last_failures", ()) or ():
            try:
                self.history.append(Failure(float(item["t"]), State(item["state"]),
                                            FailureKind(item["kind"]), int(item["attempt"]),
                                            str(item.get("detail", ""))))
            except (KeyError, TypeError, ValueError):
                continue  # a damaged entry does not cost the count itself


def gripper_current_limit(alt: Alternative | None, nominal_a: float, max_a: float) -> float:
    """The finger current limit for an attempt: nominal, or raised by the alternative (capped)."""
    if alt is not None and alt.kind is AltKind.RAISE_GRIPPER_CURRENT:
        return min(max_a, nominal_a * alt.value)
    return min(max_a, nominal_a)


def gain_scale(alt: Alternative | None) -> float:
    """The factor on joint gains and speed for an attempt (1.0 without an alternative)."""
    if alt is not None and alt.kind is AltKind.SCALE_GAINS:
        return max(0.05, min(1.0, alt.value))
    return 1.0


class NextStep(StrEnum):
    """What the task driver does after a failed attempt."""

    RETRY = "retry"  # a new attempt at the same sub-goal, with the decision's alternative
    REGRASP_WINDOW = "regrasp_window"  # a lost part: hold and let the policy propose a re-grasp
    TASK_FAILED = "task_failed"  # controlled hold, the task ends `failed`
    DIAGNOSTIC = "diagnostic"  # the L3 threshold: the task ends, the machine waits for a reset


def classify(spec: StateSpec, gripper_force: float, cfg: ExecutorConfig) -> FailureKind:
    """Why the attempt at `spec` failed, judged from the grip force (an L1 timeout, a policy's
    `retry_alternative`)."""
    f = gripper_force
    if spec.state is State.GRASP:
        return FailureKind.GRIP_STRONG if f > cfg.grip_force_n + cfg.grip_force_band_n \
            else FailureKind.GRIP_WEAK
    if spec.gripper is GripperAction.GRIP and not f >= cfg.part_lost_force_n:
        return FailureKind.PART_LOST
    if spec.state is State.RELEASE:
        return FailureKind.NOT_RELEASED
    return FailureKind.NOT_CONVERGED


def after_failure(d: FaultDecision, kind: FailureKind, spec: StateSpec,
                  cfg: ExecutorConfig) -> NextStep:
    """The driver's next step for the verdict `d` on a `kind` failure at `spec`."""
    if d.verdict is Verdict.DIAGNOSTIC:
        return NextStep.DIAGNOSTIC
    if d.verdict is Verdict.TASK_FAILED:
        if (kind is FailureKind.PART_LOST and spec.regrasp_to is not None
                and cfg.regrasp_window_s > 0):
            return NextStep.REGRASP_WINDOW
        return NextStep.TASK_FAILED
    return NextStep.RETRY


def task_failed_message(state: State, kind: FailureKind, attempt: int) -> str:
    why = "no retry helps" if kind is FailureKind.PART_LOST else f"{attempt} attempts spent"
    return f"{state.value} failed ({kind.value}): {why}"


class FaultRecord(TypedDict):
    """The L3 diagnosis: kept in the snapshot, published (`diagnostic` event, without the raw
    samples), and the repair report's input (with the raw sensor window)."""

    time: float
    state: str | None
    task_id: str | None
    attempts: int
    l3_count: int
    last_failures: list[dict[str, Any]]
    sensor_window: dict[str, Any]


def fault_record(now: float, state: State | None, task_id: str | None, attempts: int,
                 faults: FaultPolicy, sensor_window: dict[str, Any]) -> FaultRecord:
    return {"time": now, "state": state.value if state is not None else None,
            "task_id": task_id, "attempts": attempts, "l3_count": faults.l3_count,
            "last_failures": [f.as_dict() for f in faults.last_failures(faults.l3_threshold)],
            "sensor_window": sensor_window}


def published_record(record: FaultRecord) -> dict[str, Any]:
    """The record as the `diagnostic` event carries it: the window's size, not its samples."""
    window = record["sensor_window"]
    return {**record, "sensor_window": {"samples": window["samples"],
                                        "sample_hz": window["sample_hz"]}}

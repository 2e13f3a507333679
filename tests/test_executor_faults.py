"""L1 timeouts, L2 alternatives (applied for one attempt, then undone), L3, persistence."""

from __future__ import annotations

import pytest
from executor_fake import Bench

from edge_agent.executor.faults import FaultPolicy, Verdict, gripper_current_limit
from edge_agent.executor.tasks import (
    Alternative,
    AltKind,
    ExecutorConfig,
    FailureKind,
    State,
)
from edge_agent.link.codec import GripperMode


def _grip_limits_by_attempt(b: Bench) -> dict[int, set[float]]:
    """Finger current limits of the FORCE commands sent after each grasp attempt started."""
    starts = [(float(e["t"]), int(e["attempt"]))
              for e in b.of("attempt_started") if e["state"] == "grasp"]
    out: dict[int, set[float]] = {}
    for t, cmd in b.commands:
        if cmd.gripper_mode == GripperMode.FORCE:
            att = max(a for ts, a in starts if ts <= t)
            out.setdefault(att, set()).add(round(cmd.gripper_current_limit, 6))
    return out


def test_l1_timeout_fails_the_attempt_at_the_configured_time() -> None:
    cfg = ExecutorConfig(l1_timeouts_s={"approach": 0.8})
    b = Bench(config=cfg, frozen=True)  # the joints do not follow: approach cannot converge
    b.start()
    t0 = b.now
    assert b.run_until(lambda: bool(b.of("attempt_failed")), 2.0)
    fail = b.of("attempt_failed")[0]
    assert fail["kind"] == "not_converged" and fail["state"] == "approach"
    assert 0.8 - 0.01 <= float(fail["t"]) - t0 <= 0.8 + 0.01
    assert fail["alternative"] == "scale_gainsx0.5"


def test_budget_spent_ends_the_task_failed_in_a_controlled_hold() -> None:
    cfg = ExecutorConfig(l1_timeouts_s={"approach": 0.5})
    b = Bench(config=cfg, frozen=True)
    b.start()
    assert b.run_until(lambda: b.done() is not None, 5.0)
    done = b.done()
    assert done is not None and done["outcome"] == "failed"
    assert done["attempts"] == 3
    assert done["failures"] == ["approach:not_converged"] * 3
    alts = [e["alternative"] for e in b.of("attempt_started")]
    assert alts == [None, "scale_gainsx0.5", "scale_gainsx0.25"]
    assert b.ex.mode == "holding"
    cmd = b.step()
    assert cmd.mode.name == "HOLD" and cmd.gripper_mode == GripperMode.HOLD


def test_l2_raises_the_grip_current_for_one_attempt_and_undoes_it() -> None:
    # 45 % strength: fails at the nominal 0.8 A (max 7.2 N), succeeds at 1.2 A (10.8 N).
    b = Bench(weak=0.55)
    b.start()
    assert b.run_until(lambda: b.done() is not None, 40.0)
    assert b.outcome() == "success"
    grasp = [e for e in b.of("attempt_started") if e["state"] == "grasp"]
    assert [e["alternative"] for e in grasp] == [None, "raise_gripper_currentx1.5"]
    limits = _grip_limits_by_attempt(b)
    assert limits[1] == {0.8} and limits[2] == {1.2}
    # The next task starts from the nominal settings again: the alternative was undone.
    b.arm.weak = 0.0
    b.arm.q = list(b.robot.home)
    b.arm.object_pose = (0.36, 0.06, 0.02)
    b.events.clear()
    b.commands.clear()
    b.start("t2")
    assert b.run_until(lambda: b.ex.state is State.LIFT, 20.0)
    assert {c.gripper_current_limit for _, c in b.commands
            if c.gripper_mode == GripperMode.FORCE} == {0.8}
    assert all(e["alternative"] is None for e in b.of("attempt_started"))


def test_a_success_resets_the_l3_count() -> None:
    b = Bench(weak=0.55)
    b.start()
    assert b.run_until(lambda: b.ex.faults.l3_count == 1, 20.0)
    assert b.run_until(lambda: b.ex.state is State.LIFT, 20.0)
    assert b.ex.faults.l3_count == 0


@pytest.mark.parametrize("threshold", [5, 4])
def test_l3_diagnostic_at_exactly_the_configured_count_across_tasks(threshold: int) -> None:
    b = Bench(config=ExecutorConfig(l3_threshold=threshold), weak=0.95)  # never grips enough
    b.start("t1")
    assert b.run_until(lambda: b.done("t1") is not None, 30.0)
    assert b.outcome("t1") == "failed"
    assert b.ex.mode == "holding" and b.ex.faults.l3_count == 3
    assert not b.of("diagnostic")
    b.start("t2")
    assert b.run_until(lambda: b.done("t2") is not None, 30.0)
    fails = b.of("attempt_failed")
    assert len(fails) == threshold
    assert [e["l3_count"] for e in fails] == list(range(1, threshold + 1))
    assert b.ex.mode == "diagnostic"
    diag = b.of("diagnostic")
    assert len(diag) == 1
    rec = diag[0]["record"]
    assert rec["l3_count"] == threshold
    assert len(rec["last_failures"]) == threshold
    assert rec["sensor_window"]["samples"] > 10
    assert b.outcome("t2") == "failed"
    # diagnostic refuses task.start; reset leaves it and clears the count.
    assert b.ex.start_task(b.now, "t3").code == "not_admitted"
    assert b.ex.reset(b.now).ok and b.ex.mode == "idle" and b.ex.faults.l3_count == 0


def test_l3_count_and_diagnostic_survive_a_restart() -> None:
    b = Bench(weak=0.95)
    b.start("t1")
    assert b.run_until(lambda: b.done("t1") is not None, 30.0)
    snap = b.ex.to_snapshot()
    b2 = Bench(weak=0.95)
    b2.ex.restore(snap, 0.0, clean=False)
    assert b2.ex.faults.l3_count == 3
    b2.start("t2")
    assert b2.run_until(lambda: b2.ex.mode == "diagnostic", 30.0)
    assert len(b2.of("attempt_failed")) == 2  # 3 before the restart + 2 = 5
    b3 = Bench()
    b3.ex.restore(b2.ex.to_snapshot(), 0.0, clean=True)
    b3.step(3)
    assert b3.ex.mode == "diagnostic" and b3.ex.fault_record is not None


def test_fault_policy_alternatives_budget_and_fatal_failures() -> None:
    fp = FaultPolicy(max_attempts=3, l3_threshold=10)
    alts = (Alternative(AltKind.RAISE_GRIPPER_CURRENT, 1.5),
            Alternative(AltKind.RAISE_GRIPPER_CURRENT, 2.5))
    fp.begin_task()
    fp.begin_subgoal()
    d1 = fp.attempt_failed(0.0, State.GRASP, FailureKind.GRIP_WEAK, alts)
    d2 = fp.attempt_failed(1.0, State.GRASP, FailureKind.GRIP_WEAK, alts)
    d3 = fp.attempt_failed(2.0, State.GRASP, FailureKind.GRIP_WEAK, alts)
    assert (d1.verdict, d1.alternative, d1.attempt) == (Verdict.RETRY, alts[0], 2)
    assert (d2.verdict, d2.alternative, d2.attempt) == (Verdict.RETRY, alts[1], 3)
    assert d3.verdict is Verdict.TASK_FAILED
    fp.begin_subgoal()
    d = fp.attempt_failed(3.0, State.LIFT, FailureKind.PART_LOST, (), fatal=True)
    assert d.verdict is Verdict.TASK_FAILED and fp.l3_count == 4
    # A success elsewhere does not break the run of failures; one where it failed does.
    assert not fp.attempt_succeeded(State.APPROACH) and fp.l3_count == 4
    assert fp.attempt_succeeded(State.GRASP) and fp.l3_count == 0
    fp.attempt_failed(4.0, State.LIFT, FailureKind.NOT_CONVERGED, ())
    assert fp.attempt_succeeded(State.RETREAT, task_done=True) and fp.l3_count == 0
    # The current limit an alternative asks for is capped by the description.
    assert gripper_current_limit(alts[1], 0.8, 2.0) == 2.0
    assert gripper_current_limit(None, 0.8, 2.0) == 0.8

"""Executor state flow, policies and decisions, with a small deterministic plant (executor_fake)."""

from __future__ import annotations

import math
import subprocess
import sys

import pytest
from executor_fake import Bench

from edge_agent.executor.machine import TaskMachine, Trigger
from edge_agent.executor.policy import AlwaysAdvancePolicy, ExpertPolicy
from edge_agent.executor.tasks import PICK_PLACE, ExecutorConfig, State
from edge_agent.link.codec import GripperMode, Mode
from edge_agent.policy_seam import (
    OBS_DIM,
    OBS_FIELDS,
    Action,
    Observation,
    Policy,
    action_from_scores,
)

ORDER = ["approach", "grasp", "lift", "transfer", "release", "retreat"]


def test_pick_place_runs_every_state_in_order_and_succeeds() -> None:
    b = Bench()
    b.start()
    assert b.ex.mode == "running"
    assert b.run_until(lambda: b.done() is not None, 40.0)
    done = b.done()
    assert done is not None and done["outcome"] == "success", done
    started = [e["state"] for e in b.of("attempt_started")]
    assert started == ORDER
    assert done["attempts"] == 6 and done["failures"] == []
    assert b.ex.mode == "idle" and b.ex.state is State.IDLE
    # The gripper never moved while carrying: FORCE from grasp to the end of transfer.
    modes = {c.gripper_mode for _, c in b.commands}
    assert GripperMode.FORCE in modes and GripperMode.POSITION in modes


def test_each_motion_state_runs_its_one_controller() -> None:
    b = Bench()
    b.start()
    seen: dict[str, set[tuple[Mode, GripperMode]]] = {}
    while b.done() is None and b.now < 40:
        cmd = b.step()
        st = b.ex.state.value
        seen.setdefault(st, set()).add((cmd.mode, cmd.gripper_mode))
    assert seen["approach"] <= {(Mode.POSITION, GripperMode.POSITION)}
    assert seen["grasp"] <= {(Mode.HOLD, GripperMode.FORCE)}
    assert seen["lift"] <= {(Mode.POSITION, GripperMode.FORCE)}
    assert seen["transfer"] <= {(Mode.POSITION, GripperMode.FORCE)}
    assert seen["release"] <= {(Mode.HOLD, GripperMode.POSITION)}


def test_tool_reaches_the_object_within_tolerance_before_grasp() -> None:
    b = Bench()
    b.start()
    assert b.run_until(lambda: b.ex.state is State.GRASP, 20.0)
    x, y, z, pitch = b.arm.kin.forward(b.arm.q)
    assert math.dist((x, y, z), b.arm.object_pose) <= 0.002 + 1e-9
    assert abs(pitch + math.pi / 2) < 1e-3


def test_always_advance_baseline_succeeds_and_refusals_are_counted() -> None:
    b = Bench(policy=AlwaysAdvancePolicy())
    b.start()
    assert b.run_until(lambda: b.done() is not None, 40.0)
    assert b.outcome() == "success"
    assert b.ex.counters.advance_refused > 50  # the guard said no many times


class _Silent:
    def decide(self, obs: Observation) -> Action | None:
        return None


class _Broken:
    def decide(self, obs: Observation) -> Action | None:
        raise RuntimeError("model crashed")


@pytest.mark.parametrize("policy", [_Silent(), _Broken()])
def test_no_decision_keeps_the_controller_and_counts_inference_failures(policy: Policy) -> None:
    cfg = ExecutorConfig(l1_timeouts_s={"approach": 2.0})
    b = Bench(config=cfg, policy=policy)
    b.start()
    b.step(100)
    assert b.ex.state is State.APPROACH
    assert b.ex.counters.inference_failures >= 9
    # The controller kept running: the arm moved toward the object.
    assert any(c.mode == Mode.POSITION for _, c in b.commands)
    # Without advance the sub-goal never completes: L1 fails the attempt.
    assert b.run_until(lambda: bool(b.of("attempt_failed")), 3.0)


class _AbortInLift:
    def decide(self, obs: Observation) -> Action | None:
        if obs.state is State.LIFT:
            return Action.ABORT
        return ExpertPolicy().decide(obs)


def test_policy_abort_is_always_accepted_and_holds_with_the_grip() -> None:
    b = Bench(policy=_AbortInLift())
    b.start()
    assert b.run_until(lambda: b.done() is not None, 30.0)
    assert b.outcome() == "aborted"
    assert b.ex.mode == "holding"
    force = b.arm.force
    cmd = b.step(20)
    assert cmd.mode == Mode.HOLD and cmd.gripper_mode == GripperMode.HOLD
    assert force > 8.0 and b.arm.force == force  # the part is still held


def test_action_from_scores_maps_argmax_and_nan_to_no_decision() -> None:
    assert action_from_scores([0.1, 0.7, 0.1, 0.1]) is Action.ADVANCE
    assert action_from_scores([0.1, float("nan"), 0.1, 0.1]) is None
    assert action_from_scores([1.0, 2.0]) is None


def test_observation_vector_has_the_documented_layout() -> None:
    seen: list[Observation] = []

    class Recorder:
        def decide(self, obs: Observation) -> Action | None:
            seen.append(obs)
            return Action.CONTINUE

    b = Bench(policy=Recorder())
    b.start()
    b.step(3)
    assert seen, "the policy was asked at the start of the task"
    obs = seen[-1]
    assert len(obs.vector) == OBS_DIM == len(OBS_FIELDS)
    assert obs.get("state_approach") == 1.0 and obs.get("state_grasp") == 0.0
    assert obs.get("tool_err_m") > 0.01
    assert obs.get("attempt_index") == 0.0 and obs.get("part_lost_hold") == 0.0
    assert all(f.unit for f in OBS_FIELDS)


def test_machine_guard_refuses_advance_until_the_subgoal_holds() -> None:
    class G:
        met = False
        regrasp = False

        def subgoal_met(self) -> bool:
            return self.met

        def regrasp_allowed(self) -> bool:
            return self.regrasp

        def has_saved_task(self) -> bool:
            return False

        def precondition_holds(self) -> bool:
            return True

        def was_diagnostic(self) -> bool:
            return False

    g = G()
    m = TaskMachine(g)

    def at(state: State) -> bool:
        return m.state is state

    assert m.fire(Trigger.START) and at(State.APPROACH)
    assert not m.fire(Trigger.ADVANCE) and at(State.APPROACH)
    g.met = True
    assert m.fire(Trigger.ADVANCE) and at(State.GRASP)
    assert m.fire(Trigger.RETRY) and at(State.GRASP)  # reflexive: a new attempt
    assert not m.fire(Trigger.REGRASP) and at(State.GRASP)  # only from a carrying state
    assert m.fire(Trigger.ADVANCE) and at(State.LIFT)
    g.met = False
    assert not m.fire(Trigger.REGRASP) and at(State.LIFT)  # its guard refuses
    g.regrasp = True
    assert m.fire(Trigger.REGRASP) and at(State.APPROACH)  # back to the part where it lies
    g.met = True
    assert m.fire(Trigger.ADVANCE) and at(State.GRASP)
    assert not m.fire(Trigger.START)  # not from grasp
    assert m.fire(Trigger.ESTOP) and at(State.ESTOP)
    assert m.fire(Trigger.REARM) and at(State.IDLE)
    assert [s.next for s in PICK_PLACE.states][-1] is State.IDLE


def test_the_executor_imports_no_transport_or_inference_library() -> None:
    code = ("import sys, edge_agent.executor.executor, edge_agent.executor.policy; "
            "bad = [m for m in ('paho', 'onnxruntime', 'tritonclient', 'filterpy', 'scipy') "
            "if m in sys.modules]; print(bad); sys.exit(1 if bad else 0)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr

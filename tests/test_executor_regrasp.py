"""Re-grasp after a lost part: the policy proposes `retry_alternative` in the hold that follows a
PART_LOST, the machine's guard disposes. Real Executor, SensorHub and codec against the
simulated robot (hil/sim) in lock-step virtual time; the rig's slip fault drops the part."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import pytest

from edge_agent.executor.executor import Executor
from edge_agent.executor.latch import StopLatch
from edge_agent.executor.policy import AlwaysAdvancePolicy, ExpertPolicy
from edge_agent.executor.tasks import ExecutorConfig
from edge_agent.policy_seam import OBS_INDEX, Action, Observation, Policy
from edge_agent.robot import load_robot
from hil.episodes import DEFAULT_ROBOT, ExecutorHost, run_episode, transient_slip
from hil.lockstep import Lockstep
from hil.sim.config import load_rig

ROBOT = load_robot(DEFAULT_ROBOT)
SEEDS = (960_000, 960_001, 960_002)
_LOST = OBS_INDEX["part_lost_hold"]
_OK = OBS_INDEX["regrasp_ok"]


class ProposeRegrasp:
    """The expert, except that in the part-lost hold it proposes a re-grasp at every decision,
    whatever the observation says: the guard alone must refuse what is not allowed."""

    def __init__(self) -> None:
        self.expert = ExpertPolicy()
        self.window_obs: list[Observation] = []

    def decide(self, obs: Observation) -> Action | None:
        if obs.vector[_LOST] >= 0.5:
            self.window_obs.append(obs)
            return Action.RETRY_ALTERNATIVE
        return self.expert.decide(obs)


@dataclass
class Bench:
    """One simulated robot with the real executor as its lock-step host."""

    ex: Executor
    host: ExecutorHost
    ls: Lockstep
    events: list[dict[str, Any]] = field(default_factory=list)

    @classmethod
    def make(cls, seed: int, policy: Policy, config: ExecutorConfig | None = None) -> Bench:
        latch = StopLatch()
        ex = Executor(ROBOT, latch, policy, config)
        host = ExecutorHost(ex, latch, status_period_us=5000)
        ls = Lockstep(ROBOT, load_rig(None, ROBOT), seed=seed, host=host, host_period_s=0.005)
        assert ls.run_until_true(lambda: ex.object_samples >= 15, 3.0)
        return cls(ex, host, ls)

    def of(self, type_: str) -> list[dict[str, Any]]:
        return [e for e in self.host.events if e["type"] == type_]

    def start(self) -> None:
        reply = self.ex.start_task(self.ls.now, "t1")
        assert reply.ok, reply.message

    def run_until_event(self, type_: str, timeout_s: float = 20.0) -> dict[str, Any]:
        assert self.ls.run_until_true(lambda: bool(self.of(type_)), timeout_s), type_
        return self.of(type_)[0]

    def carry_then_slip(self, duration_s: float | None) -> None:
        """Run until the rig's part is carried, then let it slip (for `duration_s`)."""
        obj = self.ls.fw.obj
        assert self.ls.run_until_true(lambda: obj.grasped and obj.lifted, 20.0)
        self.ls.run_for(0.3)
        self.ls.inject("gripper", "slip", duration_s=duration_s)

    def finish(self) -> dict[str, Any]:
        return self.run_until_event("task_done", 40.0)


def _joints_still(b: Bench, seconds: float) -> float:
    """Largest joint travel (rad) over the next `seconds` of virtual time."""
    q0 = list(b.ls.fw.arm.q)
    b.ls.run_for(seconds)
    return max(abs(a - c) for a, c in zip(b.ls.fw.arm.q, q0, strict=True))


@pytest.mark.parametrize("seed", SEEDS)
def test_a_transient_slip_is_regrasped_and_the_task_succeeds(seed: int) -> None:
    after, duration = transient_slip(seed)
    r = run_episode(ROBOT, seed, policy=ExpertPolicy(), fault="gripper:slip",
                    fault_after_lift_s=after, fault_duration_s=duration)
    assert r.success, (r.outcome, r.failures)
    assert r.regrasps == 1 and r.drops == 1 and r.drop_causes == {"slip": 1}
    assert len(r.failures) == 1 and r.failures[0].endswith(":part_lost")
    # the same seed without the policy's decision: always-advance cannot re-grasp
    base = run_episode(ROBOT, seed, policy=AlwaysAdvancePolicy(), fault="gripper:slip",
                       fault_after_lift_s=after, fault_duration_s=duration)
    assert base.outcome == "failed" and base.final_mode == "holding" and base.regrasps == 0
    assert not base.success and base.failures == r.failures


def test_the_regrasp_targets_the_measured_pose_and_the_hold_does_not_move() -> None:
    b = Bench.make(SEEDS[0], ExpertPolicy())
    b.start()
    b.carry_then_slip(0.3)
    hold = b.run_until_event("part_lost_hold")
    assert b.ex.mode == "running"
    b.ls.run_for(0.05)  # the lift's motion brakes to a stop
    assert _joints_still(b, 0.1) < 1e-4  # controlled hold: nothing moves while deciding
    regrasp = b.run_until_event("regrasp", 1.0)
    assert regrasp["t"] - hold["t"] < b.ex.cfg.regrasp_window_s
    truth = b.ls.fw.obj.xyz
    # the camera's view of where the part lies now (its bias is a few mm), not the old pose
    assert math.dist(regrasp["object"], truth) < 0.012
    assert b.finish()["outcome"] == "success"
    assert b.ex.counters.regrasps == 1 and b.ex.counters.regrasp_refused == 0


def test_always_advance_is_refused_in_the_hold_and_the_task_fails() -> None:
    b = Bench.make(SEEDS[1], AlwaysAdvancePolicy())
    b.start()
    b.carry_then_slip(0.3)
    hold = b.run_until_event("part_lost_hold")
    refused_before = b.ex.counters.advance_refused
    done = b.finish()
    assert done["outcome"] == "failed" and "no re-grasp" in done["message"]
    assert done["t"] - hold["t"] == pytest.approx(b.ex.cfg.regrasp_window_s, abs=0.011)
    assert b.ex.mode == "holding" and not b.of("regrasp")
    assert b.ex.counters.advance_refused >= refused_before + 5  # 20 Hz over 0.5 s
    assert b.ls.fw.obj.drops == 1  # the slip's, none of ours


def test_a_part_out_of_reach_is_not_regrasped() -> None:
    policy = ProposeRegrasp()
    b = Bench.make(SEEDS[2], policy)
    b.start()
    b.carry_then_slip(None)
    b.run_until_event("part_lost_hold")
    b.ls.fw.obj.place((0.80, 0.0, 0.0))  # it rolled off the workspace (x <= 0.55)
    done = b.finish()
    assert done["outcome"] == "failed" and b.ex.mode == "holding" and not b.of("regrasp")
    reasons = {e["reason"] for e in b.of("regrasp_refused")}
    assert any(r.startswith(("out_of_workspace", "unreachable")) for r in reasons), reasons
    assert b.ex.counters.regrasp_refused == len(b.of("regrasp_refused")) >= 5
    assert all(o.vector[_OK] == 0.0 for o in policy.window_obs)
    assert _joints_still(b, 0.2) < 1e-4


def test_a_stale_object_pose_is_not_regrasped() -> None:
    b = Bench.make(SEEDS[0], ProposeRegrasp())
    b.start()
    b.carry_then_slip(0.2)
    b.ls.inject("sensor:object_pose", "dropout")  # the camera goes blind as the part drops
    done = b.finish()
    assert done["outcome"] == "failed" and b.ex.mode == "holding" and not b.of("regrasp")
    reasons = [e["reason"] for e in b.of("regrasp_refused")]
    assert reasons and reasons[-1] == "object pose stale"
    assert "object pose stale" in done["message"]


def test_a_permanent_slip_spends_the_regrasp_cap_and_fails() -> None:
    b = Bench.make(SEEDS[1], ProposeRegrasp())
    b.ls.inject("gripper", "slip")  # permanent: every lift drops the part again
    b.start()
    done = b.finish()
    assert done["outcome"] == "failed" and b.ex.mode == "holding"
    assert len(b.of("regrasp")) == 1 and b.ex.counters.regrasps == 1
    assert done["failures"] == ["lift:part_lost", "lift:part_lost"]
    second = b.of("part_lost_hold")[1]["t"]
    reasons = {e["reason"] for e in b.of("regrasp_refused") if e["t"] >= second}
    assert reasons == {"re-grasp cap reached (1 of 1)"}
    assert b.ls.fw.obj.drops == 2 and b.ls.fw.obj.drop_causes == {"slip": 2}


def test_the_expert_under_a_permanent_slip_ends_failed_in_a_controlled_hold() -> None:
    r = run_episode(ROBOT, SEEDS[2], policy=ExpertPolicy(), fault="gripper:slip")
    assert r.outcome == "failed" and r.final_mode == "holding" and not r.success
    assert r.regrasps == 1 and r.failures == ["lift:part_lost", "lift:part_lost"]


@pytest.mark.parametrize(("window_s", "cap"), [(0.0, 1), (0.5, 0)])
def test_without_a_window_or_a_cap_a_lost_part_fails_the_task(window_s: float, cap: int) -> None:
    cfg = ExecutorConfig(regrasp_window_s=window_s, max_regrasps=cap)
    b = Bench.make(SEEDS[0], ProposeRegrasp(), cfg)
    b.start()
    b.carry_then_slip(0.2)
    done = b.finish()
    assert done["outcome"] == "failed" and b.ex.mode == "holding" and not b.of("regrasp")
    if window_s == 0.0:  # exactly as before the re-grasp existed
        assert "no retry helps" in done["message"] and not b.of("part_lost_hold")
    else:
        assert {e["reason"] for e in b.of("regrasp_refused")} == {
            "re-grasp cap reached (0 of 0)"}


def test_config_rejects_bad_regrasp_numbers() -> None:
    with pytest.raises(ValueError, match="regrasp_window_s"):
        ExecutorConfig(regrasp_window_s=-1.0).check()
    with pytest.raises(ValueError, match="max_regrasps"):
        ExecutorConfig(max_regrasps=-1).check()
    with pytest.raises(ValueError, match="regrasp_rest_tol_m"):
        ExecutorConfig(regrasp_rest_tol_m=0.0).check()

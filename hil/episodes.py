"""Lock-step pick-and-place episodes: the real Executor against the simulated robot, virtual time.

    python -m hil.episodes --n 1000 --seed 1
    python -m hil.episodes --n 200 --fault gripper:weak_close --severity-range recoverable
    python -m hil.episodes --n 200 --fault gripper:weak_close --severity-range unrecoverable
    python -m hil.episodes --permanent --seed 1     # one robot, tasks until diagnostic
    python -m hil.episodes --n 200 --fault gripper:slip --transient   # a slip while carrying

Each episode is a fresh simulated robot (`hil.lockstep.Lockstep`, seeded: a random cube pose)
with the real `Executor` as the host: status frames in, one command frame per control tick out,
real protocol bytes both ways. A fault is injected before the task starts, or (`--transient`,
`fault_after_lift_s`) once the rig's part has been carried that long, lasting `duration_s`.
An episode succeeds when the executor reports `success` AND the rig's true state agrees: the
cube rests at the place pose, and no drop other than one the injected slip fault caused (the
executor's own grip letting go, or its release in the air, fails the episode; every drop is
counted and reported). Prints the success rate, attempts, the failure breakdown and the
executor's µs per tick (median / P99 / max).
"""

from __future__ import annotations

import argparse
import math
import multiprocessing
import random
import statistics
import sys
import time
import traceback
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from edge_agent.executor.collector import DeferredCollection
from edge_agent.executor.executor import Executor
from edge_agent.executor.latch import StopLatch
from edge_agent.executor.policy import AlwaysAdvancePolicy, ExpertPolicy
from edge_agent.executor.tasks import ExecutorConfig
from edge_agent.link.codec import Enable, Frame, Hello, Message, Status
from edge_agent.policy_seam import Policy
from edge_agent.robot import RobotDescription, load_robot
from edge_agent.sensors.hub import SensorHub
from hil.lockstep import Lockstep
from hil.sim.config import DEFAULT_RIG, load_rig

DEFAULT_ROBOT = DEFAULT_RIG.parents[1] / "robot" / "edge-arm-4.toml"
_NAN = float("nan")


class ExecutorHost:
    """The lock-step host: opens the session, feeds frames through the real SensorHub into the
    Executor and sends the Executor's command frame every control tick.

    Like the daemon's control loop (`RateLoop`), no garbage collection starts inside a tick.
    The status period equals the control period here (not the description's 1 kHz) to keep
    1,000 episodes affordable, so the hub's staleness window is widened to match.
    """

    def __init__(self, executor: Executor, latch: StopLatch, status_period_us: int) -> None:
        self.executor = executor
        self.latch = latch
        self.status_period_us = status_period_us
        self.hub = SensorHub(executor.robot,
                             stale_periods=max(3.0, 1.5 * status_period_us * 1e-6 * 1000.0))
        self.opened = False
        self.tick_s: list[float] = []  # wall time per executor tick (includes preemption)
        self.tick_cpu_s: list[float] = []  # this thread's CPU time per tick
        self.events: list[Mapping[str, Any]] = []
        self.commands = 0
        self._deferred = DeferredCollection()

    def tick(self, now: float, frames: Sequence[Frame]) -> list[Message]:
        with self._deferred:
            return self._tick(now, frames)

    def _tick(self, now: float, frames: Sequence[Frame]) -> list[Message]:
        out: list[Message] = []
        if not self.opened:
            out += [Hello(deadman_ms=100, status_period_us=self.status_period_us), Enable(True)]
            self.opened = True
        for f in frames:
            msg = f.msg
            self.hub.update(msg, now)
            if isinstance(msg, Status) and msg.estop_input:
                self.latch.set_hardware_input(True, now)
        snap = self.hub.snapshot(now)
        t0, c0 = time.perf_counter(), time.thread_time()
        cmd = self.executor.tick(now, snap)
        self.tick_s.append(time.perf_counter() - t0)
        self.tick_cpu_s.append(time.thread_time() - c0)
        self.events += self.executor.drain_events()
        out.append(cmd)
        self.commands += 1
        return out


@dataclass
class EpisodeResult:
    seed: int
    outcome: str
    attempts: int
    true_ok: bool
    drops: int  # every drop of the part, whatever caused it
    failures: list[str] = field(default_factory=list)
    severity: float | None = None
    final_mode: str = ""
    duration_s: float = 0.0
    place_err_m: float = _NAN
    regrasps: int = 0
    drop_causes: dict[str, int] = field(default_factory=dict)
    tick_s: list[float] = field(default_factory=list, repr=False)
    tick_cpu_s: list[float] = field(default_factory=list, repr=False)

    @property
    def success(self) -> bool:
        return self.outcome == "success" and self.true_ok


def _task_done(host: ExecutorHost, task_id: str) -> Mapping[str, Any] | None:
    for e in host.events:
        if e["type"] == "task_done" and e["task_id"] == task_id:
            return e
    return None


def transient_slip(seed: int) -> tuple[float, float]:
    """(after_lift_s, duration_s) of the transient slip of episode `seed`, drawn from the seed:
    the part slips out 0-1 s into the carry (in lift or early in transfer) and the slip ends
    within 0.1-0.8 s — while the arm holds in the re-grasp window, or shortly after."""
    rng = random.Random(f"transient-slip:{seed}")
    return round(rng.uniform(0.0, 1.0), 3), round(rng.uniform(0.1, 0.8), 3)


def _carried(ls: Lockstep) -> bool:
    obj = ls.fw.obj
    return obj.grasped and obj.lifted


def run_episode(robot: RobotDescription, seed: int, *, policy: Policy | None = None,
                config: ExecutorConfig | None = None, fault: str | None = None,
                severity: str | float | None = None, control_hz: float = 200.0,
                timeout_s: float = 60.0, fault_duration_s: float | None = None,
                fault_after_lift_s: float | None = None,
                host_cls: type[ExecutorHost] | None = None) -> EpisodeResult:
    """One task on a fresh simulated robot; the rig's truth decides whether it really worked.

    The fault starts before the task, or with `fault_after_lift_s` once the rig's part has been
    carried (grasped and lifted) that long — never, if the task ends first; it lasts
    `fault_duration_s` (None: until the episode ends). `host_cls` replaces the `ExecutorHost`
    (hil.profile_ticks plugs in one that profiles ticks).
    """
    latch = StopLatch()
    ex = Executor(robot, latch, policy, config)
    host = (host_cls or ExecutorHost)(ex, latch, status_period_us=round(1e6 / control_hz))
    rig = load_rig(None, robot)
    ls = Lockstep(robot, rig, seed=seed, host=host, host_period_s=1.0 / control_hz)
    ls.run_until_true(lambda: ex.object_samples >= 15, 3.0)
    sev = None
    target, _, mode = (fault or "").rpartition(":")  # sensor:<channel>:<mode>: two colons
    if fault is not None and fault_after_lift_s is None:
        sev = ls.inject(target, mode, fault_duration_s, severity)["severity"]
    reply = ex.start_task(ls.now, "t1")
    if not reply.ok:
        return EpisodeResult(seed, f"refused:{reply.code}", 0, False, ls.fw.obj.drops,
                             [reply.message], sev, ex.mode)
    end = ls.now + timeout_s
    if fault is not None and fault_after_lift_s is not None:
        def carried_or_done() -> bool:
            return _carried(ls) or _task_done(host, "t1") is not None

        if ls.run_until_true(carried_or_done, timeout_s, poll_s=0.002) and _carried(ls):
            ls.run_for(fault_after_lift_s)
            if _carried(ls):
                sev = ls.inject(target, mode, fault_duration_s, severity)["severity"]
    ls.run_until_true(lambda: _task_done(host, "t1") is not None, max(0.0, end - ls.now),
                      poll_s=0.05)
    done = _task_done(host, "t1")
    ls.run_for(0.2)  # let the part settle after the release
    obj = ls.fw.obj
    place = reply.result["place"]
    err = math.hypot(obj.xyz[0] - place[0], obj.xyz[1] - place[1])
    # A drop the injected slip caused does not fail the episode by itself (the part may be
    # re-grasped); one the executor caused (its grip, or its release in the air) does.
    own_drops = obj.drops - obj.drop_causes.get("slip", 0)
    true_ok = (not obj.grasped and own_drops == 0 and err < 0.015
               and abs(obj.xyz[2] - obj.rest_z) < 1e-6)
    regrasps = sum(e["type"] == "regrasp" for e in host.events)
    causes = dict(obj.drop_causes)
    if done is None:
        return EpisodeResult(seed, "timeout", 0, true_ok, obj.drops, [], sev, ex.mode,
                             timeout_s, err, regrasps, causes, host.tick_s, host.tick_cpu_s)
    return EpisodeResult(seed, done["outcome"], done["attempts"], true_ok, obj.drops,
                         done["failures"], sev, ex.mode, done["duration_s"], err, regrasps,
                         causes, host.tick_s, host.tick_cpu_s)


def _safe_episode(robot: RobotDescription, seed: int, **kw: Any) -> EpisodeResult:
    """run_episode, with a crash reported as an outcome (and its traceback) instead of raised."""
    try:
        return run_episode(robot, seed, **kw)
    except Exception as exc:
        traceback.print_exc()
        return EpisodeResult(seed, f"error:{type(exc).__name__}: {exc}", 0, False, 0)


def _transient_episode(job: partial[EpisodeResult], seed: int) -> EpisodeResult:
    """`job` with the fault injected while carrying, timed by `transient_slip(seed)`."""
    after, duration = transient_slip(seed)
    return job(seed, fault_after_lift_s=after, fault_duration_s=duration)


def _pct(xs: list[float], p: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(p * len(s)))] if s else _NAN


def run_many(args: argparse.Namespace, robot: RobotDescription) -> int:
    policy: Policy = AlwaysAdvancePolicy() if args.policy == "always_advance" else ExpertPolicy()
    t0 = time.perf_counter()
    seeds = [args.seed * 100_000 + i for i in range(args.n)]
    job = partial(_safe_episode, robot, policy=policy, fault=args.fault,
                  severity=args.severity_range, control_hz=args.control_hz)
    if args.transient:
        job = partial(_transient_episode, job)
    if args.jobs > 1:
        with multiprocessing.get_context("fork").Pool(args.jobs) as pool:
            results = pool.map(job, seeds, chunksize=4)
    else:
        results = [job(s) for s in seeds]
    for i, r in enumerate(results):
        if args.verbose and not r.success:
            print(f"  episode {i} seed {r.seed}: {r.outcome} true_ok={r.true_ok} "
                  f"drops={r.drops} err={r.place_err_m:.4f} sev={r.severity} {r.failures}")
    wall = time.perf_counter() - t0
    ok = sum(r.success for r in results)
    print(f"episodes: {len(results)}  policy: {args.policy}  fault: {args.fault or 'none'}"
          f" {args.severity_range or ''}  wall: {wall:.1f} s")
    print(f"success: {ok}/{len(results)} = {100.0 * ok / len(results):.2f} %")
    print("outcomes:", dict(Counter(r.outcome for r in results)))
    print("rig disagrees with a reported success:",
          sum(r.outcome == "success" and not r.true_ok for r in results))
    print("re-grasps:", sum(r.regrasps for r in results),
          " drops by cause:", dict(sum((Counter(r.drop_causes) for r in results), Counter())))
    print("parts dropped:", sum(r.drops for r in results),
          " failed tasks ending in holding:",
          sum(r.outcome == "failed" and r.final_mode == "holding" for r in results))
    att = Counter(r.attempts for r in results)
    print("attempts per task:", dict(sorted(att.items())))
    kinds = Counter(k for r in results for k in r.failures)
    print("failed attempts by state:kind:", dict(kinds.most_common()))
    for what, attr in (("wall", "tick_s"), ("cpu", "tick_cpu_s")):
        ticks = [t * 1e6 for r in results for t in getattr(r, attr)]
        print(f"executor tick {what} µs ({len(ticks)} ticks): median "
              f"{statistics.median(ticks):.1f} P99 {_pct(ticks, 0.99):.1f} "
              f"P99.9 {_pct(ticks, 0.999):.1f} max {max(ticks):.1f}")
    durs = [r.duration_s for r in results if r.outcome == "success"]
    if durs:
        print(f"task duration (virtual s): median {statistics.median(durs):.2f} "
              f"max {max(durs):.2f}")
    rate = ok / len(results)
    if args.severity_range == "unrecoverable":
        good = all(r.outcome == "failed" and r.final_mode == "holding" and r.drops == 0
                   for r in results)
        verdict = "every task failed in a controlled hold, no part dropped"
    elif args.fault:
        good, verdict = rate >= 0.95, "success >= 95 %"
    else:
        good, verdict = rate >= 0.995, "success >= 99.5 %"
    print(f"target ({verdict}): {'met' if good else 'NOT met'}")
    return 0 if good else 1


def run_permanent(args: argparse.Namespace, robot: RobotDescription) -> int:
    """One robot with a permanent unrecoverable weak close: tasks until diagnostic."""
    cfg = ExecutorConfig()
    latch = StopLatch()
    ex = Executor(robot, latch, ExpertPolicy(), cfg)
    host = ExecutorHost(ex, latch, status_period_us=round(1e6 / args.control_hz))
    ls = Lockstep(robot, load_rig(None, robot), seed=args.seed, host=host,
                  host_period_s=1.0 / args.control_hz)
    ls.run_for(1.0)
    sev = ls.inject("gripper", "weak_close", severity="unrecoverable")["severity"]
    failed_in_row = 0
    for k in range(10):
        tid = f"t{k}"
        reply = ex.start_task(ls.now, tid)
        if not reply.ok:
            print(f"task {tid} refused: {reply.code} {reply.message}")
            break
        def finished(tid: str = tid) -> bool:
            return _task_done(host, tid) is not None

        ls.run_until_true(finished, 60.0, 0.05)
        done = _task_done(host, tid)
        fails = [e for e in host.events if e["type"] == "attempt_failed" and e["task_id"] == tid]
        failed_in_row += len(fails)
        print(f"task {tid}: {done['outcome'] if done else 'timeout'}; failed attempts "
              f"{len(fails)}; mode {ex.mode}; L3 {ex.faults.l3_count}")
        if ex.mode == "diagnostic":
            break
    diag = [e for e in host.events if e["type"] == "diagnostic"]
    print(f"severity {sev:.3f}; consecutive failed attempts {failed_in_row}; "
          f"diagnostic: {bool(diag)}; L3 threshold {cfg.l3_threshold}; drops {ls.fw.obj.drops}")
    if diag:
        rec = diag[0]["record"]
        print(f"fault record: state={rec['state']} l3_count={rec['l3_count']} "
              f"failures={[f['kind'] for f in rec['last_failures']]} "
              f"window={rec['sensor_window']['samples']} samples")
    good = bool(diag) and failed_in_row == cfg.l3_threshold and ls.fw.obj.drops == 0
    return 0 if good else 1


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m hil.episodes", description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=100)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--fault", default=None, help="e.g. gripper:weak_close")
    ap.add_argument("--severity-range", default=None,
                    help="recoverable | unrecoverable (weak_close), or a number")
    ap.add_argument("--transient", action="store_true",
                    help="inject the fault while carrying, for a short time (transient_slip)")
    ap.add_argument("--policy", choices=("expert", "always_advance"), default="expert")
    ap.add_argument("--control-hz", type=float, default=200.0)
    ap.add_argument("--jobs", type=int, default=1, help="worker processes (results do not change)")
    ap.add_argument("--permanent", action="store_true",
                    help="one robot, permanent unrecoverable weak_close, tasks until diagnostic")
    ap.add_argument("--robot", default=str(DEFAULT_ROBOT))
    ap.add_argument("-v", "--verbose", action="store_true")
    args = ap.parse_args(argv)
    robot = load_robot(args.robot)
    if args.permanent:
        return run_permanent(args, robot)
    return run_many(args, robot)


if __name__ == "__main__":
    sys.exit(main())

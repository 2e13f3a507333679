"""Which executor ticks are slow, and what they do: per-tick CPU time with the phase, cProfile.

    python -m hil.profile_ticks --n 20 --seed 1            # timing + phase of the slowest ticks
    python -m hil.profile_ticks --n 5 --profile --top 5    # + cProfile of the slowest ticks
    python -m hil.profile_ticks --fault gripper:weak_close --severity-range recoverable

Runs the lock-step episodes of `hil.episodes` (same seeds, same executor) with a host that
records, for every `Executor.tick`, this thread's CPU time, the wall time, the machine state
before and after and the events the tick emitted (its phase: `attempt_started`, `task_done`,
...). It runs in a fresh process on purpose: first-call costs (lazy imports, caches) land on
the first ticks that need them, as they would on the daemon's control thread.

With `--profile` every tick runs under its own `cProfile.Profile` (times are inflated by the
profiler, the ranking is not) and the profiles of the `--top` slowest ticks are printed.
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import heapq
import io
import pstats
import resource
import statistics
import sys
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import ClassVar

from edge_agent.executor.executor import Executor
from edge_agent.executor.latch import StopLatch
from edge_agent.link.codec import Frame, Message
from edge_agent.robot import load_robot
from hil.episodes import DEFAULT_ROBOT, ExecutorHost, run_episode


@dataclass(order=True)
class TickSample:
    """One executor tick: its CPU time first (the heap orders on it)."""

    cpu_s: float
    wall_s: float = field(compare=False)
    episode: int = field(compare=False)
    index: int = field(compare=False)
    now: float = field(compare=False)
    before: str = field(compare=False)
    after: str = field(compare=False)
    events: tuple[str, ...] = field(compare=False)
    gc: str = field(compare=False, default="")  # cyclic collections during the tick
    os: str = field(compare=False, default="")  # page faults, context switches during the tick
    profile: str = field(compare=False, default="")


class GcWatch:
    """Collections of the cyclic garbage collector (gc.callbacks), with their CPU time."""

    def __init__(self) -> None:
        self.runs: list[tuple[int, float, int]] = []  # generation, cpu s, objects collected
        self._t0 = 0.0
        gc.callbacks.append(self._callback)

    def _callback(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._t0 = time.thread_time()
        else:
            self.runs.append((info["generation"], time.thread_time() - self._t0,
                              info["collected"]))


GC = GcWatch()


class ProfilingHost(ExecutorHost):
    """An ExecutorHost that keeps the slowest ticks (and, optionally, their profiles)."""

    profile: ClassVar[bool] = False
    keep: ClassVar[int] = 20
    exclude_gc: ClassVar[bool] = False  # keep only ticks without a collection in the list
    episode: ClassVar[int] = 0
    slowest: ClassVar[list[TickSample]] = []  # min-heap of the `keep` slowest ticks, all episodes
    phases: ClassVar[Counter[str]] = Counter()  # ticks over 1 ms by phase

    def __init__(self, executor: Executor, latch: StopLatch, status_period_us: int) -> None:
        super().__init__(executor, latch, status_period_us)
        self._index = 0

    def tick(self, now: float, frames: Sequence[Frame]) -> list[Message]:
        before = self.executor.state.value
        n_events = len(self.events)
        n_gc = len(GC.runs)
        ru0 = resource.getrusage(resource.RUSAGE_THREAD)
        prof = cProfile.Profile() if self.profile else None
        if prof is not None:
            prof.enable()
        out = super().tick(now, frames)
        if prof is not None:
            prof.disable()
        ru1 = resource.getrusage(resource.RUSAGE_THREAD)
        cpu, wall = self.tick_cpu_s[-1], self.tick_s[-1]
        sample = TickSample(cpu, wall, self.episode, self._index, now, before,
                            self.executor.state.value,
                            tuple(e["type"] for e in self.events[n_events:]))
        flt, csw = ru1.ru_minflt - ru0.ru_minflt, ru1.ru_nivcsw - ru0.ru_nivcsw
        sample.os = (f"{flt} page faults " if flt else "") + (f"{csw} preempted" if csw else "")
        sample.gc = " ".join(f"gen{g}:{t * 1e6:.0f}µs" for g, t, _ in GC.runs[n_gc:])
        self._index += 1
        if cpu > 1e-3:
            self.phases[_phase(sample)] += 1
        heap = ProfilingHost.slowest
        if sample.gc and self.exclude_gc:
            pass
        elif len(heap) < self.keep or cpu > heap[0].cpu_s:
            if prof is not None:
                sample.profile = _profile_text(prof)
            if len(heap) < self.keep:
                heapq.heappush(heap, sample)
            else:
                heapq.heapreplace(heap, sample)
        return out


def _profile_text(prof: cProfile.Profile, lines: int = 20) -> str:
    """The functions of one tick by own time, in µs (pstats prints milliseconds at best)."""
    rows = pstats.Stats(prof).stats  # type: ignore[attr-defined]
    out = io.StringIO()
    out.write(f"{'own µs':>9} {'cum µs':>9} {'calls':>6}  function\n")
    for (path, line, name), (_, calls, tt, ct, _) in sorted(
            rows.items(), key=lambda kv: -kv[1][2])[:lines]:
        where = f"{path.rsplit('/', 2)[-1]}:{line}" if line else ""
        out.write(f"{tt * 1e6:9.1f} {ct * 1e6:9.1f} {calls:6d}  {name} {where}\n")
    return out.getvalue()


def _phase(s: TickSample) -> str:
    what = ",".join(s.events) if s.events else "steady"
    return (f"{s.before}->{s.after} [{what}]" + (f" gc {s.gc}" if s.gc else "")
            + (f" os {s.os}" if s.os else ""))


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m hil.profile_ticks",
                                 description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=20)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--control-hz", type=float, default=200.0)
    ap.add_argument("--fault", default=None, help="as hil.episodes, e.g. gripper:weak_close")
    ap.add_argument("--severity-range", default=None, help="as hil.episodes")
    ap.add_argument("--top", type=int, default=15, help="slowest ticks to list")
    ap.add_argument("--profile", action="store_true", help="cProfile every tick")
    ap.add_argument("--exclude-gc", action="store_true",
                    help="list only ticks during which the garbage collector did not run")
    ap.add_argument("--robot", default=str(DEFAULT_ROBOT))
    args = ap.parse_args(argv)
    ProfilingHost.exclude_gc = args.exclude_gc
    robot = load_robot(args.robot)
    ProfilingHost.profile = args.profile
    ProfilingHost.keep = args.top
    cpu: list[float] = []
    ok = 0
    for i in range(args.n):
        ProfilingHost.episode = i
        r = run_episode(robot, args.seed * 100_000 + i, control_hz=args.control_hz,
                        fault=args.fault, severity=args.severity_range, host_cls=ProfilingHost)
        ok += r.success
        cpu += r.tick_cpu_s
    us = sorted(t * 1e6 for t in cpu)

    def pct(p: float) -> float:
        return us[min(len(us) - 1, int(p * len(us)))]

    print(f"episodes {args.n} (success {ok}); ticks {len(us)}; cpu µs median "
          f"{statistics.median(us):.1f} P99 {pct(0.99):.1f} P99.9 {pct(0.999):.1f} "
          f"max {us[-1]:.1f}; over 1 ms: {sum(t > 1000 for t in us)}")
    print("ticks over 1 ms by phase:", dict(ProfilingHost.phases.most_common()))
    print(f"slowest {len(ProfilingHost.slowest)} ticks:")
    for s in sorted(ProfilingHost.slowest, reverse=True):
        print(f"  {s.cpu_s * 1e6:9.1f} µs cpu {s.wall_s * 1e6:9.1f} µs wall  episode {s.episode}"
              f" tick {s.index} t={s.now:.3f}  {_phase(s)}")
    if args.profile:
        for s in sorted(ProfilingHost.slowest, reverse=True):
            print(f"\n=== {s.cpu_s * 1e6:.1f} µs  episode {s.episode} tick {s.index} "
                  f"{_phase(s)}\n{s.profile}")
    return 0


if __name__ == "__main__":
    time.thread_time()  # the clock itself is not a first call worth measuring
    sys.exit(main())

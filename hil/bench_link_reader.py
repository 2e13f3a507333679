"""Benchmark: the daemon's link reader per STATUS frame (`LinkMirror.on_frame` → `SensorHub`).

    python3 -m hil.bench_link_reader [--n 20000] [--repeat 3] [--profile]

Real parts throughout: the robot description configs/robot/edge-arm-4.toml, a SensorHub built
as the daemon builds it, a real StopLatch, a LinkMirror whose event sink appends to a list, and
STATUS frames from the simulated firmware (hil.sim via hil.lockstep, 1 kHz, seeded), encoded and
decoded again with the real codec. The mirror's clock advances 1 ms per frame (virtual time),
so the estimators' rate limit and the staleness logic see a real 1 kHz stream however fast the
loop runs.

Prints median / P99 / max µs per frame and the implied share of one core at 1 kHz (mean µs /
1000 µs), with and without the Kalman estimators attached (EstimatorBank.create, as the daemon
does in the background after READY), after same-run baselines: an empty function call and
decoding the frame's bytes with FrameDecoder (which the reader also pays, per frame). Compare
runs on different machines by the ratio to the decode baseline. The best of `--repeat` runs
is reported per row (median and mean; P99/max on a loaded machine are scheduler noise).
`--profile` adds a cProfile of the estimators-attached case.
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import pstats
import statistics
import time
from collections.abc import Callable
from typing import Any

from edge_agent.daemon.linkmirror import LinkMirror
from edge_agent.executor.latch import StopLatch
from edge_agent.link.codec import Enable, Frame, FrameDecoder, Hello, Status, encode
from edge_agent.robot import RobotDescription, load_robot
from edge_agent.sensors.hub import SensorHub
from edge_agent.sensors.kalman import EstimatorBank
from hil.bench_stats import figure, write_json
from hil.lockstep import Lockstep

ROBOT = "configs/robot/edge-arm-4.toml"
STATUS_PERIOD_US = 1000


def firmware_statuses(robot: RobotDescription, n: int, seed: int = 1) -> list[Status]:
    """n consecutive STATUS messages from the simulated firmware (1 kHz, session open)."""
    runner = Lockstep(robot, seed=seed)
    runner.send(Hello(deadman_ms=100, status_period_us=STATUS_PERIOD_US))
    runner.send(Enable(True))
    out: list[Status] = []
    while len(out) < n:
        runner.run_for(1.0)
        out = runner.host.of_type(Status)
    return out[:n]


class VirtualClock:
    """time.monotonic stand-in: each call is one status period later."""

    def __init__(self, start: float = 1000.0, step: float = STATUS_PERIOD_US * 1e-6) -> None:
        self.t = start
        self.step = step

    def __call__(self) -> float:
        self.t += self.step
        return self.t


def make_mirror(robot: RobotDescription, estimators: bool
                ) -> tuple[LinkMirror, SensorHub, list[dict[str, Any]]]:
    hub = SensorHub(robot, stale_periods=max(3.0, 3.0 * STATUS_PERIOD_US / 1000.0),
                    estimators=False)
    if estimators:
        hub.attach_estimators(EstimatorBank.create(robot))
    events: list[dict[str, Any]] = []
    mirror = LinkMirror(hub, StopLatch(), events.append, clock=VirtualClock())
    return mirror, hub, events


def time_calls(fn: Callable[[Any], object], items: list[Any]) -> list[int]:
    out = []
    perf = time.perf_counter_ns
    gc.collect()
    for item in items:
        t0 = perf()
        fn(item)
        out.append(perf() - t0)
    return out


def row(name: str, runs: list[list[int]]) -> float:
    """Print the best run's figures; return its mean µs."""
    best = min(runs, key=statistics.median)
    s = sorted(best)
    n = len(s)
    mean = statistics.fmean(s) / 1e3
    print(f"{name:<44} median {s[n // 2] / 1e3:7.2f}  mean {mean:7.2f}  "
          f"P99 {s[min(n - 1, int(n * 0.99))] / 1e3:7.2f}  max {s[-1] / 1e3:8.1f} µs"
          f"   {mean / 10:5.2f} % core @1 kHz")
    return mean


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=20000, help="STATUS frames per run")
    ap.add_argument("--repeat", type=int, default=3, help="runs per row (best reported)")
    ap.add_argument("--profile", action="store_true", help="cProfile the estimators case")
    ap.add_argument("--json", metavar="PATH", help="write the figure records here (hil.bench)")
    args = ap.parse_args(argv)

    robot = load_robot(ROBOT)
    statuses = firmware_statuses(robot, args.n)
    wires = [encode(s, k % 65536) for k, s in enumerate(statuses)]
    frames = [Frame(k % 65536, s) for k, s in enumerate(statuses)]
    print(f"{len(frames)} STATUS frames from the simulated firmware, {robot.name}; "
          f"µs per frame, best of {args.repeat}")

    def empty(_: object) -> None:
        return None

    row("baseline: empty call", [time_calls(empty, frames) for _ in range(args.repeat)])
    decode_runs = []
    for _ in range(args.repeat):
        dec = FrameDecoder()
        decode_runs.append(time_calls(dec.feed, wires))
    base = row("baseline: FrameDecoder.feed (one frame)", decode_runs)
    best_decode = [x / 1e3 for x in min(decode_runs, key=statistics.median)]
    records = []

    for label, est in (("no estimators", False), ("estimators attached", True)):
        runs = []
        for _ in range(args.repeat):
            mirror, hub, _events = make_mirror(robot, est)
            runs.append(time_calls(mirror.on_frame, frames))
        mean = row(f"LinkMirror.on_frame(STATUS) [{label}]", runs)
        print(f"{'':<44} = {mean / base:.2f} x decode;  counters {hub.counters()}")
        records.append(figure(
            f"link reader per STATUS frame ({label})", "µs",
            [x / 1e3 for x in min(runs, key=statistics.median)], ratio_of="p50",
            baseline=("FrameDecoder.feed, one frame", best_decode),
            notes=f"mean {mean:.2f} µs = {mean / 10:.2f} % of a core at 1 kHz; best of "
                  f"{args.repeat} runs"))
    write_json(args.json, records)

    if args.profile:
        mirror, _hub, _events = make_mirror(robot, True)
        prof = cProfile.Profile()
        prof.enable()
        for f in frames:
            mirror.on_frame(f)
        prof.disable()
        pstats.Stats(prof).sort_stats("tottime").print_stats(18)


if __name__ == "__main__":
    main()

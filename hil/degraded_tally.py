"""hil.bench_degraded's tally: one fault's tasks (`Run`) and its printed summary (`report`)."""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field


def pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, math.ceil(q * len(s)) - 1))]


def describe(xs: list[float], unit: str = "s") -> str:
    if not xs:
        return "no samples"
    return (f"median {statistics.median(xs):.3f} {unit}, P99 {pct(xs, 0.99):.3f} {unit}, "
            f"max {max(xs):.3f} {unit} (n={len(xs)})")


@dataclass
class Run:
    """One fault's tasks: outcomes, durations, latencies."""

    outcomes: list[str]
    durations: list[float]
    to_mode: list[float]
    to_recovered: list[float]
    modes: dict[str, int]
    failures: dict[str, int]
    stops: dict[str, int]
    missed_mode: int = 0
    missed_recovery: int = 0
    to_stop: list[float] = field(default_factory=list)  # a non-degradable fault's stop
    missed_stop: int = 0


def report(name: str, r: Run, base: Run | None) -> None:
    ok = r.outcomes.count("success")
    rate = 100 * ok / max(1, len(r.outcomes))
    line = f"{name}: success {ok}/{len(r.outcomes)} = {rate:.1f} %"
    if base is not None:
        b_rate = 100 * base.outcomes.count("success") / max(1, len(base.outcomes))
        line += f" (baseline {b_rate:.1f} %, target >= 95 %)"
    print(line)
    others = {o: r.outcomes.count(o) for o in sorted(set(r.outcomes)) if o != "success"}
    if others:
        print(f"  other outcomes: {others}; why: {r.failures}")
    ratio = ""
    if base is not None and base.durations and r.durations:
        ratio = f"; {statistics.median(r.durations) / statistics.median(base.durations):.2f}x " \
                "the baseline's median"
    print(f"  task duration: {describe(r.durations)}{ratio}")
    print(f"  protective stops during the tasks (by cause): {r.stops or 'none'}")
    print(f"  modes entered during the tasks: {r.modes or 'none'}")
    if base is None:
        return
    if r.to_stop or r.missed_stop:
        print(f"  fault -> protective stop (not degradable; success = completed after reset + "
              f"resume): {describe(r.to_stop)}; no stop: {r.missed_stop}")
    print(f"  fault -> mode (degraded event): {describe(r.to_mode)}; no event: {r.missed_mode}")
    print(f"  fault end -> recovered event:  {describe(r.to_recovered)}; "
          f"none: {r.missed_recovery}")


def figures(base: Run, results: list[tuple[str, Run]]) -> list[dict[str, object]]:
    """The `--json` figure records (hil.bench): per fault, the task duration beside the
    no-fault baseline's, the target on the success rate (≥ 95 %)."""
    from hil.bench_stats import figure, target

    out = []
    for name, r in results:
        ok = r.outcomes.count("success")
        rate = 100 * ok / max(1, len(r.outcomes))
        lat = (f"fault → stop median {statistics.median(r.to_stop):.3f} s" if r.to_stop else
               f"fault → mode median {statistics.median(r.to_mode):.3f} s" if r.to_mode else
               "no mode event")
        out.append(figure(
            f"pick-and-place task under `{name}`", "s", r.durations, ratio_of="p50",
            baseline=("no fault", base.durations),
            tgt=target("success ≥ 95 %", 95.0, rate, at_least=True),
            notes=f"success {ok}/{len(r.outcomes)} = {rate:.0f} % (baseline "
                  f"{base.outcomes.count('success')}/{len(base.outcomes)}); {lat}; modes "
                  f"{r.modes or 'none'}"))
    return out

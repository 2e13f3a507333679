"""Median / P99 / max of a sample in ms, its printed row, and an on/off ratio: the same-run
comparison of the observer benches (hil/bench_shadow.py, hil/bench_recorder.py)."""

from __future__ import annotations


def stats(xs: list[float]) -> dict[str, float]:
    """n, p50, p99 and max of `xs` (only n = 0 when empty)."""
    s = sorted(xs)
    if not s:
        return {"n": 0}
    return {"n": len(s), "p50": s[len(s) // 2], "p99": s[min(len(s) - 1, int(0.99 * len(s)))],
            "max": s[-1]}


def fmt(name: str, s: dict[str, float], extra: str = "") -> str:
    if not s.get("n"):
        return f"{name}: no samples"
    return (f"{name}: n={s['n']:.0f}  median {s['p50']:.3f} ms  P99 {s['p99']:.3f} ms  "
            f"max {s['max']:.3f} ms{extra}")


def ratio(on: dict[str, float], off: dict[str, float], key: str) -> str:
    """on[key] / off[key], or "-" when either has no samples or off's is 0."""
    if not on.get("n") or not off.get("n") or not off[key]:
        return "-"
    return f"{on[key] / off[key]:.2f}"

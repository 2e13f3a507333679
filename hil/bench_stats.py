"""Median / P99 / max of a sample in ms, its printed row, and an on/off ratio: the same-run
comparison of the observer benches (hil/bench_shadow.py, hil/bench_recorder.py); and the figure
records every bench writes with `--json PATH` for `python -m hil.bench` (hil/bench.py)."""

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


# --------------------------------------------------------------------------- `--json` records
# Each bench's `--json PATH` writes {"figures": [figure(...), ...], "extra": {...}}; hil.bench
# runs the benches and adds the machine, the steal and the wall time of each one's window.

def pct(xs: list[float], q: float) -> float:
    """The sample at index int(q·n) of the sorted samples (as stats() takes the P99)."""
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))]


def target(text: str, value: float | None, actual: float | None, *, at_least: bool = False,
           met: bool | None = None) -> dict[str, object]:
    """A target: its words, its number, and whether `actual` meets it (≤ value, or ≥ with
    `at_least`; `met` given: a compound target the caller judged); None when unknown."""
    if met is None and value is not None and actual is not None and actual == actual:
        met = actual >= value if at_least else actual <= value
    return {"text": text, "value": value, "met": met}


def quantiles(xs: list[float], most: int = 1000) -> list[float]:
    """At most `most` evenly spaced order statistics of `xs`, the min and max included: a
    distribution plot's worth that keeps the tail."""
    s = sorted(xs)
    if len(s) <= most:
        return [round(x, 6) for x in s]
    return [round(s[round(k * (len(s) - 1) / (most - 1))], 6) for k in range(most)]


def worst_per_bucket(series: list[tuple[float, float]], most: int = 2000
                     ) -> list[list[float]]:
    """At most `most` (t, value) points: consecutive buckets, each its largest value (at the
    bucket's first t), so a plot over time keeps every spike."""
    k = max(1, -(-len(series) // most))
    return [[round(series[i][0], 4), round(max(v for _, v in series[i:i + k]), 4)]
            for i in range(0, len(series), k)]


def figure(name: str, unit: str, xs: list[float] | None = None, *,
           st: dict[str, float] | None = None,
           baseline: tuple[str, list[float] | dict[str, float]] | None = None,
           ratio_of: str = "p99", tgt: dict[str, object] | None = None, notes: str = "",
           samples: bool = False, series: list[tuple[float, float]] | None = None,
           skipped: str | None = None) -> dict[str, object]:
    """One figure's record: median / P99 / max / n of `xs` (or the precomputed `st`: n, p50,
    p99, max), its baseline's median and P99 and the ratio of `ratio_of` ("p50", "p99"), the
    target, notes; `samples` keeps up to 1,000 quantiles of xs and of the baseline (a
    distribution plot), `series` (t, value) points, the worst per bucket (a plot over time)."""
    s = st if st is not None else stats(xs or [])
    rec: dict[str, object] = {"name": name, "unit": unit, "n": int(s.get("n", 0)),
                              "median": s.get("p50"), "p99": s.get("p99"), "max": s.get("max"),
                              "baseline": None, "ratio": None, "ratio_of": ratio_of,
                              "target": tgt, "notes": notes}
    if baseline is not None:
        bname, b = baseline
        bs = b if isinstance(b, dict) else stats(b)
        rec["baseline"] = {"name": bname, "median": bs.get("p50"), "p99": bs.get("p99"),
                           "n": int(bs.get("n", 0))}
        on, off = s.get(ratio_of), bs.get(ratio_of)
        if on is not None and off:
            rec["ratio"] = round(on / off, 3)
        if samples and not isinstance(b, dict):
            rec["baseline_samples"] = quantiles(b)
    if samples and xs:
        rec["samples"] = quantiles(xs)
    if series:
        rec["series"] = worst_per_bucket(series)
    if skipped:
        rec["skipped"] = skipped
    return rec


def write_json(path: str | None, figures: list[dict[str, object]], **extra: object) -> None:
    """The `--json PATH` file (nothing when path is None)."""
    if not path:
        return
    import json
    from pathlib import Path

    Path(path).write_text(json.dumps({"figures": figures, "extra": extra}, indent=1,
                                     default=str))

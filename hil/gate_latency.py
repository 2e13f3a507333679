"""Decision latency of candidate vs current: real onnxruntime sessions, the same observations.

Both sessions are built as the daemon builds its local one (CPU provider unless the config names
others, `inference.intra_op_threads`), warmed up, then timed one decision at a time (batch of 1,
as on the robot) on the same observation, interleaved — candidate first on even observations,
current first on odd ones — so both share the machine's conditions (load, frequency, caches).

Each observation is decided `REPEATS` times by each model (still interleaved). Two sets of
figures: `raw` over every timed decision (what a loaded machine adds: preemption, other
processes), and the per-observation best of the repeats (`p50_ms`, `p99_ms`, `max_ms`: the
model's own cost on that input, with the scheduler's additive noise taken out). The gate's
budget is judged on the latter: on a shared 2-core machine a raw P99 moves by a millisecond
between two runs of the same model, a model's own cost does not.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

WARMUP = 100
REPEATS = 3


def percentiles(ms: Sequence[float]) -> dict[str, float]:
    import numpy as np

    a = np.asarray(ms, dtype=np.float64)
    return {"p50_ms": round(float(np.percentile(a, 50)), 4),
            "p99_ms": round(float(np.percentile(a, 99)), 4),
            "max_ms": round(float(a.max()), 4), "n": len(ms)}


def measure(current: bytes, candidate: bytes, observations: Sequence[Sequence[float]], *,
            intra_op_threads: int = 1,
            providers: Sequence[str] = ("CPUExecutionProvider",)) -> dict[str, Any]:
    """{"current": {p50_ms, p99_ms, max_ms, n}, "candidate": {...}, ...}."""
    import numpy as np

    from hil.policy_eval import OnnxPolicy

    if not observations:
        raise ValueError("no observation to time decisions on")
    sessions = {name: OnnxPolicy(m, intra_op_threads, providers)
                for name, m in (("current", current), ("candidate", candidate))}
    rows = [np.asarray([o], dtype=np.float32) for o in observations]
    for _ in range(max(1, WARMUP // len(rows) + 1)):
        for r in rows[:WARMUP]:
            for s in sessions.values():
                s.session.run(None, {s.input_name: r})
    raw: dict[str, list[float]] = {"current": [], "candidate": []}
    best: dict[str, list[float]] = {"current": [], "candidate": []}
    order = (("candidate", "current"), ("current", "candidate"))
    clock = time.perf_counter_ns
    for i, r in enumerate(rows):
        mine: dict[str, list[float]] = {"current": [], "candidate": []}
        for k in range(REPEATS):
            for name in order[(i + k) % 2]:
                s = sessions[name]
                t0 = clock()
                s.session.run(None, {s.input_name: r})
                mine[name].append((clock() - t0) / 1e6)
        for name, ts in mine.items():
            raw[name] += ts
            best[name].append(min(ts))
    return {"current": {**percentiles(best["current"]), "raw": percentiles(raw["current"])},
            "candidate": {**percentiles(best["candidate"]),
                          "raw": percentiles(raw["candidate"])},
            "observations": len(rows), "warmup": WARMUP, "repeats": REPEATS,
            "providers": list(providers), "intra_op_threads": intra_op_threads,
            "method": f"batch of 1, interleaved on the same observations (from the gate's "
                      f"episodes of the current model); per observation the best of {REPEATS} "
                      "(raw: every decision)"}

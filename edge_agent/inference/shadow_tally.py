"""The shadow's figures: agreement with the acting policy, confusion and latency, per state.

Pure (no threads, no I/O): `ShadowTally.count(...)` takes one compared decision — the executor
state, the acting action and the shadow's, both latencies, the acting decision's task id and
step — and `summary()` gives what `status.model.shadow` and the shadow report carry. Latencies
are kept in bounded rings (the newest `LATENCY_WINDOW` per state and overall), so a shadow left
running for days holds a fixed amount of memory; percentiles are over those rings.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from edge_agent.contract.status_model import ShadowLatency

LATENCY_WINDOW = 4096
MAX_EXAMPLES = 20  # differing decisions kept for the report (the first ones)
EXAMPLES_PER_KIND = 3  # of one (state, acting, shadow): a run of one difference is one example


def percentile(values: Iterable[float], q: float) -> float | None:
    """The q-quantile (0..1) by nearest rank; None for no values."""
    xs = sorted(values)
    if not xs:
        return None
    k = min(len(xs) - 1, max(0, math.ceil(q * len(xs)) - 1))
    return xs[k]


class _Latencies:
    __slots__ = ("acting", "shadow")

    def __init__(self) -> None:
        self.acting: deque[float] = deque(maxlen=LATENCY_WINDOW)
        self.shadow: deque[float] = deque(maxlen=LATENCY_WINDOW)

    def figures(self) -> ShadowLatency:
        def r(v: float | None) -> float | None:
            return None if v is None else round(v, 4)
        return {"acting_p50_ms": r(percentile(self.acting, 0.5)),
                "acting_p99_ms": r(percentile(self.acting, 0.99)),
                "shadow_p50_ms": r(percentile(self.shadow, 0.5)),
                "shadow_p99_ms": r(percentile(self.shadow, 0.99))}


class ShadowTally:
    """Counts of compared decisions (see the module docstring)."""

    def __init__(self) -> None:
        self.decisions = 0
        self.agree = 0
        self.per_state: dict[str, list[int]] = {}  # state -> [decisions, agree]
        self.confusion: dict[str, dict[str, int]] = {}  # acting -> shadow -> n
        self.examples: list[dict[str, Any]] = []
        self._example_kinds: dict[tuple[str, str, str], int] = {}
        self.differ = 0
        self._lat: dict[str, _Latencies] = {}
        self._all = _Latencies()

    def count(self, state: str, acting: str, shadow: str, acting_ms: float, shadow_ms: float,
              task_id: str | None = None, step: int | None = None,
              backend: str | None = None) -> bool:
        """One compared decision; True when the shadow agreed with the acting policy."""
        same = acting == shadow
        self.decisions += 1
        self.agree += same
        row = self.per_state.setdefault(state, [0, 0])
        row[0] += 1
        row[1] += same
        c = self.confusion.setdefault(acting, {})
        c[shadow] = c.get(shadow, 0) + 1
        lat = self._lat.get(state)
        if lat is None:
            lat = self._lat[state] = _Latencies()
        for ring in (lat, self._all):
            if math.isfinite(acting_ms):
                ring.acting.append(acting_ms)
            ring.shadow.append(shadow_ms)
        if not same:
            self.differ += 1
            kind = (state, acting, shadow)
            seen = self._example_kinds.get(kind, 0)
            if len(self.examples) < MAX_EXAMPLES and seen < EXAMPLES_PER_KIND:
                self._example_kinds[kind] = seen + 1
                self.examples.append({"task_id": task_id, "step": step, "state": state,
                                      "acting": acting, "shadow": shadow,
                                      "acting_backend": backend})
        return same

    def summary(self) -> dict[str, Any]:
        """Agreement overall and per state, latency figures, confusion and examples."""
        per = {s: {"decisions": n, "agreement": _ratio(a, n), **self._lat[s].figures()}
               for s, (n, a) in sorted(self.per_state.items())}
        return {"decisions": self.decisions, "agreement": _ratio(self.agree, self.decisions),
                "differ": self.differ, "per_state": per, "latency": self._all.figures(),
                "confusion": {a: dict(sorted(row.items()))
                              for a, row in sorted(self.confusion.items())},
                "examples": list(self.examples)}


def _ratio(a: int, n: int) -> float | None:
    return round(a / n, 4) if n else None


def agreement_text(summary: Mapping[str, Any]) -> str:
    """`97.5 % of 2000 decisions` (or `no decisions yet`)."""
    n, a = summary.get("decisions") or 0, summary.get("agreement")
    return "no decisions yet" if not n or a is None else f"{100 * a:.1f} % of {n} decisions"

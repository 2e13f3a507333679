"""Cumulative tallies the metrics endpoint reads on a scrape: fixed-bucket histograms and
counters by label, one `observe`/`inc` each (a bisect over a dozen edges and an increment; no
allocation, no lock: an increment under the GIL may lose a count against a concurrent reader
only in the scrape's copy, never in the tally).

Process-wide (one daemon per process): the parts that measure (the inference router, the Triton
worker, the stop path) have no handle on the daemon, and importing this module costs nothing
(no prometheus_client). Buckets sit at the targets (docs/OBSERVE.md "Metrics"): e-stop reaction
≤ 1 ms, decision latency and the Triton round trip inside the 20 ms request deadline.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Sequence


class Histo:
    """One histogram: counts per bucket (`le` upper edges, seconds; the last bucket is +Inf)."""

    __slots__ = ("counts", "edges", "n", "total")

    def __init__(self, edges: Sequence[float]) -> None:
        self.edges = tuple(edges)
        self.counts = [0] * (len(self.edges) + 1)
        self.total = 0.0
        self.n = 0

    def observe(self, v: float) -> None:
        self.counts[bisect_left(self.edges, v)] += 1
        self.total += v
        self.n += 1

    def cumulative(self) -> list[tuple[str, float]]:
        """(le, cumulative count) with '+Inf' last: prometheus_client's HistogramMetricFamily."""
        out, seen = [], 0
        for edge, c in zip((*map(str, self.edges), "+Inf"), list(self.counts), strict=True):
            seen += c
            out.append((edge, float(seen)))
        return out


class LabeledHisto:
    """Histograms by one label value (the decision's backend): created on first use."""

    def __init__(self, edges: Sequence[float]) -> None:
        self.edges = tuple(edges)
        self.by: dict[str, Histo] = {}

    def observe(self, label: str, v: float) -> None:
        h = self.by.get(label)
        if h is None:
            h = self.by.setdefault(label, Histo(self.edges))
        h.observe(v)


class LabeledCount:
    """Counts by one label value (stops by cause)."""

    def __init__(self) -> None:
        self.by: dict[str, int] = {}

    def inc(self, label: str) -> None:
        self.by[label] = self.by.get(label, 0) + 1


# e-stop reaction in the daemon: the e-stop call to the STOP frame handed to the guardian
ESTOP_EDGES = (0.0001, 0.00025, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.05)
# a policy decision, request to answer (per backend); the Triton request's gRPC round trip
DECISION_EDGES = (0.0005, 0.001, 0.002, 0.004, 0.008, 0.012, 0.02, 0.05, 0.1)

ESTOP_REACTION = Histo(ESTOP_EDGES)
DECISION_LATENCY = LabeledHisto(DECISION_EDGES)
TRITON_ROUND_TRIP = Histo(DECISION_EDGES)
STOPS = LabeledCount()  # latched stops by first cause (the latch's listener)

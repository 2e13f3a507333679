"""The Prometheus collector: on each scrape, one `status` snapshot plus the cumulative tallies
(tally.py) and the control loop's own 50 µs histograms, turned into metric families.

Why a custom collector and not prometheus_client's Counter/Gauge objects updated in place: the
daemon already counts everything `status` shows (loop ticks, reports by sink, probe levels...);
copying each change into a metric object would add work to the threads that count, the control
thread among them. Read on a scrape (on the exposition's own thread), they cost the daemon
nothing between scrapes. Histograms need every observation: the loop's lateness and tick time
come from the loop's existing bins (LoopStats: 50 µs bins to 5 ms), the rest from tally.py's
O(1) observes where they are measured. Names by Prometheus conventions: `edge_agent_` prefix,
seconds and bytes, counters end in `_total`. docs/OBSERVE.md "Metrics" lists them.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from edge_agent.daemon.trial_store import COMMITTED, ON_TRIAL, PENDING, ROLLED_BACK, ROLLING_BACK
from edge_agent.executor.loop import HIST_BIN_S, HIST_BINS
from edge_agent.metrics import tally

if TYPE_CHECKING:
    from edge_agent.contract.status_observe import LiveViewStatus
    from edge_agent.executor.loop import LoopStats

P = "edge_agent_"
# loop lateness / tick duration: upper edges on the loop's 50 µs bins (≤ 4.95 ms: the last bin
# holds everything later); the lateness target is P99 ≤ 0.5 ms (console_format.py)
LOOP_EDGES_BINS = (1, 2, 5, 10, 20, 40, 80)  # × 50 µs: 0.05 0.1 0.25 0.5 1 2 4 ms
LEVELS = {"ok": 0, "warn": 1, "error": 2, "stale": 3}
TRIAL_STATES = (PENDING, ON_TRIAL, COMMITTED, ROLLING_BACK, ROLLED_BACK)


class MetricsSource(Protocol):
    """What the collector reads (the wiring adapts the daemon to it)."""

    def status(self) -> Mapping[str, Any]: ...
    def loop_stats(self) -> LoopStats | None: ...
    def journal_files(self) -> Sequence[Path]: ...
    def live_status(self) -> LiveViewStatus | None: ...


def loop_histogram(name: str, doc: str, hist: list[int]) -> HistogramMetricFamily:
    """A cumulative histogram from the loop's 50 µs bins; `_sum` from bin midpoints (the loop
    keeps counts, not sums: within 25 µs a tick)."""
    counts = list(hist)  # one copy: the loop thread goes on counting
    buckets, seen, prev = [], 0, 0
    for k in LOOP_EDGES_BINS:
        seen += sum(counts[prev:k])
        prev = k
        buckets.append((repr(round(k * HIST_BIN_S, 6)), float(seen)))
    buckets.append(("+Inf", float(sum(counts))))
    total = sum(n * (i + 0.5) * HIST_BIN_S for i, n in enumerate(counts[:HIST_BINS]))
    return HistogramMetricFamily(name, doc, buckets=buckets, sum_value=total)


def tally_histogram(fam: HistogramMetricFamily, h: tally.Histo, labels: list[str]) -> None:
    fam.add_metric(labels, h.cumulative(), h.total)


class StatusCollector(Collector):
    """Everything the endpoint shows, built from one snapshot per scrape."""

    def __init__(self, source: MetricsSource) -> None:
        self.source = source

    def collect(self) -> Iterator[Metric]:
        st = self.source.status()
        yield from self._daemon(st)
        yield from self._loop(st.get("loop"))
        yield from self._health(st.get("health"), st.get("degraded") or [])
        yield from self._inference(st.get("inference"))
        yield from self._reports(st.get("reports"))
        yield from self._journal(st.get("journal"))
        yield from self._model(st.get("model"))
        yield from self._stops(st)
        yield from self._live(self.source.live_status())

    def _daemon(self, st: Mapping[str, Any]) -> Iterator[Metric]:
        info = GaugeMetricFamily(P + "info", "The daemon (always 1)",
                                 labels=["device", "version", "boot_id"])
        info.add_metric([str(st.get("device")), str(st.get("version")),
                         str(st.get("boot_id"))], 1)
        yield info
        yield GaugeMetricFamily(P + "uptime_seconds", "Since the process started",
                                value=float(st.get("uptime_s") or 0.0))
        mode = GaugeMetricFamily(P + "mode", "The executor's mode (1 for the current one)",
                                 labels=["mode", "state"])
        mode.add_metric([str(st.get("mode")), str(st.get("state"))], 1)
        yield mode
        yield GaugeMetricFamily(P + "link_up", "The robot link is up (1) or down (0)",
                                value=float(bool(st.get("link_up"))))
        yield GaugeMetricFamily(P + "mqtt_connected", "Subscribed to the broker (1) or not",
                                value=float(bool(st.get("mqtt_connected"))))
        link = st.get("link") or {}
        yield CounterMetricFamily(P + "link_frames", "Frames received from the link guardian",
                                  value=float(link.get("frames") or 0))
        watch = link.get("watch") or {}
        yield CounterMetricFamily(P + "deadman_trips", "Command-stream deadman trips",
                                  value=float(watch.get("trips") or 0))

    def _loop(self, loop: dict[str, Any] | None) -> Iterator[Metric]:
        stats = self.source.loop_stats()
        if stats is None or loop is None:
            return
        for key, doc in (("ticks", "Control loop ticks"),
                         ("overruns", "Ticks started late (after the spin window)"),
                         ("missed_periods", "Whole periods skipped after a long tick"),
                         ("tick_errors", "Ticks that raised")):
            yield CounterMetricFamily(P + "loop_" + key, doc, value=float(loop.get(key) or 0))
        yield loop_histogram(P + "loop_lateness_seconds",
                             "How late each control tick started after its deadline",
                             stats.late_hist)
        yield loop_histogram(P + "loop_tick_duration_seconds", "How long each control tick ran",
                             stats.tick_hist)
        yield GaugeMetricFamily(P + "loop_max_lateness_seconds", "The latest tick start so far",
                                value=float(loop.get("max_late_ms") or 0.0) / 1e3)
        gc = (loop.get("gc") or {}).get("collections") or []
        fam = CounterMetricFamily(P + "gc_collections", "Python garbage collections",
                                  labels=["generation"])
        for gen, n in enumerate(gc):
            fam.add_metric([str(gen)], float(n))
        yield fam

    def _health(self, health: dict[str, Any] | None,
                degraded: list[str]) -> Iterator[Metric]:
        level = GaugeMetricFamily(P + "health_probe_level",
                                  "Each health probe's last level: 0 ok, 1 warn, 2 error, 3 stale",
                                  labels=["probe"])
        modes = GaugeMetricFamily(P + "degraded", "Degradation modes: 1 while in the mode",
                                  labels=["mode"])
        known = set(degraded)
        for name, p in ((health or {}).get("probes") or {}).items():
            level.add_metric([name], float(LEVELS.get(str(p.get("level")), 3)))
            if p.get("mode"):
                known.add(str(p["mode"]))
        for m in sorted(known):
            modes.add_metric([m], float(m in degraded))
        yield level
        yield modes

    def _inference(self, inf: dict[str, Any] | None) -> Iterator[Metric]:
        lat = HistogramMetricFamily(P + "decision_latency_seconds",
                                    "Policy decisions, request to answer, by backend",
                                    labels=["backend"])
        for backend, h in sorted(tally.DECISION_LATENCY.by.items()):
            tally_histogram(lat, h, [backend])
        yield lat
        rtt = HistogramMetricFamily(P + "triton_round_trip_seconds",
                                    "Triton inference requests answered, gRPC round trip")
        tally_histogram(rtt, tally.TRITON_ROUND_TRIP, [])
        yield rtt
        if inf is None:
            return
        for key, doc in (("decisions", "Policy decisions made"),
                         ("fallbacks", "Decisions that fell back to a later backend"),
                         ("no_decisions", "Decision requests no backend answered")):
            yield CounterMetricFamily(P + "inference_" + key, doc, value=float(inf.get(key) or 0))
        ready = GaugeMetricFamily(P + "inference_backend_ready", "A backend can decide (1)",
                                  labels=["backend"])
        runs = CounterMetricFamily(P + "inference_backend_runs", "Runs by backend",
                                   labels=["backend"])
        fails = CounterMetricFamily(P + "inference_backend_failures", "Failed runs by backend",
                                    labels=["backend"])
        for b in inf.get("backends") or []:
            name = str(b.get("name"))
            ready.add_metric([name], float(bool(b.get("ready"))))
            runs.add_metric([name], float(b.get("runs") or 0))
            fails.add_metric([name], float(b.get("failures") or 0))
        yield ready
        yield runs
        yield fails

    def _reports(self, rep: dict[str, Any] | None) -> Iterator[Metric]:
        if rep is None:
            return
        yield GaugeMetricFamily(P + "reports_outbox_pending",
                                "Reports in the outbox not yet delivered to every sink",
                                value=float(rep.get("pending") or 0))
        fam = CounterMetricFamily(P + "reports", "Report deliveries by sink and result",
                                  labels=["sink", "result"])
        for result, key in (("delivered", "delivered"), ("failed", "failed_attempts")):
            for sink, n in sorted((rep.get(key) or {}).items()):
                fam.add_metric([sink, result], float(n))
        yield fam
        yield CounterMetricFamily(P + "reports_built", "Reports built",
                                  value=float(rep.get("built") or 0))
        yield CounterMetricFamily(P + "reports_dropped", "Reports dropped (outbox full)",
                                  value=float(rep.get("dropped") or 0))

    def _journal(self, j: dict[str, Any] | None) -> Iterator[Metric]:
        size = 0
        for f in self.source.journal_files():
            try:
                size += os.stat(f).st_size
            except OSError:
                continue  # rotated away between the listing and the stat
        yield GaugeMetricFamily(P + "journal_bytes",
                                "The journals' segment files on disk (decisions, episodes, shadow)",
                                value=float(size))
        if j is None:
            return
        for key, doc in (("written", "Decision records written"),
                         ("dropped", "Decision records dropped (writer queue full)"),
                         ("shed", "Decision records shed under storage_low")):
            yield CounterMetricFamily(P + "journal_records_" + key, doc,
                                      value=float(j.get(key) or 0))

    def _model(self, model: dict[str, Any] | None) -> Iterator[Metric]:
        if model is None:
            return
        cur = model.get("current") or {}
        info = GaugeMetricFamily(P + "model_info", "The policy model in use (always 1)",
                                 labels=["name", "version", "sha256"])
        if cur:
            info.add_metric([str(cur.get("name")), str(cur.get("version")),
                             str(cur.get("sha256"))], 1)
        yield info
        trial = model.get("trial") or {}
        fam = GaugeMetricFamily(P + "model_trial_state",
                                "The last model trial's state (1 for its state)",
                                labels=["state"])
        for s in TRIAL_STATES:
            fam.add_metric([s], float(trial.get("state") == s))
        yield fam
        yield GaugeMetricFamily(P + "model_trial_tasks_done", "Tasks done on the model on trial",
                                value=float(trial.get("tasks_done") or 0))
        yield GaugeMetricFamily(P + "model_bad", "Models marked bad (never loaded again)",
                                value=float(len(model.get("bad") or [])))

    def _stops(self, st: Mapping[str, Any]) -> Iterator[Metric]:
        yield GaugeMetricFamily(P + "stop_latched", "A stop is latched (1) until reset",
                                value=float(bool(st.get("stop"))))
        fam = CounterMetricFamily(P + "stops", "Stop causes latched since start, by cause",
                                  labels=["cause"])
        for cause, n in sorted(tally.STOPS.by.items()):
            fam.add_metric([cause], float(n))
        yield fam
        est = HistogramMetricFamily(P + "estop_reaction_seconds",
                                    "An e-stop call to its STOP frame handed to the guardian")
        tally_histogram(est, tally.ESTOP_REACTION, [])
        yield est

    def _live(self, live: LiveViewStatus | None) -> Iterator[Metric]:
        """The live Foxglove view, when it runs (observe.foxglove_port)."""
        if live is None:
            return
        sent = CounterMetricFamily(P + "liveview_messages", "Messages sent to the live view",
                                   labels=["topic"])
        limited = CounterMetricFamily(P + "liveview_limited",
                                      "Messages the live view's rate limit dropped",
                                      labels=["topic"])
        for fam, counts in ((sent, live["sent"]), (limited, live["limited"])):
            for topic, n in sorted(counts.items()):
                fam.add_metric([topic], float(n))
        yield sent
        yield limited
        yield CounterMetricFamily(P + "liveview_cpu_seconds",
                                  "CPU time of the live view's pump thread",
                                  value=float(live["cpu_s"]))
        tap = live["tap"]
        yield CounterMetricFamily(P + "liveview_tap_dropped",
                                  "Tap items the live view lost to a full queue (resets when "
                                  "the viewers' subscriptions change)",
                                  value=float(tap["dropped"] if tap is not None else 0))

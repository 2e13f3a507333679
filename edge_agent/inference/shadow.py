"""The shadow runner: a candidate model run beside the acting policy, on the same observations,
off the control thread, never acting.

    runner = ShadowRunner(session, card, record=journal.record_shadow, report_after=2000,
                          on_report=file_report)
    runner.start()
    runner.offer(decision_record, task_id, step)   # the control thread: an append, no model run
    runner.stop()                                    # idempotent; the final summary

`offer()` is called by the decision sink for every decision the router made (on the control
thread): one append to a bounded deque (`QUEUE_MAX`; when full the oldest is dropped, counted in
`dropped`) — no lock, no wake-up: signalling the worker per decision handed the GIL to it in the
middle of the control thread's tick (measured: `offer()` P99 0.8 ms, max 9.8 ms with an Event per
decision, hil/bench_shadow.py --in-process). The worker (`shadow` thread) wakes every `POLL_S` on
its own, drains the queue and runs the candidate's own onnxruntime session for each decision
(CPU, one intra-op thread; onnxruntime releases the GIL in `run`) for at most `BUDGET` of each
poll period (the rest waits for the next one, or is dropped when the queue is full). At
`priority` > 0 the worker runs at SCHED_FIFO that priority (below the control thread's): the
worker holds the GIL for some tens of µs around each run, and a SCHED_OTHER worker preempted by
other processes while it holds it made a control tick that woke then wait for it — tick
lateness P99 1.27 ms against 0.13 ms without a shadow, 0.19 ms with the worker at SCHED_FIFO 1
(a 200 Hz loop thread at SCHED_FIFO 20 shadowing every tick on a loaded 2-core VM,
hil/bench_shadow.py --in-process); the budget keeps a slow candidate from taking a core at that
priority. The worker compares its action with the one that acted, counts
(inference/shadow_tally.py), and journals the shadow decision (store/decisions.py
`record_shadow`: its own journal, marked `shadow:<sha>`).
After `report_after` compared decisions `on_report(summary)` is called once (on the worker);
`stop()` returns the final summary for the report filed when the shadow is stopped.
"""

from __future__ import annotations

import math
import os
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from edge_agent.inference.shadow_tally import ShadowTally
from edge_agent.log import get_logger
from edge_agent.observe import channels as obs
from edge_agent.observe.tap import TAP
from edge_agent.policy_seam import Action

if TYPE_CHECKING:
    from edge_agent.inference.backend import DecisionRecord
    from edge_agent.inference.model_card import ModelCard

log = get_logger(__name__)
QUEUE_MAX = 256  # ~2.5 s of decisions at 100 Hz: the worker is far behind when it drops
POLL_S = 0.02  # the worker drains the queue this often (a decision waits at most this long)
BUDGET = 0.25  # of each poll period the worker may spend: the rest waits (or is dropped)
_LABELS = tuple(a.name.lower() for a in Action)
ShadowRecordSink = Callable[[Mapping[str, Any], "str | None", "int | None"], bool]


class ShadowRunner:
    """See the module docstring. `clock` in seconds (perf_counter), injectable for tests."""

    def __init__(self, session: Any, card: ModelCard, *, record: ShadowRecordSink | None = None,
                 report_after: int = 2000,
                 on_report: Callable[[dict[str, Any]], None] | None = None,
                 queue_max: int = QUEUE_MAX, poll_s: float = POLL_S, priority: int = 0,
                 clock: Callable[[], float] = time.perf_counter,
                 wall: Callable[[], float] = time.time) -> None:
        self.session = session
        self.card = card
        self.backend = f"shadow:{card.sha256[:12]}"
        self.report_after = report_after
        self.since = wall()
        self._record = record
        self._on_report = on_report
        self._clock = clock
        self._x_name = session.get_inputs()[0].name
        # deque append/popleft are atomic: the control thread appends, the worker pops
        self._q: deque[tuple[DecisionRecord, str | None, int | None]] = deque(maxlen=queue_max)
        self._poll_s = poll_s
        self.priority = priority  # SCHED_FIFO of the worker (0: the creator's policy)
        self.scheduling = "SCHED_OTHER"
        self._stop = threading.Event()
        self._tally_lock = threading.Lock()
        self.tally = ShadowTally()
        self.offered = 0  # by the control thread only
        self.taken = 0  # by the worker only
        self.skipped = 0  # acting "no decision": nothing to compare
        self.errors = 0  # the candidate's run raised or gave unusable scores
        self.last_error: str | None = None
        self.journaled = 0
        self.reported = False
        self._thread: threading.Thread | None = None

    # -- the control thread ----------------------------------------------------------------
    def offer(self, rec: DecisionRecord, task_id: str | None = None,
              step: int | None = None) -> None:
        """Hand one acting decision over; never blocks on the model, never raises."""
        if rec.action is None:
            self.skipped += 1
            return
        self.offered += 1
        self._q.append((rec, task_id, step))  # a full deque drops its oldest

    # -- lifecycle -------------------------------------------------------------------------
    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="shadow", daemon=True)
            self._thread.start()

    def stop(self, timeout: float = 5.0) -> dict[str, Any]:
        """Stop the worker (what is queued is dropped, not run); the final summary."""
        self._stop.set()
        t = self._thread
        if t is not None and t is not threading.current_thread():
            t.join(timeout)
        self._thread = None
        summary = self.summary()
        self._q.clear()
        return summary

    # -- the worker ------------------------------------------------------------------------
    def _run(self) -> None:
        if self.priority > 0:
            try:  # this thread only
                os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(self.priority))
                self.scheduling = f"SCHED_FIFO {self.priority}"
            except (OSError, AttributeError) as exc:
                self.scheduling = f"SCHED_OTHER (SCHED_FIFO {self.priority} refused: {exc})"
                log.warning("shadow_priority_refused", priority=self.priority, error=str(exc))
        budget = self._poll_s * BUDGET
        while not self._stop.wait(self._poll_s):
            until = time.monotonic() + budget
            while not self._stop.is_set() and time.monotonic() < until:
                try:
                    item = self._q.popleft()
                except IndexError:
                    break
                self.taken += 1
                try:
                    self.compare(*item)
                except Exception as exc:  # one bad decision must not end the shadow
                    self.errors += 1
                    self.last_error = repr(exc)
                    log.exception("shadow_compare_failed")

    def compare(self, rec: DecisionRecord, task_id: str | None = None,
                step: int | None = None) -> str | None:
        """Run the candidate on the record's observation and count it (the worker; tests call
        it directly). The shadow's action, or None when the candidate gave no usable answer."""
        import numpy as np

        x = np.array(rec.observation, dtype=np.float32, ndmin=2)
        t0 = self._clock()
        try:
            y = self.session.run(None, {self._x_name: x})[0]
        except Exception as exc:
            self.errors += 1
            self.last_error = f"run: {exc}"
            return None
        ms = (self._clock() - t0) * 1e3
        scores = [float(v) for v in np.asarray(y).reshape(-1)]
        if len(scores) != len(_LABELS) or not all(math.isfinite(s) for s in scores):
            self.errors += 1
            self.last_error = f"unusable scores {scores[:8]!r}"
            return None
        action = _LABELS[max(range(len(scores)), key=scores.__getitem__)]
        acting = str(rec.action)
        with self._tally_lock:
            same = self.tally.count(rec.state, acting, action, rec.latency_s * 1e3, ms,
                                    task_id, step, rec.backend)
            due = (not self.reported and self.report_after > 0
                   and self.tally.decisions >= self.report_after)
            self.reported = self.reported or due
        TAP.publish(obs.DECISIONS, ({
            "mono": rec.mono, "state": rec.state, "observation": rec.observation,
            "action": action, "backend": self.backend, "latency_ms": ms,
            "outcome": "agree" if same else "differ", "acting_action": acting}, True))
        if self._record is not None:
            d = {"t": rec.mono, "state": rec.state, "observation": rec.observation,
                 "action": action, "backend": self.backend, "latency_ms": ms,
                 "outcome": "agree" if same else "differ"}
            self.journaled += bool(self._record(d, task_id, step))
        if due and self._on_report is not None:
            self._on_report(self.summary())
        return action

    # -- figures ---------------------------------------------------------------------------
    def dropped(self, queued: int | None = None) -> int:
        """Decisions the full queue dropped (offered, never taken nor waiting)."""
        return max(0, self.offered - self.taken - (len(self._q) if queued is None else queued))

    def summary(self) -> dict[str, Any]:
        """The candidate, since when, the tally's figures, and what was lost."""
        with self._tally_lock:
            s = self.tally.summary()
        c = self.card
        queued = len(self._q)
        return {"candidate": {"name": c.name, "version": c.version, "sha256": c.sha256},
                "since": round(self.since, 3), **s, "dropped": self.dropped(queued),
                "skipped": self.skipped, "errors": self.errors, "last_error": self.last_error,
                "queued": queued, "journaled": self.journaled, "scheduling": self.scheduling,
                "report_after": self.report_after}

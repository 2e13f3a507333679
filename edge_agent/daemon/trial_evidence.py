"""The model trial's evidence taps: decisions, inference events and published events, counted.

`EvidenceTaps.ev` is the open trial's `Evidence` (inference/trial_rules.py), None when no trial
counts. Each tap only updates counters and, when the evidence changed what the rules may say,
sets `wake` for the trial's thread (daemon/model_trial.py); none blocks, none does I/O.
`on_decision` runs on the control thread for every decision: it writes the decision counters
only (attempts, errors, slow, worst_ms), the other taps the task and mode counters, so no
update is lost without a lock.
"""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING, Any

from edge_agent.inference.trial_rules import UNUSABLE_MODES, Evidence, judged
from edge_agent.vocab import EventType

if TYPE_CHECKING:
    from edge_agent.contract.events import Event

CANDIDATE = "local"  # the backend that runs the model model.update installed


class EvidenceTaps:
    """See the module doc; `latency_ms`: the candidate's decision budget."""

    def __init__(self, latency_ms: float) -> None:
        self.latency_ms = latency_ms
        self.ev: Evidence | None = None
        self.wake = threading.Event()

    def on_decision(self, rec: Any) -> None:
        """Every decision (an inference DecisionRecord), on the control thread."""
        ev = self.ev
        if ev is None:
            return
        local, clean = None, True
        for name, outcome in rec.attempts:
            if name == CANDIDATE:
                local = outcome
                break
            clean = clean and outcome == "not_ready"  # no time spent before the candidate
        if local is None or local in ("not_ready", "busy"):
            return
        ev.attempts += 1
        slow = local == "deadline"
        if local in ("error", "nan"):
            ev.errors += 1
            self.wake.set()
        elif local == "ok" and clean:  # the decision's latency is the candidate's own
            ms = rec.latency_s * 1e3
            if ms > ev.worst_ms:
                ev.worst_ms = round(ms, 3)
            slow = ms > self.latency_ms
        if slow:
            ev.slow += 1
            if ev.first_slow_wall is None:
                ev.first_slow_wall = time.time()
            self.wake.set()

    def on_inference_event(self, event: Any) -> None:
        """An InferenceEvent (any thread): the candidate's load failures."""
        ev = self.ev
        if ev is not None and event.kind.value == EventType.INFERENCE_LOAD_FAILED \
                and event.backend == CANDIDATE:
            ev.load_failures += 1
            self.wake.set()

    def on_event(self, event: Event) -> None:
        """A published event (the daemon's listener): task ends, L3, degradation modes."""
        ev = self.ev
        if ev is None:
            return
        kind = event.get("type")
        if kind == EventType.TASK_DONE:
            verdict = judged(event.get("outcome"), event.get("message"))
            if verdict is None:
                ev.aborted += 1
            else:
                ev.tasks += 1
                ev.successes += verdict
        elif kind == EventType.DIAGNOSTIC:
            ev.l3 += 1
        elif kind == EventType.DEGRADED and event.get("mode") in UNUSABLE_MODES:
            ev.modes.append(str(event.get("mode")))
        else:
            return
        self.wake.set()

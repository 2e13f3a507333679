"""The periodic drift report: every `journal.drift_period_s`, this period's policy behaviour
against the last period's, filed through the report outbox (disk, MQTT, chat).

    drift = DriftReports(cfg, journal, submit=outbox.submit, origin=origin)
    drift.start()     # loads <state_dir>/drift.json; a period that ended while down is filed now
    drift.stop()      # saves what was counted; idempotent

What is counted: the decision journal's `DriftTally` (store/drift_tally.py) — decisions per
(executor state, action) on the control thread, one dict update each, and each episode's
outcome / L3 when its record is written. Its own thread (`drift`, never the control thread)
takes the counts every `CHECKPOINT_S` (or a quarter period) and folds them into the period's,
saved atomically with the period's start and the last period's summary in
`<state_dir>/drift.json` (store/atomic.py), so the period boundary survives a restart and a
crash loses at most one checkpoint of counts. At the boundary the labels given in the period are
counted in a subprocess (store/label_counts.py), the report is built (reports/drift.py), the
new state (next period from now, this one as its reference) is saved, then the report is
submitted. A daemon down across a boundary files the report when it is back: the period then
spans the time it was down too. A crash between the save and the submit loses that report
(the window is one queue put).
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from edge_agent.log import get_logger
from edge_agent.reports.drift import build_drift_report, period_summary
from edge_agent.store.atomic import write_atomic
from edge_agent.store.drift_tally import DriftTally, add_counts, empty_counts
from edge_agent.store.label_counts import count_in_subprocess

if TYPE_CHECKING:
    from edge_agent.config import Config
    from edge_agent.contract.status_parts import DriftStatus
    from edge_agent.reports.record import Origin, Report
    from edge_agent.store.decisions import DecisionJournal

_log = get_logger(__name__)
STATE_NAME = "drift.json"
STATE_FORMAT = 1
CHECKPOINT_S = 60.0


class DriftReports:
    """See the module doc. `tick(now)` is one step of the thread (tests call it directly)."""

    def __init__(self, cfg: Config, journal: DecisionJournal,
                 submit: Callable[[Callable[[], Report]], bool],
                 origin: Callable[[], Origin], *, wall: Callable[[], float] = time.time,
                 mono: Callable[[], float] = time.monotonic) -> None:
        self.period_s = float(cfg.journal.drift_period_s)
        self.threshold = float(cfg.journal.drift_threshold)
        self.path = Path(cfg.state_dir) / STATE_NAME
        self.journal_dir = journal.journal.directory
        self.tally = journal.tally = DriftTally()
        self._submit = submit
        self._origin = origin
        self._wall = wall
        self._mono = mono
        self.start_wall = 0.0
        self.counts: dict[str, Any] = empty_counts()
        self.last: dict[str, Any] | None = None
        self.filed = 0
        self._saved = 0.0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # -- lifecycle -------------------------------------------------------------------------
    def load(self) -> None:
        """The saved period (a missing or unreadable file starts a new one now)."""
        now = self._wall()
        self.start_wall = now
        try:
            st = json.loads(self.path.read_text(encoding="utf-8"))
            if st.get("v") != STATE_FORMAT:
                raise ValueError(f"format {st.get('v')!r}")
            start = float(st["start"])
            counts = add_counts(empty_counts(), st.get("counts") or {})
            last = st.get("last")
        except FileNotFoundError:
            self._save(now)
            return
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            _log.warning("drift_state_unreadable", path=str(self.path), error=str(exc))
            self._save(now)
            return
        self.last = last if isinstance(last, dict) else None
        if start <= now:
            self.start_wall, self.counts = start, counts
        else:  # the clock was set back past the period's start: a new period from now
            self._save(now)

    def start(self) -> None:
        self.load()
        self._thread = threading.Thread(target=self._run, name="drift", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        t = self._thread
        if t is not None:
            t.join(timeout)
            self._thread = None
            with contextlib.suppress(OSError):
                self.checkpoint()

    def status(self) -> DriftStatus:
        return {"period_s": self.period_s, "period_start": round(self.start_wall, 3),
                "next_report": round(self.start_wall + self.period_s, 3), "filed": self.filed}

    # -- the drift thread ------------------------------------------------------------------
    def _run(self) -> None:
        step = max(0.2, min(CHECKPOINT_S, self.period_s / 4))
        while not self._stop.is_set():
            try:
                self.tick()
            except Exception:  # a bad period must not end the reports
                _log.exception("drift_tick_failed")
            due = self.start_wall + self.period_s - self._wall()
            self._stop.wait(max(0.05, min(step, due)))

    def tick(self, now: float | None = None) -> Report | None:
        """Fold the new counts in; at the boundary file the report (returned)."""
        now = self._wall() if now is None else now
        add_counts(self.counts, self.tally.take())
        if now >= self.start_wall + self.period_s:
            return self._file(now)
        if now - self._saved >= min(CHECKPOINT_S, self.period_s / 4):
            self._save(now)
        return None

    def checkpoint(self) -> None:
        add_counts(self.counts, self.tally.take())
        self._save(self._wall())

    def _file(self, now: float) -> Report:
        labels = count_in_subprocess(self.journal_dir, self.start_wall, now)
        if isinstance(labels, str):
            _log.warning("drift_labels_not_counted", why=labels)
        this = period_summary(self.counts, self.start_wall, now,
                              labels if isinstance(labels, Mapping) else None)
        report = build_drift_report(this, self.last, self.threshold, self.period_s,
                                    self._origin(), mono=self._mono())
        self.last, self.counts, self.start_wall = this, empty_counts(), now
        self._save(now)  # the next period is durable before the report is handed over
        self._submit(lambda: report)
        self.filed += 1
        _log.info("drift_report_filed", id=report.id, verdict=report.details["verdict"],
                  kl=report.details["kl"], decisions=this["decisions"])
        return report

    def _save(self, now: float) -> None:
        st = {"v": STATE_FORMAT, "period_s": self.period_s, "start": self.start_wall,
              "saved": now, "counts": self.counts, "last": self.last}
        write_atomic(self.path, json.dumps(st, separators=(",", ":")).encode())
        self._saved = now

"""The daemon's repair reports: records from the stop latch and the executor into the outbox.

`DaemonReports(...)` subscribes to the interfaces that exist: a latch listener (every e-stop
and protective stop cause, with the sensor window before it) and the executor's
`on_fault_record` (each L3 diagnosis). Both run on the thread that saw the fault and only
capture a record and enqueue it; the report is built, persisted, plotted (in a subprocess) and
delivered on the outbox thread (reports/outbox.py). A degradation mode change (the health
monitor, issue #18) comes in the same way: `submit(ModeRecord(...))`. The periodic drift report
(daemon/drift.py, its own thread) files into the same outbox; it is built in `start()`, after
READY (its modules: 7 ms of the start-up path's imports on a quiet 2-core VM).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from edge_agent.executor.latch import LatchState
from edge_agent.executor.monitor import window_of
from edge_agent.log import get_logger
from edge_agent.reports.build import build_report
from edge_agent.reports.outbox import Outbox, Sink
from edge_agent.reports.record import (
    DiagnosisRecord,
    FaultRecord,
    Origin,
    StopRecord,
)
from edge_agent.reports.sinks import DiskSink, MqttSink, Published
from edge_agent.vocab import ESTOP_CAUSES, StopCause

if TYPE_CHECKING:
    from edge_agent.config import Config
    from edge_agent.contract.events import Event
    from edge_agent.contract.payloads import ReportPayload
    from edge_agent.contract.status_parts import ReportsStatus
    from edge_agent.daemon.control import ControlPath
    from edge_agent.daemon.drift import DriftReports
    from edge_agent.reports.record import Report
    from edge_agent.store.decisions import DecisionJournal

_log = get_logger(__name__)
OUTBOX_DIR = "outbox"
DECISIONS_IN_REPORT = 10


class DaemonReports:
    """See the module doc; `start()` after the state dir exists, `stop()` idempotent."""

    def __init__(self, cfg: Config, *, boot_id: str, control: ControlPath,
                 decisions: DecisionJournal | None,
                 model_status: Callable[[], Mapping[str, Any] | None],
                 publish_event: Callable[[Event], None],
                 publish_report: Callable[[ReportPayload], Published | None]) -> None:
        self.control = control
        self._decisions_journal = decisions
        self._model_status = model_status
        self._origin_fields = (cfg.device.id, boot_id, cfg.hash)
        r = cfg.reports
        secrets = [s.reveal() for s in (r.webhook_url, cfg.mqtt.password) if s]
        sinks: list[Sink] = [DiskSink(r.dir, r.max_files), MqttSink(publish_report, cfg.device.id)]
        if r.webhook_url is not None:
            from edge_agent.reports.webhook import WebhookSink

            sinks.append(WebhookSink(
                r.webhook_url.reveal(), fmt=r.webhook_format, device=cfg.device.id,
                rate_per_min=r.webhook_rate_per_min, merge_window_s=r.merge_window_s,
                timeout_s=r.webhook_timeout_s, secrets=secrets,
                report_topic=f"{cfg.mqtt.topic_prefix or 'edge/' + cfg.device.id}/report"))
        self.outbox = Outbox(Path(cfg.state_dir) / OUTBOX_DIR, sinks, max_entries=r.outbox_max,
                             plot=r.plot, max_rows=r.table_rows,
                             retry_min_s=r.retry_min_s, retry_max_s=r.retry_max_s,
                             secrets=secrets, on_event=publish_event,
                             plot_repeat_s=r.merge_window_s)
        self._sample_hz = control.executor.cfg.diagnostic_sample_hz
        self._cfg = cfg
        self.drift: DriftReports | None = None  # built in start()

    def subscribe(self) -> None:
        """Listen to the latch and the executor's fault records (after the daemon's own
        latch listener, which sends the stop frame)."""
        self.control.latch.add_listener(self._on_latch)
        self.control.executor.on_fault_record = self._on_fault_record

    def start(self) -> None:
        """After READY: the outbox, then the periodic drift report (daemon/drift.py: it counts
        the journal's decisions)."""
        if self._decisions_journal is not None and self.drift is None:
            from edge_agent.daemon.drift import DriftReports

            self.drift = DriftReports(self._cfg, self._decisions_journal, self.outbox.submit,
                                      self._origin)
        self.outbox.start()
        if self.drift is not None:
            self.drift.start()

    def stop(self) -> None:
        if self.drift is not None:
            self.drift.stop()
        self.outbox.stop()

    def status(self) -> ReportsStatus:
        st = self.outbox.status()
        if self.drift is not None:
            st["drift"] = self.drift.status()
        return st

    def file_report(self, make: Callable[[Origin, list[dict[str, Any]]], Report]) -> bool:
        """A report its source builds itself (a model trial's rollback), from this daemon's
        origin and the newest journal decisions, on the outbox thread."""
        return self.outbox.submit(lambda: make(self._origin(), self._decisions()))

    def submit(self, record: FaultRecord) -> bool:
        """Any record (a mode change too): built and delivered on the outbox thread."""
        return self.outbox.submit(lambda: build_report(record, self._origin(), self._decisions()))

    # -- sources (the thread that saw the fault: capture and enqueue only) --------------------
    def _on_latch(self, state: LatchState, cause: StopCause | None) -> None:
        if cause is None:
            return  # a reset or an update, not a new stop
        c = self.control
        with c.executor_lock:  # re-entrant: a collision trips the latch inside the tick
            ex = c.executor
            mode, st, task, samples = ex.mode, ex.state.value, ex.task, ex.sensor_snapshot()
        kind = "estop" if cause in ESTOP_CAUSES else "protective_stop"
        mono = state.tripped_at if state.tripped_at is not None else c.clock.now()
        wall = time.time()
        hz = self._sample_hz

        def make() -> FaultRecord:  # on the outbox thread: the window's rows are built there
            return StopRecord(kind, cause.value, tuple(c.value for c in state.causes),
                              state.hardware_input, wall, mono, mode, st, task,
                              window_of(samples, hz))

        self.outbox.submit(lambda: build_report(make(), self._origin(), self._decisions()))

    def _on_fault_record(self, record: Mapping[str, Any]) -> None:
        rec = DiagnosisRecord(time.time(), float(record.get("time", 0.0)), dict(record))
        self.submit(rec)

    def origin(self) -> Origin:
        """Which robot, boot, config and model a report comes from (a report source's call)."""
        return self._origin()

    # -- on the outbox thread --------------------------------------------------------------
    def _origin(self) -> Origin:
        sha = None
        try:
            st = self._model_status()
            model = st.get("model") if st else None
            sha = model.get("sha256") if isinstance(model, Mapping) else None
        except Exception:  # a report without the model's hash beats no report
            _log.exception("report_model_status_failed")
        return Origin(*self._origin_fields, sha)

    def _decisions(self) -> list[dict[str, Any]]:
        j = self._decisions_journal
        if j is None:
            return []
        # task_id and step: what a person gives `journal.label` to label one of them
        return [{"t_s": round(x.t, 4), "task_id": x.task_id, "step": x.step,
                 "state": x.state, "action": x.action,
                 "backend": x.backend, "outcome": x.outcome, "accepted": x.accepted,
                 "latency_ms": round(x.latency_ms, 3) if math.isfinite(x.latency_ms) else None}
                for x in j.recent(DECISIONS_IN_REPORT)]

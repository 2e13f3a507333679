"""`model.shadow`: the daemon's side of a shadow candidate (inference/shadow.py does the work).

    {"uri": "/var/lib/edge-agent-models/c.onnx", "sha256": "<hex>"}   start
    {"stop": true}                                                    stop, file the report

Start reads the candidate as `model.update` does (model_source.py: an allowed directory, a
regular file, the size cap) and verifies it exactly as `model.update` would install it
(`ModelCache.verify`: sha256, signature against `inference.trusted_keys`, the card's meaning,
a smoke run), on the command worker — but installs nothing: the verified CPU session becomes the
shadow's. One shadow at a time. Each policy decision reaches `offer()` from the decision sink on
the control thread (an append to a bounded queue); the candidate runs on the shadow's own thread.
After `inference.shadow_report_after` compared decisions, and when it is stopped, a shadow report
is filed through the report outbox (disk, MQTT, chat). The shadow lives in memory only: a restart
(or the daemon stopping) drops it, without a report or a `shadow_stopped` event; start it again
after a restart (its shadow journal records stay).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from edge_agent.commands import CommandContext, CommandRefused, ErrorCode
from edge_agent.log import get_logger
from edge_agent.vocab import EventType

if TYPE_CHECKING:
    from edge_agent.config import Config
    from edge_agent.contract.events import Event
    from edge_agent.contract.events_more import ModelName
    from edge_agent.inference.assembly import InferenceStack
    from edge_agent.inference.backend import DecisionRecord
    from edge_agent.inference.shadow import ShadowRunner
    from edge_agent.reports.record import Origin, Report
    from edge_agent.store.decisions import DecisionJournal

_log = get_logger(__name__)
STATUS_KEYS = ("candidate", "since", "decisions", "agreement", "per_state", "latency", "dropped",
               "skipped", "errors", "last_error", "queued", "journaled", "report_after",
               "scheduling")


class ShadowControl:
    """The command, the reports and `status.model.shadow` of one shadow at a time."""

    def __init__(self, cfg: Config, stack: Callable[[], InferenceStack | None],
                 unavailable: Callable[[], str | None], journal: DecisionJournal | None,
                 publish: Callable[[Event], None]) -> None:
        self.report_after = int(cfg.inference.shadow_report_after)
        self.priority = int(cfg.inference.shadow_priority)
        self._stack = stack
        self._unavailable = unavailable
        self._journal = journal
        self._publish = publish
        self._lock = threading.Lock()  # start/stop (command worker) against each other
        self.runner: ShadowRunner | None = None
        self._submit: Callable[[Callable[[], Report]], bool] | None = None
        self._origin: Callable[[], Origin] | None = None
        self.reports_filed = 0
        self.last: dict[str, Any] | None = None  # the last stopped shadow's figures

    def attach_reports(self, submit: Callable[[Callable[[], Report]], bool],
                       origin: Callable[[], Origin]) -> None:
        """The report outbox (built after the policy loader)."""
        self._submit, self._origin = submit, origin

    # -- the control thread ----------------------------------------------------------------
    def offer(self, rec: DecisionRecord) -> None:
        """The decision sink's call for every decision: a no-op without a shadow; else the
        record with the step the journal just gave it, appended to the shadow's queue."""
        runner = self.runner
        if runner is None:
            return
        j = self._journal
        mark = j.episode if j is not None and j.enabled and not j.shedding else None
        if mark is not None and mark.task_id is not None:  # record() just took its step
            runner.offer(rec, mark.task_id, mark.step - 1)
        else:
            runner.offer(rec)

    # -- the command (its worker thread) ---------------------------------------------------
    def command(self, args: dict[str, Any], ctx: CommandContext) -> dict[str, Any]:
        if args.get("stop"):
            return self.stop_shadow()
        return self.start_shadow(str(args["uri"]), str(args["sha256"]), args.get("version"))

    def start_shadow(self, uri: str, sha256: str, version: str | None) -> dict[str, Any]:
        from edge_agent.inference.model_card import ModelError
        from edge_agent.inference.model_source import SourceRefused, read_model
        from edge_agent.inference.shadow import ShadowRunner

        why = self._unavailable()
        stack = self._stack()
        if why is not None or stack is None:
            raise CommandRefused(ErrorCode.REFUSED, f"model.shadow refused: {why}")
        if stack.cache is None:
            raise CommandRefused(ErrorCode.REFUSED, "model.shadow refused: no model cache "
                                 "directory configured (inference.cache_dir)")
        with self._lock:
            if self.runner is not None:
                c = self.runner.card
                raise CommandRefused(ErrorCode.BUSY, f"model.shadow refused: {c.name} "
                                     f"{c.version} is already shadowing; stop it first "
                                     '({"stop": true})')
            s = stack.settings
            allowed = [d for d in (s.update_dir, stack.cache.dir) if d is not None]
            try:
                src = read_model(uri, allowed, s.max_model_bytes)
                session, card = stack.cache.verify(src.data, src.card, sha256=sha256,
                                                   version=version)[:2]
            except SourceRefused as exc:
                raise CommandRefused(ErrorCode.BAD_ARGS,
                                     str(exc).replace("model.update", "model.shadow")) from exc
            except ModelError as exc:
                msg = str(exc)
                raise CommandRefused(ErrorCode.REFUSED, msg if msg.startswith("model rejected")
                                     else f"model rejected: {msg}") from exc
            runner = ShadowRunner(session, card, record=self._record(),
                                  report_after=self.report_after, on_report=self._report_due,
                                  priority=self.priority)
            runner.start()
            self.runner = runner  # from the next decision on, offer() hands it over
        cand: ModelName = {"name": card.name, "version": card.version, "sha256": card.sha256}
        self._publish({"type": EventType.SHADOW_STARTED, "candidate": cand,
                       "report_after": self.report_after})
        _log.info("shadow_started", name=card.name, version=card.version,
                  sha256=card.sha256[:12])
        acting = stack.status().get("model")
        return {"shadow": cand, "acting": acting, "report_after": self.report_after}

    def stop_shadow(self) -> dict[str, Any]:
        with self._lock:
            runner, self.runner = self.runner, None
        if runner is None:
            return {"stopped": False, "note": "no shadow is running"}
        summary = runner.stop()
        self.last = {k: summary.get(k) for k in STATUS_KEYS}
        filed = self._file(summary, "stopped")
        self._publish({"type": EventType.SHADOW_STOPPED, "candidate": summary["candidate"],
                       "decisions": summary["decisions"], "agreement": summary["agreement"],
                       "dropped": summary["dropped"], "report": filed})
        return {"stopped": True, "report": filed, **self.last}

    def _record(self) -> Callable[[Any, str | None, int | None], bool] | None:
        j = self._journal
        return j.record_shadow if j is not None else None

    # -- reports ---------------------------------------------------------------------------
    def _report_due(self, summary: dict[str, Any]) -> None:  # on the shadow's thread
        self._file(summary, "after")

    def _file(self, summary: dict[str, Any], why: str) -> str | None:
        """Hand the report to the outbox; its id (None: no outbox)."""
        submit, origin = self._submit, self._origin
        if submit is None or origin is None:
            return None
        from edge_agent.reports.shadow import build_shadow_report

        report = build_shadow_report(summary, why, origin(), wall=time.time(),
                                     mono=time.monotonic())
        if not submit(lambda: report):
            _log.warning("shadow_report_not_queued", id=report.id)
            return None
        self.reports_filed += 1
        _log.info("shadow_report_filed", id=report.id, why=why,
                  agreement=summary.get("agreement"), decisions=summary.get("decisions"))
        return report.id

    # -- status and shutdown ---------------------------------------------------------------
    def status(self) -> dict[str, Any] | None:
        """`status.model.shadow`: the running shadow's figures (`active`), else the last
        stopped one's (`active` false), else None (no shadow this boot)."""
        runner = self.runner
        if runner is not None:
            s = runner.summary()
            fig, active = {k: s.get(k) for k in STATUS_KEYS}, True
        elif self.last is not None:
            fig, active = self.last, False
        else:
            return None
        return {"active": active, **fig, "reports_filed": self.reports_filed}

    def stop(self) -> None:
        """The daemon stops: the shadow is dropped (no report). Idempotent, never raises."""
        with self._lock:
            runner, self.runner = self.runner, None
        if runner is not None:
            try:
                runner.stop(timeout=1.0)
            except Exception:
                _log.exception("shadow_stop_failed")

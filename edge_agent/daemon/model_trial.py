"""The model trial: after `model.update` the new model is on trial until it commits or rolls back.

The I/O shell around inference/trial_rules.py (the pure rules: what is a regression, when a trial
ends). `PolicyLoader` owns one `ModelTrial` and calls it at four points:

    at_start(stack)          start-up, before the stack loads a session: an open trial whose
                             process died (no clean stop recorded) rolls back now — the candidate
                             never decides again; one stopped cleanly resumes
    check_update(sha, allow_bad) / begin(stack, sha) / installed(card) | abandon()
                             model.update: refused while a trial runs or for a model marked bad
                             (unless `allow_bad`); the trial record is saved (`pending`) before
                             the candidate is installed, so before its first decision
    taps.on_decision / taps.on_inference_event / taps.on_event   the evidence
                             (daemon/trial_evidence.py; the control thread's tap: counters only)
    stop()                   a clean stop: recorded, so the next start resumes the trial

The trial's own thread (`model-trial`, alive only while a trial is open) judges the evidence when
it changes and once a second (the time limit), and acts: a regression rolls back at once — the
candidate is marked bad and the record saved (`rolling_back`) first, then the cache pointer is
swapped and the sessions reloaded (between two decisions: the policy only proposes discrete
actions, so the swap changes no setpoint, and the decision in flight finishes on its session),
then the `model_rolled_back` event and a repair report; no regression by the end:
`model_committed`. Files: daemon/trial_store.py.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Protocol, cast

from edge_agent.daemon.trial_evidence import EvidenceTaps
from edge_agent.daemon.trial_store import (
    COMMITTED,
    ON_TRIAL,
    OPEN_STATES,
    PENDING,
    ROLLED_BACK,
    ROLLING_BACK,
    TrialStore,
    card_summary,
    read_baseline,
    utc_text,
)
from edge_agent.inference.trial_rules import (
    REGRESSION,
    Baseline,
    Evidence,
    TrialRules,
    Verdict,
    judge,
)
from edge_agent.log import get_logger
from edge_agent.vocab import EventType

if TYPE_CHECKING:
    from edge_agent.config import Config
    from edge_agent.contract.events import Event
    from edge_agent.contract.events_more import CommitBy, ModelName
    from edge_agent.inference.model_cache import CachedModel, ModelCache
    from edge_agent.inference.model_card import ModelCard
    from edge_agent.reports.record import Origin, Report

_log = get_logger(__name__)
JUDGE_PERIOD_S = 1.0
SAVE_PERIOD_S = 2.0
ReportMaker = Callable[["Origin", list[dict[str, Any]]], "Report"]
ReportFiler = Callable[[ReportMaker], bool]


class UpdateRefused(Exception):
    """model.update refused by the trial (a trial is running; the model is marked bad)."""


class TrialStack(Protocol):
    """What the trial needs of the inference stack (inference/assembly.py InferenceStack)."""

    cache: ModelCache | None

    def revert_model(self, bad: str, *, reload: bool = True) -> CachedModel: ...


class ModelTrial:
    """See the module doc."""

    def __init__(self, cfg: Config, publish: Callable[[Event], None]) -> None:
        from edge_agent.store.decisions import journal_dir

        self.rules = TrialRules.from_config(cfg.inference)
        self.store = TrialStore(cfg.state_dir)
        self._journal_dir = journal_dir(cfg.state_dir)
        self._publish = publish
        self._file_report: ReportFiler | None = None
        self._stack: TrialStack | None = None
        self._lock = threading.Lock()
        self._rec: dict[str, Any] | None = None  # the open (or last) trial's record
        self._prior: dict[str, Any] | None = None  # the record a pending one replaced
        self._baseline: Baseline | None = None
        self.taps = EvidenceTaps(self.rules.latency_ms)  # counting while taps.ev is set
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._cards: dict[str, dict[str, Any]] = {}
        self._loaded = False
        self._load_lock = threading.Lock()

    def attach(self, file_report: ReportFiler,
               listen: Callable[[Callable[[Event], None]], None]) -> None:
        """The report outbox and the daemon's event stream (app.py, once both exist)."""
        self._file_report = file_report
        listen(self.taps.on_event)

    # -- start-up --------------------------------------------------------------------------
    def at_start(self, stack: TrialStack) -> None:
        """Before the stack loads a session (see the module doc); never raises."""
        self._stack = stack
        try:
            self._at_start(stack)
        except Exception:  # a broken trial record must not keep the policy from loading
            _log.exception("model_trial_start_failed")

    def _at_start(self, stack: TrialStack) -> None:
        rec = self._load()
        if rec is None or rec["state"] not in OPEN_STATES:
            return
        cur = stack.cache.pointer()["current"] if stack.cache is not None else None
        sha = rec["sha256"]
        ev = Evidence.from_dict(rec.get("evidence") or {})
        self._baseline = _baseline(rec.get("baseline"))
        if rec["state"] == ROLLING_BACK:  # died between the bad mark and the pointer swap
            self._roll_back(rec, Verdict(REGRESSION, tuple((rec.get("verdict") or {}).get(
                "reasons") or ("the rollback was interrupted",))), ev, at_start=True)
            return
        if cur != sha:  # the install never completed: the candidate never decided
            _log.warning("model_trial_install_interrupted", sha256=sha, current=cur)
            with self._lock:
                self._rec = None
            self.store.clear_trial()
            return
        if rec.get("clean_stop"):
            rec.update(state=ON_TRIAL, clean_stop=False)
            with self._lock:
                self._rec, self.taps.ev = rec, ev
            self._save()
            _log.info("model_trial_resumed", sha256=sha, tasks=ev.tasks)
            self._start_thread()
            return
        ev.unclean_restarts += 1
        v = judge(ev, self._baseline, self.rules, float(rec["started_wall"]), time.time())
        self._roll_back(rec, v, ev, at_start=True)

    def _load(self) -> dict[str, Any] | None:
        with self._load_lock:  # status (command worker) and at_start (start-up) may race
            if not self._loaded:
                rec = self.store.load_trial()
                with self._lock:
                    self._rec = rec
                self._loaded = True
        return self._rec

    # -- model.update ----------------------------------------------------------------------
    def check_update(self, sha: str, allow_bad: bool) -> None:
        """Raises UpdateRefused (the reason and what to do) when this update must not go on."""
        rec = self._load()
        if rec is not None and rec["state"] in OPEN_STATES:
            ev = self.taps.ev or Evidence()
            raise UpdateRefused(
                f"model.update refused: {rec.get('name')} {rec.get('version')} (sha256 "
                f"{rec['sha256'][:12]}) is on trial ({ev.tasks}/{self.rules.tasks} tasks, at the "
                f"latest until {utc_text(rec.get('deadline_wall'))}); wait for its "
                "model_committed or model_rolled_back event (status.model.trial)")
        bad = self.store.bad_entry(sha.lower())
        if bad is not None and not allow_bad:
            why = (bad.get("reasons") or ["a regression"])[0]
            raise UpdateRefused(
                f"model.update refused: sha256 {sha[:12]} ({bad.get('name')} "
                f"{bad.get('version')}) was rolled back on trial at {utc_text(bad.get('wall'))} "
                f"and is marked bad: {why}. Fix the model, or install it anyway (a new trial) "
                "with \"allow_bad\": true")

    def begin(self, stack: TrialStack, sha: str, allow_bad: bool = False) -> bool:
        """Before the install: the `pending` record, saved; counting starts. False (no trial)
        when `sha` is the current model already."""
        self._stack = stack
        cache = stack.cache
        cur = cache.pointer()["current"] if cache is not None else None
        sha = sha.lower()
        if cur == sha:
            return False
        now = time.time()
        base = read_baseline(self._journal_dir, cur)
        rec = {"state": PENDING, "sha256": sha, "name": None, "version": None,
               "previous": self._card(cur), "started_wall": round(now, 3),
               "deadline_wall": round(now + self.rules.seconds, 3),
               "rules": self.rules.as_dict(), "evidence": Evidence().as_dict(),
               "baseline": {"episodes": base.episodes, "successes": base.successes},
               "verdict": None, "clean_stop": False, "allow_bad": allow_bad}
        with self._lock:
            self._prior, self._rec, self.taps.ev, self._baseline = self._rec, rec, Evidence(), base
        self._save()
        return True

    def installed(self, card: ModelCard) -> None:
        """The candidate is installed and decides: on trial (event, the thread)."""
        with self._lock:
            rec = self._rec
            if rec is None or rec["state"] != PENDING or rec["sha256"] != card.sha256:
                return
            rec.update(state=ON_TRIAL, name=card.name, version=card.version)
        self._save()
        self._publish({"type": EventType.MODEL_TRIAL_STARTED, "sha256": card.sha256,
                       "name": card.name, "version": card.version,
                       "previous": (rec.get("previous") or {}).get("sha256"),
                       "tasks_required": self.rules.tasks, "deadline_wall": rec["deadline_wall"],
                       "baseline": rec["baseline"]})
        self._start_thread()

    def abandon(self) -> None:
        """The install failed (the model in use is unchanged): no trial."""
        with self._lock:
            rec = self._rec
            if rec is None or rec["state"] != PENDING:
                return
            self._rec, self.taps.ev = self._prior, None
        if self._rec is not None:
            self._save()
        else:
            self.store.clear_trial()

    # -- the trial thread ------------------------------------------------------------------
    def _start_thread(self) -> None:
        if self._thread is not None and self._thread.is_alive():
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="model-trial", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        saved, last = time.monotonic(), None  # the evidence is saved when it changed
        while not self._stop.is_set():
            self.taps.wake.wait(JUDGE_PERIOD_S)
            self.taps.wake.clear()
            if self._stop.is_set():
                return
            try:
                if self.step():
                    return
            except Exception:  # a bad step must not end the watch
                _log.exception("model_trial_step_failed")
            ev = self.taps.ev
            if ev is not None and time.monotonic() - saved >= SAVE_PERIOD_S \
                    and (now := ev.as_dict()) != last:
                saved, last = time.monotonic(), now
                self._save()

    def step(self, now_wall: float | None = None) -> bool:
        """Judge the evidence so far and act; True once the trial is over."""
        with self._lock:
            rec, ev = self._rec, self.taps.ev
            if rec is None or ev is None or rec["state"] != ON_TRIAL:
                return True
            snap = Evidence.from_dict(ev.as_dict())
        now = time.time() if now_wall is None else now_wall
        v = judge(snap, self._baseline, self.rules, float(rec["started_wall"]), now)
        if v.state == REGRESSION:
            self._roll_back(rec, v, snap, at_start=False)
            return True
        if v.state == COMMITTED:
            with self._lock:
                self.taps.ev = None
                rec.update(state=COMMITTED, evidence=snap.as_dict(), verdict=v.as_dict(),
                           ended_wall=round(now, 3))
            self.store.unmark_bad(rec["sha256"])  # a bad model installed anyway, proven now
            self._save()
            self._publish({"type": EventType.MODEL_COMMITTED, "sha256": rec["sha256"],
                           "name": rec.get("name"), "version": rec.get("version"),
                           "by": cast("CommitBy", v.by), "tasks": snap.tasks,
                           "successes": snap.successes, "evidence": snap.as_dict()})
            _log.info("model_committed", sha256=rec["sha256"], by=v.by, tasks=snap.tasks)
            return True
        return False

    def _roll_back(self, rec: dict[str, Any], v: Verdict, ev: Evidence, *,
                   at_start: bool) -> None:
        t_verdict = time.time()
        sha = rec["sha256"]
        with self._lock:
            self.taps.ev = None  # stop counting: what follows is the restored model's
            rec.update(state=ROLLING_BACK, evidence=ev.as_dict(), verdict=v.as_dict(),
                       rolled_back_at_start=at_start)
            self._rec = rec
        self.store.mark_bad(sha, rec.get("name"), rec.get("version"), list(v.reasons))
        self._save()  # bad and rolling_back on disk before the pointer moves
        restored, error = None, None
        stack = self._stack
        try:
            if stack is None:
                raise RuntimeError("no inference stack")
            entry = stack.revert_model(sha, reload=not at_start)
            restored = cast("ModelName", {"name": entry.card.name, "version": entry.card.version,
                                          "sha256": entry.sha256})
        except Exception as exc:  # nothing to go back to: said in the event and the report
            error = str(exc)
            _log.exception("model_rollback_failed", sha256=sha)
        done = time.time()
        with self._lock:
            rec.update(state=ROLLED_BACK, ended_wall=round(done, 3), restored=restored,
                       rollback_error=error,
                       verdict_to_rollback_ms=round((done - t_verdict) * 1e3, 1),
                       first_slow_to_rollback_s=(round(done - ev.first_slow_wall, 3)
                                                 if ev.first_slow_wall else None))
        self._save()
        self._publish({"type": EventType.MODEL_ROLLED_BACK, "sha256": sha,
                       "name": rec.get("name"), "version": rec.get("version"),
                       "to": restored, "reasons": list(v.reasons), "at_start": at_start,
                       "error": error, "evidence": ev.as_dict(),
                       "verdict_to_rollback_ms": rec["verdict_to_rollback_ms"],
                       "first_slow_to_rollback_s": rec["first_slow_to_rollback_s"]})
        _log.warning("model_rolled_back", sha256=sha, reasons=list(v.reasons),
                     at_start=at_start, restored=restored, error=error)
        self._report(dict(rec), done)

    def _report(self, rec: dict[str, Any], wall: float) -> None:
        filer = self._file_report
        if filer is None:
            _log.error("model_rollback_report_not_filed", why="no report outbox attached")
            return
        from edge_agent.reports.model_trial import build_rollback_report

        mono = time.monotonic()
        filer(lambda origin, decisions: build_rollback_report(rec, origin, decisions,
                                                             wall=wall, mono=mono))

    # -- status, stop ----------------------------------------------------------------------
    def status(self) -> dict[str, Any]:
        """`status.model` (docs/asyncapi.yaml ModelStatus); `shadow` is the caller's."""
        stack = self._stack
        cache = stack.cache if stack is not None else None
        p = cache.pointer() if cache is not None else {"current": None, "previous": None}
        self._load()  # the last trial's record, before the stack is built too
        with self._lock:
            rec = dict(self._rec) if self._rec is not None else None
            ev = self.taps.ev
            live = Evidence.from_dict(ev.as_dict()) if ev is not None else None
        trial = None
        if rec is not None:
            if live is not None:
                rec["evidence"] = live.as_dict()
                rec["verdict"] = judge(live, self._baseline, self.rules,
                                       float(rec["started_wall"]), time.time()).as_dict()
            ev_d = rec.get("evidence") or {}
            trial = {**{k: rec.get(k) for k in (
                "sha256", "name", "version", "state", "previous", "started_wall",
                "deadline_wall", "ended_wall", "baseline", "evidence", "verdict", "restored",
                "rollback_error", "allow_bad")},
                "tasks_done": ev_d.get("tasks", 0), "tasks_required": self.rules.tasks,
                "rules": self.rules.as_dict()}
        return {"current": self._card(p["current"]), "previous": self._card(p["previous"]),
                "trial": trial, "bad": self.store.bad()}

    def stop(self) -> None:
        """A clean stop: an open trial resumes at the next start. Idempotent, never raises."""
        self._stop.set()
        self.taps.wake.set()
        t = self._thread
        if t is not None:
            t.join(5.0)
        try:
            with self._lock:
                rec = self._rec
                if rec is None or rec["state"] not in (PENDING, ON_TRIAL):
                    return
                if self.taps.ev is not None:
                    rec["evidence"] = self.taps.ev.as_dict()
                rec["clean_stop"] = True
            self._save()
        except Exception:
            _log.exception("model_trial_stop_failed")

    # -- helpers ---------------------------------------------------------------------------
    def _save(self) -> None:
        with self._lock:
            rec = self._rec
            if rec is None:
                return
            if self.taps.ev is not None:
                rec["evidence"] = self.taps.ev.as_dict()
            snap = dict(rec)
        self.store.save_trial(snap)

    def _card(self, sha: str | None) -> dict[str, Any] | None:
        stack = self._stack
        cache = stack.cache if stack is not None else None
        return card_summary(cache.dir if cache is not None else None, sha, self._cards)


def _baseline(d: Any) -> Baseline | None:
    if not isinstance(d, Mapping):
        return None
    return Baseline(int(d.get("episodes") or 0), int(d.get("successes") or 0))

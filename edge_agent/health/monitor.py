"""The health monitor: runs every probe at its period on a thread of its own, never blocked by one.

Each probe runs at its own period (`health.period_s`, or `[health.periods]` by the probe name's
part before `:`). A check runs on a worker thread the monitor hands it to and waits for at most
the probe's budget (`health.probe_budget_s`): past it the probe is STALE for that run, the worker
is left to finish it alone (the probe is not run again until it returns) and a fresh worker takes
the next checks — so a hung check never stops the others. A check that raises is an ERROR.

The event fast path: `fail_now(name, message, **figures)` (thread-safe; called from paho's or the
link reader's thread) counts as a failed run at once and runs that probe again now; `on_event(ev)`
does it for every probe that says the event is its failure (`EventAware.fails_on`, optional).
Each result goes to the mode rules (health/modes.py); the transitions go to `on_transition` on
the thread that decided them (the monitor's, or the caller of `fail_now`). `status()` is
`status.health`.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from edge_agent.health.modes import ModeRules, Transition
from edge_agent.health.probe import (
    EventAware,
    Figure,
    Level,
    Probe,
    ProbeResult,
    fail_after_of,
)
from edge_agent.log import get_logger
from edge_agent.observe import channels as obs
from edge_agent.observe.tap import TAP

if TYPE_CHECKING:
    from edge_agent.contract.events import Event
    from edge_agent.contract.status import ActiveMode, HealthStatus, ProbeStatus

_log = get_logger(__name__)

TransitionSink = Callable[[Transition, "HealthMonitor"], None]


def _nothing(_t: Transition, _m: HealthMonitor) -> None:
    return None


@dataclass(slots=True)
class _Job:
    probe: Probe
    now: float
    done: threading.Event = field(default_factory=threading.Event)
    result: ProbeResult | None = None
    took_s: float = 0.0


class _Worker:
    """One thread that runs the checks handed to it, one at a time."""

    def __init__(self, name: str) -> None:
        self.jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self.cpu_s = 0.0  # this thread's CPU time so far (time.thread_time)
        self.thread = threading.Thread(target=self._work, name=name, daemon=True)
        self.thread.start()

    def _work(self) -> None:
        while True:
            job = self.jobs.get()
            if job is None:
                return
            t0 = time.monotonic()
            try:
                job.result = job.probe.check(job.now)
            except Exception as exc:  # a probe must not raise: an ERROR, with why
                _log.exception("health_probe_raised", probe=job.probe.name)
                job.result = ProbeResult.error(f"the probe raised {type(exc).__name__}: {exc}")
            job.took_s = time.monotonic() - t0
            self.cpu_s = time.thread_time()
            job.done.set()


@dataclass(slots=True)
class _Slot:
    """One probe's schedule and last answer."""

    probe: Probe
    period_s: float
    due: float
    result: ProbeResult | None = None
    ran_at: float | None = None
    took_ms: float | None = None
    runs: int = 0
    stale: int = 0  # runs past the budget
    fast_fails: int = 0  # fail_now() calls
    hung: _Job | None = None  # a check past its budget that has not returned yet


class HealthMonitor:
    """See the module doc. `start()` / `stop()` (idempotent) / `name` for a thread supervisor."""

    name = "health"

    def __init__(self, probes: Sequence[Probe], *, period_s: float = 10.0,
                 periods: Mapping[str, float | None] | None = None,
                 budget_s: float = 0.5, fail_after: int = 3, recover_after: int = 3,
                 on_transition: TransitionSink = _nothing,
                 clock: Callable[[], float] = time.monotonic,
                 wall: Callable[[], float] = time.time) -> None:
        self.rules = ModeRules(fail_after, recover_after)
        self.period_s = period_s
        self.budget_s = budget_s
        self._clock, self._wall = clock, wall
        self._on_transition = on_transition
        self._periods = {k: v for k, v in (periods or {}).items() if v is not None}
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        now = clock()
        self._slots: dict[str, _Slot] = {}
        for p in probes:
            if p.name in self._slots:
                raise ValueError(f"two health probes named {p.name!r}")
            # the first run of every probe right away: status shows a level from the start
            self._slots[p.name] = _Slot(p, self._period_of(p), now)
        self._aware: tuple[Any, ...] = tuple(p for p in probes if isinstance(p, EventAware))
        unused = set(self._periods) - {n.split(":", 1)[0] for n in self._slots}
        if unused:
            _log.info("health_period_unused", keys=sorted(unused),
                      note="no probe of that name runs in this daemon")
        self._thread: threading.Thread | None = None
        self._worker: _Worker | None = None
        self._stopping = False
        self._own_cpu_s = 0.0
        self._retired_cpu_s = 0.0  # workers given up on (their last figure)

    def _period_of(self, p: Probe) -> float:
        own = self._periods.get(p.name.split(":", 1)[0])
        if own is None:
            own = p.period_s
        return float(own) if own is not None else self.period_s

    @property
    def probe_names(self) -> list[str]:
        return list(self._slots)

    def add_probes(self, probes: Sequence[Probe]) -> None:
        """Probes whose sources exist only later (the policy router, built after READY): they
        run at once and then at their period. A name already present is an error."""
        now = self._clock()
        with self._lock:
            for p in probes:
                if p.name in self._slots:
                    raise ValueError(f"two health probes named {p.name!r}")
                self._slots[p.name] = _Slot(p, self._period_of(p), now)
            self._aware += tuple(p for p in probes if isinstance(p, EventAware))
            self._wake.notify_all()

    # -- lifecycle -------------------------------------------------------------------------
    def start(self) -> None:
        with self._lock:
            if self._thread is not None or self._stopping:
                return
            self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
            self._thread.start()

    def stop(self, timeout: float = 2.0) -> None:
        """Stop the thread (a check in flight finishes on its own); idempotent, never raises."""
        with self._lock:
            self._stopping = True
            self._wake.notify_all()
            thread, worker = self._thread, self._worker
        if worker is not None:
            worker.jobs.put(None)
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)

    # -- the fast path (any thread) ------------------------------------------------------------
    def fail_now(self, probe_name: str, message: str, **figures: Figure) -> None:
        """An event seen elsewhere (an inference exception, a sensor timeout, a link fault) is
        a failed run of `probe_name` now, and that probe runs again at once. Unknown names are
        ignored (the probe is not part of this daemon)."""
        now = self._clock()
        with self._lock:
            slot = self._slots.get(probe_name)
            if slot is None or self._stopping:
                return
            slot.fast_fails += 1
            result = ProbeResult.error(message, **figures)
            slot.result, slot.ran_at = result, now
            transition = self.rules.observe(probe_name, slot.probe.mode, slot.probe.subject,
                                            result, now, fail_after_of(slot.probe))
            slot.due = now
            self._wake.notify_all()
        if transition is not None:
            self._emit(transition)

    def on_event(self, event: Event) -> None:
        """Every published event (any thread): a failure now for each probe whose `fails_on`
        says so (health/probe.py EventAware)."""
        for p in self._aware:
            try:
                why = p.fails_on(event)
            except Exception:  # a probe's filter must not break the publisher
                _log.exception("health_fails_on_raised", probe=getattr(p, "name", "?"))
                continue
            if why:
                self.fail_now(p.name, why, event=str(event.get("type")))

    # -- reading ---------------------------------------------------------------------------
    def degraded(self) -> list[str]:
        """The distinct modes active now (`state.degraded`)."""
        with self._lock:
            return self.rules.modes()

    def next_run(self, probe_name: str) -> float | None:
        """When `probe_name` runs next (monotonic), or None."""
        with self._lock:
            slot = self._slots.get(probe_name)
            return None if slot is None or slot.hung is not None else slot.due

    def cpu_s(self) -> float:
        """CPU seconds the monitor's threads used so far (its own loop and its probe runs)."""
        w = self._worker
        return self._own_cpu_s + self._retired_cpu_s + (w.cpu_s if w is not None else 0.0)

    def status(self) -> HealthStatus:
        """`status.health`: the active modes and every probe's level, figures, strikes, next run."""
        now, wall = self._clock(), self._wall()
        with self._lock:
            probes: dict[str, ProbeStatus] = {}
            for name, s in self._slots.items():
                r, c = s.result, self.rules.counts(name)
                nxt = None if s.hung is not None else max(0.0, s.due - now)
                probes[name] = {
                    "level": r.level.label if r is not None else None,
                    "message": r.message if r is not None else "not run yet",
                    "figures": dict(r.figures) if r is not None else {},
                    "mode": s.probe.mode.value if s.probe.mode is not None else None,
                    "subject": s.probe.subject, "strikes": c.failures, "good_runs": c.goods,
                    "holding": c.holding, "period_s": s.period_s, "runs": s.runs,
                    "stale_runs": s.stale, "fast_fails": s.fast_fails, "took_ms": s.took_ms,
                    "last_run_s_ago": None if s.ran_at is None else round(now - s.ran_at, 3),
                    "next_run_in_s": None if nxt is None else round(nxt, 3),
                    "next_run_wall": None if nxt is None else round(wall + nxt, 3),
                }
            active: list[ActiveMode] = [{"mode": m.value, "subject": sub}
                                        for m, sub in self.rules.active()]
            return {"degraded": self.rules.modes(), "active": active,
                    "fail_after": self.rules.fail_after,
                    "recover_after": self.rules.recover_after,
                    "period_s": self.period_s, "budget_s": self.budget_s,
                    "running": self._thread is not None and not self._stopping,
                    "cpu_s": round(self.cpu_s(), 4), "probes": probes}

    # -- the monitor's thread ----------------------------------------------------------------
    def _run(self) -> None:
        while True:
            ran = self.run_due()
            self._own_cpu_s = time.thread_time()
            if ran:
                continue
            with self._lock:
                if self._stopping:
                    return
                now = self._clock()
                waiting = [s.due for s in self._slots.values() if s.hung is None]
                wait = min(waiting, default=now + 3600.0) - now
                if any(s.hung is not None for s in self._slots.values()):
                    wait = min(wait, max(self.budget_s, 0.05))  # look again for its return
                if wait > 0:
                    self._wake.wait(min(wait, 3600.0))

    def run_due(self) -> int:
        """Run every probe that is due now, in due order (the monitor's thread calls this; a
        test may too, with its own clock). Returns how many ran."""
        with self._lock:
            if self._stopping:
                return 0
            self._reap_hung()
            now = self._clock()
            due = sorted((s for s in self._slots.values() if s.hung is None and s.due <= now),
                         key=lambda s: s.due)
        for slot in due:
            self._run_one(slot)
        return len(due)

    def _run_one(self, slot: _Slot) -> None:
        with self._lock:
            if self._stopping:
                return
            if self._worker is None:
                self._worker = _Worker(f"{self.name}-probe")
            worker = self._worker
            scheduled = slot.due
        now = self._clock()
        job = _Job(slot.probe, now)
        worker.jobs.put(job)
        if job.done.wait(self.budget_s):
            result = job.result or ProbeResult.error("the probe returned nothing")
            took = job.took_s
        else:  # past its budget: STALE, and the next checks go to a fresh worker
            result = ProbeResult(Level.STALE, f"no answer within {self.budget_s:g} s",
                                 {"budget_s": self.budget_s})
            took = self.budget_s
            _log.warning("health_probe_stale", probe=slot.probe.name, budget_s=self.budget_s)
            with self._lock:
                self._retired_cpu_s += worker.cpu_s
                worker.jobs.put(None)  # it exits once the hung check returns
                self._worker = None if self._stopping else _Worker(f"{self.name}-probe")
        with self._lock:
            slot.runs += 1
            slot.result, slot.ran_at, slot.took_ms = result, now, round(took * 1e3, 3)
            if result.level is Level.STALE:
                slot.stale += 1
                slot.hung = job
            if slot.due == scheduled:  # (after a fail_now() during the check: again now)
                # on the period's grid, not drifting by the checks' own time
                slot.due = max(slot.due + slot.period_s, now)
            transition = self.rules.observe(slot.probe.name, slot.probe.mode,
                                            slot.probe.subject, result, now,
                                            fail_after_of(slot.probe))
        if TAP.active:
            TAP.publish(obs.HEALTH, {"kind": "probe", "name": slot.probe.name,
                                     "level": result.level.name.lower(), "message": result.message,
                                     "figures": dict(result.figures), "took_ms": slot.took_ms})
        if transition is not None:
            self._emit(transition)

    def _reap_hung(self) -> None:
        """Lock held: a hung check that returned puts its probe back on the schedule."""
        now = self._clock()
        for s in self._slots.values():
            if s.hung is not None and s.hung.done.is_set():
                s.hung = None
                s.due = now

    def _emit(self, t: Transition) -> None:
        TAP.publish(obs.HEALTH, {"kind": "mode", "name": t.mode.value, "entered": t.entered,
                                 "subject": t.subject, "probe": t.probe, "cause": t.cause,
                                 "figures": dict(t.figures)})
        _log.warning("health_mode_entered" if t.entered else "health_mode_left",
                     mode=t.mode.value, subject=t.subject, probe=t.probe, cause=t.cause)
        try:
            self._on_transition(t, self)
        except Exception:  # the publisher or the reports: never the monitor's end
            _log.exception("health_transition_sink_failed", mode=t.mode.value)

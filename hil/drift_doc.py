"""The drift report for docs/REPORTS.md: a run with the trained policy, then one with an
untrained policy and a short `journal.drift_period_s` (called by hil/make_reports_doc.py).

The first daemon runs tasks with the trained policy under a long period and is stopped; the
second comes back with `journal.drift_period_s=45` and an untrained policy that asks to advance
at nearly every decision (models/make_test_policy.py, seed 0): it files the period it was down
across, then, 45 s on, this period against that one (as tests/test_drift_daemon.py does). A
loaded machine can stall the second run past its period (a deadman stop at start-up): then the
pair is run again, at most `attempts` times.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path

from hil.make_reports_doc import Daemon, reports_of, wait

PERIOD_S = 45


def run_drift(state_dir: Path, sets: list[str], attempts: int = 3) -> None:
    from inference_models import make_policy  # tests/ is on sys.path (make_reports_doc)

    model = make_policy(state_dir.parent, "untrained", seed=0)
    for _ in range(attempts):
        before = len(_drift_reports(state_dir))
        _trained_run(state_dir, sets, _decisions(state_dir) + 60)
        start = float(json.loads((state_dir / "drift.json").read_text())["start"])
        wait(lambda s=start: time.time() > s + PERIOD_S + 1, 60,
             "the saved period over")
        d = Daemon(state_dir, [*sets, f"journal.drift_period_s={PERIOD_S}",
                               f'inference.model="{model}"'])
        try:
            d.start()
            _tasks(d, lambda b=before: len(_drift_reports(state_dir)) >= b + 2)
        finally:
            d.stop()
        if any(reports_of(state_dir)[r]["details"]["verdict"] == "drift"
               for r in _drift_reports(state_dir)[before:]):
            return
    raise SystemExit(f"make_reports_doc: no drift verdict in {attempts} runs of the drift pair")


def _trained_run(state_dir: Path, sets: list[str], decisions: int) -> None:
    d = Daemon(state_dir, [*sets, "journal.drift_period_s=3600"]).start()
    try:
        _tasks(d, lambda: _decisions(state_dir) >= decisions)
    finally:
        d.stop()


def _tasks(d: Daemon, until: Callable[[], bool]) -> None:
    """Tasks back to back (a reset after a stop) until `until()`."""
    end = time.monotonic() + 300
    while not until():
        if time.monotonic() > end:
            raise SystemExit("make_reports_doc: timed out running tasks for the drift report")
        mode = d.status().get("mode")
        if mode == "idle":
            d.cmd_("task.start", task="pick_place")
        elif mode not in ("running", None):
            d.cmd_("reset")
        wait(lambda: until() or d.status().get("mode") != "running", 120, "a task's end")


def _decisions(state_dir: Path) -> int:
    from edge_agent.store.decisions import journal_dir, read_decisions

    return sum(1 for _ in read_decisions(journal_dir(state_dir)))


def _drift_reports(state_dir: Path) -> list[str]:
    return [rid for rid, r in reports_of(state_dir).items() if r["kind"] == "drift"]

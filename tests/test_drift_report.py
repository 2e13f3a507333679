"""The periodic drift report (issue #28 item 5), below the daemon: counters, KL, periods, restart.

A real DecisionJournal counts what it journals (store/drift_tally.py); DriftReports is stepped
with a wall clock the test sets, so a period boundary is exact: one period like the last gives
`no drift`, one whose grasp decisions shift to `retry_alternative` gives `drift` with that state
named. The state file survives a restart, and a daemon down across a boundary files on its
first step back. The label counts come from the real label file through the subprocess.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest
from test_reports_chat import classic_problems

from edge_agent.config import load_config
from edge_agent.daemon.drift import STATE_NAME, DriftReports
from edge_agent.reports.chat import chat_summary
from edge_agent.reports.drift import DRIFT, NO_DRIFT, TOO_FEW, compare, period_summary
from edge_agent.reports.markdown import render_markdown
from edge_agent.reports.plot import render_plot
from edge_agent.reports.record import Origin, Report, ReportKind
from edge_agent.store.decisions import DecisionJournal, journal_dir
from edge_agent.store.drift_tally import DriftTally
from edge_agent.store.labels import LabelFile

SIM = Path(__file__).resolve().parents[1] / "configs" / "sim.toml"
ORIGIN = Origin("dev1", "boot-1234567890", "cfg-abc")
# a period 3 of [T0 + 200, T0 + 300) holds the labels this test gives now (in real wall time):
# set as each test starts, not at import (in a whole-suite run that was minutes before)
T0 = 0.0


@pytest.fixture(autouse=True)
def _t0_now() -> None:
    global T0
    T0 = float(int(time.time())) - 250


class Clock:
    def __init__(self) -> None:
        self.t = T0

    def __call__(self) -> float:
        return self.t


def _rig(tmp: Path, period: float = 100.0) -> tuple[DriftReports, DecisionJournal, Clock,
                                                     list[Report]]:
    cfg = load_config(SIM, [f"state_dir={tmp}", f"journal.drift_period_s={period}",
                            "journal.drift_threshold=0.15"], sim=True)
    dj = DecisionJournal(journal_dir(tmp))
    dj.open()
    filed: list[Report] = []
    clock = Clock()
    drift = DriftReports(cfg, dj, lambda make: filed.append(make()) is None, lambda: ORIGIN,
                         wall=clock)
    drift.load()
    return drift, dj, clock, filed


def _decide(dj: DecisionJournal, state: str, action: str | None, n: int) -> None:
    for i in range(n):
        assert dj.record({"t": float(i), "state": state, "observation": [0.1, 0.2],
                          "action": action, "backend": "onnx-cpu", "latency_ms": 0.3,
                          "outcome": "ok"})


def _normal(dj: DecisionJournal) -> None:
    _decide(dj, "approach", "continue", 150)
    _decide(dj, "grasp", "continue", 80)
    _decide(dj, "grasp", "advance", 40)
    _decide(dj, "transfer", "continue", 100)


def test_the_tally_loses_no_count_while_it_is_taken() -> None:
    tally = DriftTally()
    n, taken = 200_000, []

    def count() -> None:
        for i in range(n):
            tally.count_decision("grasp", "advance" if i % 4 else None)

    t = threading.Thread(target=count)
    t.start()
    while t.is_alive():
        taken.append(tally.take())
    t.join()
    taken.append(tally.take())
    grasp = [x["actions"].get("grasp", {}) for x in taken]
    assert sum(g.get("advance", 0) for g in grasp) == n * 3 // 4
    assert sum(g.get("none", 0) for g in grasp) == n // 4
    assert len(taken) > 2  # it was taken while counting, not only at the end


def test_kl_verdicts_same_shifted_and_too_few() -> None:
    base = {"actions": {"grasp": {"continue": 80, "advance": 40}, "transfer": {"continue": 90}}}
    same = period_summary(base, T0, T0 + 1, None)
    shifted = period_summary({"actions": {"grasp": {"retry_alternative": 70, "advance": 50},
                                          "transfer": {"continue": 90}}}, T0, T0 + 1, None)
    assert compare(same, same, 0.15)["verdict"] == NO_DRIFT
    c = compare(shifted, same, 0.15)
    assert c["verdict"] == DRIFT and c["drifted_states"] == ["grasp"]
    assert c["kl_per_state"]["grasp"] > 0.15 > c["kl_per_state"]["transfer"] == 0.0
    assert compare(shifted, None, 0.15)["verdict"] == TOO_FEW
    few = period_summary({"actions": {"grasp": {"advance": 5}}}, T0, T0 + 1, None)
    assert compare(few, same, 0.15)["verdict"] == TOO_FEW


def test_a_shifted_period_is_reported_as_drift_with_the_state_named(tmp_path: Path) -> None:
    drift, dj, clock, filed = _rig(tmp_path)
    try:
        _normal(dj)
        dj.record_episode({"task_id": "a", "outcome": "success", "l3": False, "l1": 0})
        clock.t += 50
        assert drift.tick() is None  # mid-period: counted and saved, nothing filed
        clock.t += 50
        first = drift.tick()
        assert first is not None and first.details["verdict"] == TOO_FEW  # no reference yet
        _normal(dj)  # period 2: like period 1
        for i, ok in enumerate((True, True, False)):
            dj.record_episode({"task_id": f"b{i}", "outcome": "success" if ok else "failed",
                               "l3": not ok, "l1": 0 if ok else 3})
        clock.t += 100
        second = drift.tick()
        assert second is not None and second.details["verdict"] == NO_DRIFT, second.details
        assert second.details["this"]["success_rate"] == pytest.approx(2 / 3, abs=1e-3)
        assert second.details["this"]["l3"] == 1
        # period 3: the grasp decisions shift to retry_alternative; two labels given in it
        _decide(dj, "approach", "continue", 150)
        _decide(dj, "grasp", "retry_alternative", 90)
        _decide(dj, "grasp", "advance", 30)
        _decide(dj, "transfer", "continue", 100)
        labels = LabelFile(journal_dir(tmp_path))
        labels.append({"task_id": "b2", "verdict": "wrong", "by": "test"})
        labels.append({"task_id": "b1", "verdict": "needs_work", "step": 0, "by": "test"})
        clock.t += 100  # T0 + 300: the labels' wall time (now) lies in [T0 + 200, T0 + 300)
        third = drift.tick()
    finally:
        dj.stop()
    assert third is not None and filed == [first, second, third]
    d = third.details
    assert d["verdict"] == DRIFT and d["drifted_states"] == ["grasp"], d
    assert d["kl_per_state"]["grasp"] > 0.15 and d["kl_per_state"]["approach"] == 0.0
    assert d["this"]["actions"]["grasp"] == {"retry_alternative": 90, "advance": 30}
    assert d["last"]["actions"]["grasp"] == {"continue": 80, "advance": 40}
    assert d["this"]["labels"] == {"correct": 0, "wrong": 1, "needs_work": 1}
    assert third.kind is ReportKind.DRIFT and third.title.startswith("Policy drift: KL")
    md = render_markdown(third, plot_name=f"{third.id}.png")
    for want in ("**drift**", "| grasp |", "retry_alternative", "| success rate |",
                 "| L3 (episodes ended in diagnostic) |", "wrong 1, needs_work 1",
                 f"![action distribution]({third.id}.png)"):
        assert want in md, (want, md)
    text = chat_summary(third, report_topic="edge/dev1/report", plot=True)
    assert classic_problems(text) == [], text
    assert "drift</font>: KL" in text and "labels 0/1/1" in text
    assert Report.from_dict(json.loads(json.dumps(third.as_dict()))) == third


def test_the_period_survives_a_restart_and_a_missed_boundary_is_filed_on_return(
        tmp_path: Path) -> None:
    drift, dj, clock, filed = _rig(tmp_path)
    _normal(dj)
    clock.t += 30
    drift.checkpoint()  # what stop() does
    dj.stop()
    saved = json.loads((tmp_path / STATE_NAME).read_text())
    assert saved["start"] == T0 and saved["counts"]["actions"]["grasp"]["advance"] == 40
    # back 300 s later: three periods have passed while it was down
    again, dj2, clock2, filed2 = _rig(tmp_path)
    clock2.t = T0 + 330
    assert again.start_wall == T0
    try:
        _decide(dj2, "grasp", "advance", 5)
        rep = again.tick()
    finally:
        dj2.stop()
    assert rep is not None and filed2 == [rep] and filed == []
    this = rep.details["this"]
    assert this["start"] == T0 and this["end"] == T0 + 330
    assert this["actions"]["grasp"] == {"continue": 80, "advance": 45}
    assert json.loads((tmp_path / STATE_NAME).read_text())["start"] == T0 + 330


def test_the_plot_subprocess_draws_the_action_bars(tmp_path: Path) -> None:
    last = period_summary({"actions": {"grasp": {"continue": 80, "advance": 40}}},
                          T0, T0 + 9, {"correct": 1, "wrong": 0, "needs_work": 0})
    this = period_summary({"actions": {"grasp": {"retry_alternative": 90, "advance": 30},
                                       "transfer": {"continue": 20}}}, T0 + 9, T0 + 18, None)
    from edge_agent.reports.drift import build_drift_report

    r = build_drift_report(this, last, 0.15, 9.0, ORIGIN, mono=1.0)
    src = tmp_path / "r.json"
    src.write_text(json.dumps(r.as_dict()))
    why = render_plot(src, tmp_path / "r.png", cache_dir=tmp_path / "mpl")
    assert why is None and (tmp_path / "r.png").read_bytes()[:4] == b"\x89PNG"

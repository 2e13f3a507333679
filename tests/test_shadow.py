"""The shadow runner (inference/shadow.py) with real onnxruntime sessions verified by the model
cache, its tally, its journal records and its report: the shipped model shadowing itself agrees
on every decision; a different candidate's confusion accounts for every decision; a full queue
drops the oldest and counts it; the report renders (Markdown, chat) with where they differ."""

from __future__ import annotations

import hashlib
import time
from pathlib import Path
from typing import Any

import pytest
from inference_models import make_policy, observations
from mosquitto import wait_until

from edge_agent.inference.assembly import ACTION_LABELS, OBS_FIELD_UNITS
from edge_agent.inference.backend import DecisionRecord
from edge_agent.inference.model_cache import ModelCache
from edge_agent.inference.model_card import ModelCard, ModelError
from edge_agent.inference.shadow import ShadowRunner
from edge_agent.inference.shadow_tally import ShadowTally, percentile
from edge_agent.reports.chat import chat_summary
from edge_agent.reports.markdown import render_markdown
from edge_agent.reports.record import Origin, Report, ReportKind
from edge_agent.reports.shadow import build_shadow_report
from edge_agent.store.decisions import SHADOW_NAME, DecisionJournal, read_decisions

REPO = Path(__file__).resolve().parents[1]
SHIPPED = REPO / "models" / "pick-place-policy.onnx"


def _verified(tmp: Path, model: Path) -> tuple[Any, ModelCard]:
    cache = ModelCache(tmp / "cache", fields=OBS_FIELD_UNITS, labels=ACTION_LABELS)
    card = ModelCard.load(model.with_suffix(".card.json"))
    sha = hashlib.sha256(model.read_bytes()).hexdigest()
    session, card = cache.verify(model.read_bytes(), card, sha256=sha)[:2]
    assert not (tmp / "cache").exists()  # verified, nothing installed
    return session, card


def _acting(session: Any, n: int, seed: int = 1) -> list[DecisionRecord]:
    """Decisions as the router records them, decided by `session` (the acting model)."""
    import numpy as np

    name = session.get_inputs()[0].name
    out = []
    for i, obs in enumerate(observations(n, seed)):
        y = session.run(None, {name: np.array(obs.vector, dtype=np.float32, ndmin=2)})[0][0]
        out.append(DecisionRecord(float(i), obs.state.value, obs.vector,
                                  ACTION_LABELS[int(np.argmax(y))], "local", 0.2, "ok",
                                  (("local", "ok"),)))
    return out


def test_percentile_and_tally_by_state() -> None:
    assert percentile([], 0.99) is None
    assert percentile([3.0, 1.0, 2.0], 0.5) == 2.0
    assert percentile(range(1, 101), 0.99) == 99
    t = ShadowTally()
    t.count("approach", "continue", "continue", 0.2, 0.1)
    t.count("approach", "continue", "advance", 0.3, 0.1, "job-1", 7, "local")
    t.count("grasp", "advance", "advance", 0.4, 0.2)
    s = t.summary()
    assert s["decisions"] == 3 and s["agreement"] == round(2 / 3, 4) and s["differ"] == 1
    assert s["per_state"]["approach"]["agreement"] == 0.5
    assert s["per_state"]["grasp"]["agreement"] == 1.0
    assert s["confusion"] == {"advance": {"advance": 1}, "continue": {"advance": 1,
                                                                     "continue": 1}}
    assert s["examples"] == [{"task_id": "job-1", "step": 7, "state": "approach",
                              "acting": "continue", "shadow": "advance",
                              "acting_backend": "local"}]
    assert s["latency"]["acting_p99_ms"] == 0.4 and s["latency"]["shadow_p50_ms"] == 0.1


def test_the_shipped_model_shadowing_itself_agrees_on_every_decision(tmp_path: Path) -> None:
    session, card = _verified(tmp_path, SHIPPED)
    runner = ShadowRunner(session, card)
    for rec in _acting(session, 300):
        runner.compare(rec)
    s = runner.summary()
    assert s["decisions"] == 300 and s["agreement"] == 1.0 and s["examples"] == []
    assert all(v["agreement"] == 1.0 for v in s["per_state"].values())
    assert s["latency"]["shadow_p99_ms"] is not None and s["errors"] == 0


def test_a_different_candidate_on_its_thread_journal_and_report(tmp_path: Path) -> None:
    acting_session, _ = _verified(tmp_path / "a", SHIPPED)
    cand = make_policy(tmp_path, "candidate", seed=7, version="candidate-7")
    session, card = _verified(tmp_path / "c", cand)
    journal = DecisionJournal(tmp_path / "journal")
    journal.open()
    reports: list[dict[str, Any]] = []
    runner = ShadowRunner(session, card, record=journal.record_shadow, report_after=150,
                          on_report=reports.append)
    runner.start()
    try:
        for i, rec in enumerate(_acting(acting_session, 200, seed=3)):
            runner.offer(rec, "job-1", i)
            if i % 50 == 49:  # the control thread never waits; the test lets the worker run
                wait_until(lambda: runner.summary()["queued"] == 0, 30, "the worker caught up")
        wait_until(lambda: runner.summary()["decisions"] == 200, 30, "200 compared")
    finally:
        s = runner.stop()
    assert s["dropped"] == 0 and s["errors"] == 0
    assert sum(sum(row.values()) for row in s["confusion"].values()) == 200
    agree = sum(row.get(a, 0) for a, row in s["confusion"].items())
    assert s["agreement"] == round(agree / 200, 4) and s["differ"] == 200 - agree
    assert len(reports) == 1 and reports[0]["decisions"] >= 150  # once, at report_after
    assert journal.flush(10)
    journal.stop()
    recs = list(read_decisions(tmp_path / "journal", SHADOW_NAME))
    assert len(recs) == 200 and {r.backend for r in recs} == {f"shadow:{card.sha256[:12]}"}
    assert {r.task_id for r in recs} == {"job-1"} and [r.step for r in recs] == list(range(200))
    assert sum(r.outcome == "agree" for r in recs) == agree
    assert list(read_decisions(tmp_path / "journal")) == []  # the acting journal: untouched

    report = build_shadow_report(s, "stopped", Origin("dev1", "b" * 32, "cfg"), wall=time.time(),
                                 mono=1.0)
    again = Report.from_dict(report.as_dict())
    assert again.kind is ReportKind.SHADOW and again.details["decisions"] == 200
    md = render_markdown(again)
    for section in ("## Agreement", "## Per executor state", "## Confusion",
                    "## Where they differ"):
        assert section in md
    if s["differ"]:
        first = s["examples"][0]
        assert f"| job-1 | {first['step']} |" in md
    assert "agreement" in chat_summary(again, report_topic="edge/dev1/report")


def test_a_full_queue_drops_the_oldest_and_counts_it(tmp_path: Path) -> None:
    session, card = _verified(tmp_path, SHIPPED)
    runner = ShadowRunner(session, card, queue_max=4)  # not started: nothing drains it
    recs = _acting(session, 10)
    for r in recs:
        runner.offer(r)
    runner.offer(recs[0]._replace(action=None))  # an acting no-decision: nothing to compare
    s = runner.summary()
    assert s["dropped"] == 6 and s["queued"] == 4 and s["skipped"] == 1
    runner.start()
    wait_until(lambda: runner.summary()["decisions"] == 4, 30, "the newest 4 compared")
    assert runner.stop()["agreement"] == 1.0


def test_verify_refuses_a_bad_sha_like_install(tmp_path: Path) -> None:
    cache = ModelCache(tmp_path / "cache", fields=OBS_FIELD_UNITS, labels=ACTION_LABELS)
    with pytest.raises(ModelError, match="sha256 mismatch"):
        cache.verify(SHIPPED.read_bytes(), None, sha256="0" * 64)


def test_the_worker_says_which_scheduling_it_got(tmp_path: Path) -> None:
    """inference.shadow_priority: SCHED_FIFO when the process may (root, CAP_SYS_NICE), else
    SCHED_OTHER with the refusal — the shadow runs either way."""
    session, card = _verified(tmp_path, SHIPPED)
    runner = ShadowRunner(session, card, priority=1, poll_s=0.005)
    runner.start()
    try:
        runner.offer(_acting(session, 1)[0])
        wait_until(lambda: runner.summary()["decisions"] == 1, 30, "one compared")
        got = runner.summary()["scheduling"]
        assert got == "SCHED_FIFO 1" or got.startswith("SCHED_OTHER (SCHED_FIFO 1 refused"), got
    finally:
        runner.stop()
    plain = ShadowRunner(session, card)
    assert plain.summary()["scheduling"] == "SCHED_OTHER"

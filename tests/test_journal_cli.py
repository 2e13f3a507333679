"""`edge-agent journal drift` on a journal written by the real DecisionJournal sink (the export:
test_journal_export.py)."""

from __future__ import annotations

import json
import math
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from edge_agent.journal_cli import action_distribution, kl_divergence
from edge_agent.store.decisions import DecisionJournal, journal_dir

REPO = Path(__file__).resolve().parents[1]


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "edge_agent.cli", "journal", *args],
                          capture_output=True, text=True, cwd=REPO, timeout=60, check=False)


def _write(state_dir: Path, actions: list[str | None], seed: int = 3) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    recs = []
    dj = DecisionJournal(journal_dir(state_dir))
    dj.open()
    for i, a in enumerate(actions):
        rec = {"t": 100.0 + i * 0.05, "observation": [rng.uniform(-1, 1) for _ in range(6)],
               "action": a, "backend": None if a is None else rng.choice(["onnx-cpu", "triton"]),
               "latency_ms": rng.uniform(0.1, 5.0), "outcome": "ok" if a else "no_decision",
               "state": rng.choice(["approach", "grasp"]), "accepted": i % 3 != 0}
        assert dj.record(rec)
        recs.append(rec)
        if i % 500 == 499:
            assert dj.flush(10)  # the sink's queue is bounded (1024): a tight loop must wait
    dj.stop()
    return recs


def _draw(rng: random.Random, weights: dict[str, float], n: int) -> list[str | None]:
    labels = list(weights)
    return [None if x == "none" else x
            for x in rng.choices(labels, weights=[weights[k] for k in labels], k=n)]


def test_drift_is_flagged_only_when_the_action_mix_changes(tmp_path: Path) -> None:
    rng = random.Random(2)
    same = tmp_path / "same"
    _write(same, _draw(rng, {"continue": 7, "advance": 2, "abort": 1}, 2000))
    res = _cli("drift", "--state-dir", str(same), "--window", "1000")
    assert res.returncode == 0, res.stdout + res.stderr
    rep = json.loads(res.stdout)
    assert rep["drift"] is False and rep["kl"] < 0.15 and rep["window"] == 1000

    moved = tmp_path / "moved"
    _write(moved, _draw(rng, {"continue": 7, "advance": 2, "abort": 1}, 1000)
           + _draw(rng, {"continue": 3, "advance": 1, "retry_alternative": 3, "none": 3}, 1000))
    res = _cli("drift", "--state-dir", str(moved), "--window", "1000", "--threshold", "0.15")
    assert res.returncode == 1, res.stdout + res.stderr
    rep = json.loads(res.stdout)
    assert rep["drift"] is True and rep["kl"] > 0.15
    assert rep["current"]["retry_alternative"] > 0.2 > rep["reference"]["retry_alternative"]


def test_drift_needs_two_windows_and_export_needs_a_journal(tmp_path: Path) -> None:
    _write(tmp_path, ["continue"] * 30)
    res = _cli("drift", "--state-dir", str(tmp_path))
    assert res.returncode == 2 and "need at least" in res.stderr
    res = _cli("export", "--state-dir", str(tmp_path / "nothing"), "--out",
               str(tmp_path / "x"))
    assert res.returncode == 2 and "no decision journal" in res.stderr
    assert _cli("drift", "--state-dir", str(tmp_path), "--window", "3").returncode == 2


def test_kl_divergence_matches_a_hand_computation() -> None:
    p = {"a": 0.5, "b": 0.5}
    q = {"a": 0.9, "b": 0.1}
    assert kl_divergence(p, q) == pytest.approx(0.5 * math.log(0.5 / 0.9)
                                                + 0.5 * math.log(0.5 / 0.1))
    assert kl_divergence(p, p) == 0.0
    # smoothing: an action never seen in the reference still gives a finite divergence
    labels = ["advance", "continue"]
    cur = action_distribution(["advance"] * 10, labels)
    ref = action_distribution(["continue"] * 10, labels)
    assert cur["advance"] == pytest.approx(10.5 / 11) and math.isfinite(kl_divergence(cur, ref))

"""Issue 28 item 4: models/finetune_policy.py fine-tunes the parent model on an export. The
dataset is written by the store's real writers (DecisionJournal, episode records, LabelFile) and
exported by the CLI, as tests/test_journal_export.py; the fine-tune runs as its own process."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pyarrow")
pytest.importorskip("onnx")

from edge_agent.executor.policy import ExpertPolicy
from edge_agent.inference.model_card import ModelCard
from edge_agent.policy_seam import OBS_DIM, OBS_INDEX, Action, Observation
from edge_agent.store.decisions import DecisionJournal, journal_dir
from edge_agent.store.episodes import EpisodeMark
from edge_agent.store.labels import LabelFile
from edge_agent.vocab import EventType, State

REPO = Path(__file__).resolve().parents[1]
PARENT = REPO / "models" / "pick-place-policy.onnx"
ACTS = ["continue", "advance", "retry_alternative", "abort"]


def _obs(step: int) -> tuple[list[float], str]:
    """A lift-state observation; every 5th has its sub-goal met (the expert: advance)."""
    v = [0.0] * OBS_DIM
    v[OBS_INDEX["state_lift"]] = 1.0
    v[OBS_INDEX["attempt_elapsed_s"]] = 0.05 * step
    v[OBS_INDEX["subgoal_met"]] = 1.0 if step % 5 == 4 else 0.0
    return v, "lift"


def _write(state_dir: Path) -> None:
    dj = DecisionJournal(journal_dir(state_dir))
    dj.open()
    mark = EpisodeMark()
    dj.episode = mark
    t = 1000.0
    for k in range(3):
        task = f"job-{k}"
        mark.follow({"type": EventType.TASK_STARTED, "task_id": task})
        for step in range(10):
            t += 0.05
            v, state = _obs(step)
            # the robot took `continue` everywhere: wrong where the sub-goal was met
            assert dj.record({"t": t, "observation": v, "action": "continue",
                              "backend": "onnx-cpu", "latency_ms": 0.5, "outcome": "ok",
                              "state": state, "accepted": True})
        mark.follow({"type": EventType.TASK_DONE, "task_id": task})
        n, backends = mark.counts(task)
        assert dj.flush(10)
        assert dj.record_episode({"task_id": task, "task": "pick_and_place", "outcome": "success",
                                  "decisions": n, "backends": backends, "attempts": 1, "l1": 0,
                                  "l2": 0, "l3": False, "model": None})
        assert dj.flush(10)
    dj.stop()
    labels = LabelFile(journal_dir(state_dir))
    labels.append({"task_id": "job-0", "verdict": "wrong", "step": 4, "note": "met: advance"})
    labels.append({"task_id": "job-0", "verdict": "wrong", "step": 9})
    labels.append({"task_id": "job-1", "verdict": "needs_work"})  # the whole episode: left out
    labels.append({"task_id": "job-2", "verdict": "correct", "step": 0})


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    res = subprocess.run([sys.executable, *args], capture_output=True, text=True, cwd=REPO,
                         timeout=300, check=False, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert res.returncode == 0, res.stdout + res.stderr
    return res


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("ft")
    _write(root / "state")
    _run("-m", "edge_agent.cli", "journal", "export", "--state-dir", str(root / "state"),
         "--out", str(root / "ds"), "--fps", "20", "--json")
    return root / "ds"


def _finetune(ds: Path, out: Path, *extra: str) -> dict[str, Any]:
    _run("models/finetune_policy.py", "--parent", str(PARENT), "--dataset", str(ds),
         "--out", str(out), "--epochs", "3", "--eval-episodes", "0", "--jobs", "1", *extra)
    return dict(json.loads(out.with_name(out.stem + ".card.json").read_text()))


def test_finetune_relabels_wrong_by_the_expert_at_a_tenth_of_the_lr(dataset: Path,
                                                                    tmp_path: Path) -> None:
    card = _finetune(dataset, tmp_path / "a" / "cand.onnx")
    tr = card["training"]
    parent = json.loads(PARENT.with_name("pick-place-policy.card.json").read_text())
    assert tr["lr"] == pytest.approx(parent["training"]["lr"] / 10)
    assert tr["initial_lr"] == parent["training"]["lr"]
    assert tr["parent"]["sha256"] == hashlib.sha256(PARENT.read_bytes()).hexdigest()
    assert tr["parent"]["sha256"] == parent["sha256"]
    assert tr["episodes"] == 3 and tr["datasets"][0]["frames"] == 30
    assert tr["labels"] == {"correct": 1, "wrong": 2, "needs_work": 10}
    # job-0's two wrong steps (4 and 9: the sub-goal met): the expert says advance
    v4, v9 = _obs(4)[0], _obs(9)[0]
    expert = ExpertPolicy()
    assert expert.decide(Observation(State.LIFT, tuple(v4))) is Action.ADVANCE
    assert expert.decide(Observation(State.LIFT, tuple(v9))) is Action.ADVANCE  # 9 % 5 == 4
    assert tr["targets"]["relabelled_wrong"] == 2 and tr["targets"]["relabelled_changed"] == 2
    assert tr["targets"]["dropped_needs_work"] == 10 and tr["targets"]["kept_taken"] == 18
    assert tr["action_counts"] == {"continue": 18, "advance": 2, "retry_alternative": 0,
                                   "abort": 0}
    assert tr["datasets"][0]["sha256"] and len(tr["datasets"][0]["sha256"]) == 64
    # the daemon's card loader accepts the candidate; the file's sha256 is the card's
    model = tmp_path / "a" / "cand.onnx"
    parsed = ModelCard.load(model.with_name("cand.card.json"))
    assert parsed.sha256 == hashlib.sha256(model.read_bytes()).hexdigest()
    assert parsed.version.startswith(parent["version"] + "+ft.")
    assert card["inputs"] == parent["inputs"] and card["outputs"] == parent["outputs"]

    assert tr["evaluation"] is None  # --eval-episodes 0

    # --needs-work expert: job-1's ten frames relabelled too (two of them changed: met); with
    # one held-out lock-step episode of the no-fault class, parent and candidate on one seed
    tr2 = _finetune(dataset, tmp_path / "c" / "cand.onnx", "--needs-work", "expert",
                    "--eval-episodes", "1", "--eval-faults", "none")["training"]
    assert tr2["targets"]["relabelled_needs_work"] == 10
    assert tr2["targets"]["relabelled_changed"] == 4 and tr2["observations"] == 30
    ev = tr2["evaluation"]
    assert ev["episodes_per_class"] == 1 and [r["fault"] for r in ev["success"]] == ["none"]
    row = ev["success"][0]
    assert row["parent"] == 100.0, row  # the shipped model picks and places with no fault
    assert row["candidate"] in (0.0, 100.0) and row["candidate_attempts"] > 0, row


def test_finetune_is_deterministic_for_a_seed(dataset: Path, tmp_path: Path) -> None:
    a, b = (tmp_path / n / "cand.onnx" for n in ("a", "b"))
    _finetune(dataset, a)
    _finetune(dataset, b)
    assert a.read_bytes() == b.read_bytes()
    assert (a.with_name("cand.card.json").read_bytes()
            == b.with_name("cand.card.json").read_bytes())
    assert a.read_bytes() != PARENT.read_bytes()  # the weights moved

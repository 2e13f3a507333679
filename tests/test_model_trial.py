"""The model trial's shell (daemon/model_trial.py) in-process, on a real model cache and real
files: the crash windows of the trial record (pending, rolling_back), a clean stop that resumes,
the refusals, the bad list's persistence, the commit by time. The cache's `revert` is the real
one; only the session reload is left out (the daemon tests run the whole path)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from config_helpers import load
from inference_models import make_policy, wait_for

from edge_agent.daemon.model_trial import ModelTrial, UpdateRefused
from edge_agent.daemon.trial_store import TrialStore
from edge_agent.inference.model_cache import CachedModel, ModelCache
from edge_agent.inference.model_card import ModelCard, card_path_for


class Stack:
    """The trial's view of the inference stack: the real cache; the reloads are counted."""

    def __init__(self, cache: ModelCache) -> None:
        self.cache = cache
        self.reverts: list[tuple[str, bool]] = []

    def revert_model(self, bad: str, *, reload: bool = True) -> CachedModel:
        self.reverts.append((bad, reload))
        return self.cache.revert(bad)


def _install(cache: ModelCache, directory: Path, seed: int) -> ModelCard:
    path = make_policy(directory, f"m{seed}", seed=seed, version=f"v{seed}")
    card = ModelCard.load(card_path_for(path))
    cache.install(path, card)
    return card


@pytest.fixture
def rig(tmp_path: Path) -> tuple[Any, Stack, ModelCard, ModelCard]:
    cfg = load(tmp_path, {"inference": {"trial_tasks": "3", "trial_s": "100.0"}})
    cache = ModelCache(Path(cfg.state_dir) / "models")
    old = _install(cache, tmp_path / "src", 1)
    new_path = make_policy(tmp_path / "src", "m2", seed=2, version="v2")
    return cfg, Stack(cache), old, ModelCard.load(card_path_for(new_path))


def _trial(cfg: Any, events: list[dict[str, Any]], reports: list[Any]) -> ModelTrial:
    t = ModelTrial(cfg, events.append)
    t.attach(lambda make: reports.append(make) or True, lambda fn: None)
    return t


def _start_trial(t: ModelTrial, stack: Stack, new: ModelCard, tmp_path: Path) -> None:
    t.check_update(new.sha256, False)
    assert t.begin(stack, new.sha256)
    assert stack.cache is not None
    stack.cache.install(tmp_path / "src" / "m2.onnx", new)
    t.installed(new)


def test_a_crash_before_the_install_drops_the_pending_record(rig: Any, tmp_path: Path) -> None:
    cfg, stack, old, new = rig
    events: list[dict[str, Any]] = []
    t = _trial(cfg, events, [])
    assert t.begin(stack, new.sha256)  # then the process dies before the pointer moved
    assert json.loads(TrialStore(cfg.state_dir).trial_path.read_text())["state"] == "pending"
    again = _trial(cfg, events, [])
    again.at_start(stack)
    assert again.status()["trial"] is None and stack.reverts == []
    assert not TrialStore(cfg.state_dir).trial_path.exists()
    assert again.status()["current"]["sha256"] == old.sha256


def test_a_crash_mid_rollback_is_finished_at_start(rig: Any, tmp_path: Path) -> None:
    cfg, stack, old, new = rig
    events: list[dict[str, Any]] = []
    t = _trial(cfg, events, [])
    _start_trial(t, stack, new, tmp_path)
    t.stop()  # stands in for the thread; the record is then edited to the crash window
    store = TrialStore(cfg.state_dir)
    rec = store.load_trial()
    assert rec is not None
    rec.update(state="rolling_back", verdict={"reasons": ["decision latency: test"]})
    store.save_trial(rec)
    store.mark_bad(new.sha256, new.name, new.version, ["decision latency: test"])
    reports: list[Any] = []
    again = _trial(cfg, events, reports)
    again.at_start(stack)
    st = again.status()
    assert st["trial"]["state"] == "rolled_back" and st["current"]["sha256"] == old.sha256
    assert stack.reverts == [(new.sha256, False)]  # before any session: no reload
    assert len(reports) == 1 and [b["sha256"] for b in st["bad"]] == [new.sha256]


def test_a_clean_stop_resumes_the_trial_with_its_evidence(rig: Any, tmp_path: Path) -> None:
    cfg, stack, _, new = rig
    events: list[dict[str, Any]] = []
    t = _trial(cfg, events, [])
    _start_trial(t, stack, new, tmp_path)
    t.taps.on_event({"type": "task_done", "outcome": "success"})
    t.stop()
    again = _trial(cfg, events, [])
    again.at_start(stack)
    st = again.status()["trial"]
    assert st["state"] == "on_trial" and st["tasks_done"] == 1, st
    with pytest.raises(UpdateRefused, match="is on trial"):
        again.check_update("ab" * 32, False)
    # nothing wrong by the deadline: committed by time
    assert again.step(now_wall=st["started_wall"] + 101.0)
    st = again.status()["trial"]
    assert st["state"] == "committed" and st["verdict"]["by"] == "time", st
    assert [e["type"] for e in events][-1] == "model_committed"
    again.stop()


def test_a_slow_candidate_rolls_back_and_stays_bad_across_restarts(
        rig: Any, tmp_path: Path) -> None:
    from edge_agent.inference.backend import DecisionRecord

    cfg, stack, old, new = rig
    events: list[dict[str, Any]] = []
    reports: list[Any] = []
    t = _trial(cfg, events, reports)
    _start_trial(t, stack, new, tmp_path)
    for i in range(5):
        t.taps.on_decision(DecisionRecord(float(i), "approach", (0.0,), "continue", "local",
                                          0.009, "ok", (("local", "ok"),)))
    wait_for(lambda: t.status()["trial"]["state"] == "rolled_back", 30, "the rollback")
    t.stop()
    st = t.status()
    assert st["trial"]["state"] == "rolled_back" and st["current"]["sha256"] == old.sha256, st
    assert stack.reverts == [(new.sha256, True)] and len(reports) == 1
    assert events[-1]["type"] == "model_rolled_back"
    restarted = _trial(cfg, events, [])
    restarted.at_start(stack)
    with pytest.raises(UpdateRefused, match="marked bad"):
        restarted.check_update(new.sha256, False)
    restarted.check_update(new.sha256, True)  # the operator's override passes

"""The shipped trained policy (models/pick-place-policy.onnx): its card, its bytes, and that it
decides like the expert it was cloned from — on fresh lock-step episodes, through onnxruntime."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from edge_agent.executor.policy import ExpertPolicy
from edge_agent.inference.model_cache import ModelCache
from edge_agent.inference.model_card import (
    ModelCard,
    card_path_for,
    meaning_problems,
    sha256_file,
    signature_problems,
)
from edge_agent.policy_seam import OBS_DIM, OBS_FIELDS, Action, Observation, action_from_scores
from edge_agent.robot import load_robot
from hil.episodes import DEFAULT_ROBOT, run_episode, transient_slip

MODEL = Path(__file__).resolve().parents[1] / "models" / "pick-place-policy.onnx"
FIELDS = [(f.name, f.unit) for f in OBS_FIELDS]
LABELS = [a.name.lower() for a in Action]
ROBOT = load_robot(DEFAULT_ROBOT)
# Seeds 8e6+: neither the trainer's demonstrations ((10 + seed) × 1e6+) nor its evaluation (5e6+).
FRESH = [(8_000_000, None, None), (8_000_001, None, None),
         (8_010_000, "gripper:weak_close", "recoverable"),
         (8_010_001, "gripper:weak_close", "recoverable"),
         (8_020_000, "gripper:weak_close", "unrecoverable"),
         (8_030_000, "sensor:wrist_force:spikes", None),
         (8_040_000, "gripper:slip", None)]
MIN_AGREEMENT = 0.99  # the trainer's held-out figure is in the card; this leaves headroom


def _session() -> Any:
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    return ort.InferenceSession(str(MODEL), sess_options=opts, providers=["CPUExecutionProvider"])


class _Recorder:
    """The expert, driving; keeps every (observation, action) it decides."""

    def __init__(self) -> None:
        self.expert = ExpertPolicy()
        self.seen: list[tuple[Observation, Action]] = []

    def decide(self, obs: Observation) -> Action | None:
        a = self.expert.decide(obs)
        if a is not None:
            self.seen.append((obs, a))
        return a


class _OnnxPolicy:
    def __init__(self, session: Any) -> None:
        self.session = session

    def decide(self, obs: Observation) -> Action | None:
        x = np.asarray([obs.vector], dtype=np.float32)
        return action_from_scores(self.session.run(None, {"obs": x})[0][0].tolist())


def test_the_card_matches_the_bytes_the_session_and_the_executor_layout(tmp_path: Path) -> None:
    card = ModelCard.load(card_path_for(MODEL))
    assert card.name == "pick-place-policy" and card.version == "1.0.0"
    assert sha256_file(MODEL) == card.sha256
    assert signature_problems(card, _session()) == []
    assert meaning_problems(card, FIELDS, LABELS) == []
    assert card.inputs[0].fields == tuple(FIELDS) and card.outputs[0].labels == tuple(LABELS)
    training, evaluation = card.extra["training"], card.extra["evaluation"]
    assert training["observations"] > 10_000 and training["episodes"] > 0
    assert {"model", "expert", "always_advance"} <= set(evaluation["success"][0])
    # and the daemon's cache accepts it as a seeded model (hash, session, layout, smoke run)
    cache = ModelCache(tmp_path / "models", fields=FIELDS, labels=LABELS)
    assert cache.seed(MODEL) is not None and cache.current() is not None


def test_the_model_agrees_with_the_expert_on_fresh_episodes() -> None:
    rec = _Recorder()
    for seed, fault, severity in FRESH:
        run_episode(ROBOT, seed, policy=rec, fault=fault, severity=severity)
    x = np.asarray([o.vector for o, _ in rec.seen], dtype=np.float32).reshape(-1, OBS_DIM)
    want = np.asarray([int(a) for _, a in rec.seen])
    got = np.asarray(_session().run(None, {"obs": x})[0]).argmax(axis=1)
    assert len(want) > 500
    agreement = float((got == want).mean())
    assert agreement >= MIN_AGREEMENT, f"agreement {agreement:.4f}"
    advance = want == int(Action.ADVANCE)  # every sub-goal the expert took, the model takes
    assert advance.sum() > 30 and (got[advance] == want[advance]).mean() >= 0.97


def test_the_card_says_the_model_matches_the_expert_and_beats_always_advance() -> None:
    rows = {r["fault"]: r for r in ModelCard.load(card_path_for(MODEL)).extra["evaluation"][
        "success"]}
    for name, row in rows.items():
        assert abs(row["model"] - row["expert"]) <= 1.0, (name, row)
    transient = rows["gripper:slip transient"]
    # the re-grasp is a decision only the policy makes: always-advance cannot take it
    assert transient["expert"] >= 90.0 and transient["always_advance"] == 0.0
    assert transient["model_regrasps"] >= transient["episodes"] * 0.9


@pytest.mark.parametrize(("seed", "fault", "severity"),
                         [(8_100_000, None, None),
                          (8_110_000, "gripper:weak_close", "recoverable"),
                          (8_120_000, "gripper:slip transient", None)])
def test_the_model_drives_a_task_to_success(seed: int, fault: str | None,
                                            severity: str | None) -> None:
    after, duration = None, None
    if fault == "gripper:slip transient":  # dropped while carrying: the model must re-grasp
        fault, (after, duration) = "gripper:slip", transient_slip(seed)
    r = run_episode(ROBOT, seed, policy=_OnnxPolicy(_session()), fault=fault, severity=severity,
                    fault_after_lift_s=after, fault_duration_s=duration)
    assert r.success, (r.outcome, r.failures)
    assert r.regrasps == (1 if after is not None else 0)

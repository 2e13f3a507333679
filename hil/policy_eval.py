"""Lock-step policy evaluation on the simulated robot: fault classes, seeded episodes, paired runs.

The shared core of models/train_policy.py (demonstrations, held-out evaluation),
models/finetune_policy.py (parent vs candidate) and the release gate (hil/gate.py): one episode
is `hil.episodes.run_episode` — the real Executor against the simulated edge-arm-4 — with a fault
class injected, on a seed that fixes the cube's pose and the rig's noise. Two policies run on the
same seeds are *paired*: the same episode, only the policy differs.

    jobs = [EpisodeJob(seed, fc.fault, fc.severity, "model", onnx_bytes, fc.transient), ...]
    records = run_jobs(jobs, n_procs=2)        # results in job order, whatever n_procs is
    ev = evaluate_pair(parent_bytes, candidate_bytes, per_class=4, faults=None, n_procs=2)

Deterministic: the same job gives the same record in any process (BLAS on one thread, one
onnxruntime thread per session).
"""

from __future__ import annotations

import hashlib
import multiprocessing
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from edge_agent.executor.policy import AlwaysAdvancePolicy, ExpertPolicy
from edge_agent.executor.tasks import ExecutorConfig
from edge_agent.policy_seam import Action, Observation, Policy, action_from_scores
from edge_agent.robot import RobotDescription, load_robot


@dataclass(frozen=True, slots=True)
class FaultClass:
    """One row of the success table: a rig fault injected before the task starts."""

    label: str
    fault: str | None = None
    severity: str | float | None = None
    train_severity: tuple[float, float] | None = None  # demonstrations: uniform in this range
    transient: bool = False  # injected while carrying, briefly: hil.episodes.transient_slip


FAULT_CLASSES: tuple[FaultClass, ...] = (
    FaultClass("none"),
    FaultClass("gripper:weak_close recoverable", "gripper:weak_close", "recoverable"),
    FaultClass("gripper:weak_close unrecoverable", "gripper:weak_close", "unrecoverable"),
    FaultClass("gripper:slip", "gripper:slip"),
    FaultClass("collision:impact", "collision:impact"),
    FaultClass("sensor:wrist_force:noise", "sensor:wrist_force:noise", None, (0.3, 2.0)),
    FaultClass("sensor:wrist_force:spikes", "sensor:wrist_force:spikes", None, (0.3, 2.0)),
    FaultClass("sensor:wrist_force:stuck", "sensor:wrist_force:stuck"),
    FaultClass("sensor:gripper_position:noise", "sensor:gripper_position:noise", None,
               (0.3, 2.0)),
    FaultClass("sensor:joint_encoders:noise", "sensor:joint_encoders:noise", None, (0.3, 2.0)),
    FaultClass("sensor:joint_currents:spikes", "sensor:joint_currents:spikes", None,
               (0.3, 2.0)),
    # The camera lost briefly while the part is carried (0.1-0.8 s, within the channel's
    # predict_max_s: the Kalman prediction covers it). A dropout for the whole episode is a
    # protective stop by the stop model (a predicted sensor past its bound), 0 % for any
    # policy: it tells policies nothing apart.
    FaultClass("sensor:object_pose:dropout transient", "sensor:object_pose:dropout",
               transient=True),
    # last, so the seeds of the classes above stay what they were
    FaultClass("gripper:slip transient", "gripper:slip", transient=True),
)
# Disjoint seed ranges: training (10 + seed) × 1e6 + …, evaluation 5e6 + …, the gate 6e6 + …,
# the gate's power measurement 7e6 + …, the test 8e6 + ….
EVAL_SEED_BASE = 5_000_000
CLASS_SEED_STRIDE = 10_000


def fault_class(label: str) -> tuple[int, FaultClass]:
    """(index, class) by label; KeyError naming the labels there are."""
    for ci, fc in enumerate(FAULT_CLASSES):
        if fc.label == label:
            return ci, fc
    raise KeyError(f"no fault class {label!r} (there are: "
                   f"{', '.join(f.label for f in FAULT_CLASSES)})")


def expert_for(config: ExecutorConfig | None = None) -> ExpertPolicy:
    """The expert exactly as the executor builds it by default (band from the config)."""
    return ExpertPolicy(band_n=(config or ExecutorConfig()).grip_force_band_n)


class RecordingPolicy:
    """Drives with `behaviour`, records (observation, `labeller`'s action) every decision."""

    def __init__(self, behaviour: Policy, labeller: Policy) -> None:
        self.behaviour = behaviour
        self.labeller = labeller
        self.vectors: list[tuple[float, ...]] = []
        self.labels: list[int] = []

    def decide(self, obs: Observation) -> Action | None:
        label = self.labeller.decide(obs)
        if label is not None:
            self.vectors.append(obs.vector)
            self.labels.append(int(label))
        return label if self.behaviour is self.labeller else self.behaviour.decide(obs)


class SabotagedPolicy:
    """The gate's power measurement: `inner`, except that every decision is `abort` (the
    episode fails: a known, seeded success drop made through the real harness)."""

    def __init__(self, inner: Policy) -> None:
        self.inner = inner

    def decide(self, obs: Observation) -> Action | None:
        self.inner.decide(obs)  # the same work (and the same session state) as unsabotaged
        return Action.ABORT


class OnnxPolicy:
    """A policy model behind the `Policy` protocol: one onnxruntime session, argmax of scores."""

    def __init__(self, model: bytes | Path, intra_op_threads: int = 1,
                 providers: Sequence[str] = ("CPUExecutionProvider",)) -> None:
        import onnxruntime as ort

        opts = ort.SessionOptions()
        opts.intra_op_num_threads = intra_op_threads
        opts.inter_op_num_threads = 1
        data = model.read_bytes() if isinstance(model, Path) else model
        self.session = ort.InferenceSession(data, opts, providers=list(providers))
        self.input_name = self.session.get_inputs()[0].name

    def scores(self, x: Any) -> Any:
        import numpy as np

        out = self.session.run(None, {self.input_name: np.asarray(x, dtype=np.float32)})[0]
        return np.asarray(out)

    def decide(self, obs: Observation) -> Action | None:
        row = self.scores([obs.vector])[0]
        return action_from_scores([float(s) for s in row])


@dataclass(frozen=True, slots=True)
class EpisodeJob:
    seed: int
    fault: str | None
    severity: str | float | None
    behaviour: str  # "expert" | "always_advance" | "model"
    model: bytes | None = None
    transient: bool = False
    sabotage: bool = False  # hil.gate_power: the policy aborts (see SabotagedPolicy)


@dataclass(slots=True)
class EpisodeRecord:
    seed: int
    success: bool
    outcome: str
    attempts: int
    duration_s: float
    regrasps: int
    drops: int
    vectors: list[tuple[float, ...]] = field(default_factory=list, repr=False)
    labels: list[int] = field(default_factory=list, repr=False)


_ROBOT: RobotDescription | None = None
_MODEL_CACHE: dict[str, OnnxPolicy] = {}


def _robot() -> RobotDescription:
    global _ROBOT
    if _ROBOT is None:
        from hil.episodes import DEFAULT_ROBOT
        _ROBOT = load_robot(DEFAULT_ROBOT)
    return _ROBOT


def _behaviour(job: EpisodeJob, expert: ExpertPolicy) -> Policy:
    if job.behaviour == "expert":
        return expert
    if job.behaviour == "always_advance":
        return AlwaysAdvancePolicy()
    assert job.model is not None
    key = hashlib.sha256(job.model).hexdigest()
    if key not in _MODEL_CACHE:  # one session per worker process and model
        _MODEL_CACHE[key] = OnnxPolicy(job.model)
    return _MODEL_CACHE[key]


def run_job(job: EpisodeJob) -> EpisodeRecord:
    """One lock-step episode, recorded (observations labelled by the expert)."""
    from hil.episodes import run_episode, transient_slip

    expert = expert_for()
    behaviour = _behaviour(job, expert)
    if job.sabotage:
        behaviour = SabotagedPolicy(behaviour)
    rec = RecordingPolicy(behaviour, expert)
    after, duration = transient_slip(job.seed) if job.transient else (None, None)
    r = run_episode(_robot(), job.seed, policy=rec, fault=job.fault, severity=job.severity,
                    fault_after_lift_s=after, fault_duration_s=duration)
    return EpisodeRecord(r.seed, r.success, r.outcome, r.attempts, r.duration_s, r.regrasps,
                         r.drops, rec.vectors, rec.labels)


def run_jobs(jobs: Sequence[EpisodeJob], n_procs: int) -> list[EpisodeRecord]:
    """Results in `jobs` order; with n_procs > 1, this process takes every n_procs-th job and
    n_procs - 1 forked workers the rest."""
    if n_procs <= 1 or len(jobs) < 2:
        return [run_job(j) for j in jobs]
    n = min(n_procs, len(jobs))
    theirs_idx = [i for i in range(len(jobs)) if i % n]
    with multiprocessing.get_context("fork").Pool(n - 1) as pool:
        theirs = pool.map_async(run_job, [jobs[i] for i in theirs_idx], chunksize=2)
        mine = {i: run_job(jobs[i]) for i in range(0, len(jobs), n)}
        mine.update(zip(theirs_idx, theirs.get(), strict=True))
    return [mine[i] for i in range(len(jobs))]


def class_jobs(ci: int, fc: FaultClass, model: bytes, per_class: int, seed_base: int,
               sabotaged: frozenset[int] = frozenset()) -> list[EpisodeJob]:
    """`per_class` episodes of one class: seeds seed_base + ci * CLASS_SEED_STRIDE + i."""
    return [EpisodeJob(seed_base + ci * CLASS_SEED_STRIDE + i, fc.fault, fc.severity, "model",
                       model, fc.transient, sabotage=i in sabotaged) for i in range(per_class)]


def evaluate_pair(parent: bytes, candidate: bytes, per_class: int, faults: Sequence[str] | None,
                  n_procs: int, log: Callable[[str], None] = print,
                  seed_base: int = EVAL_SEED_BASE) -> dict[str, Any]:
    """Held-out lock-step success per fault class: the same seeds for parent and candidate."""
    classes = [(ci, fc) for ci, fc in enumerate(FAULT_CLASSES)
               if faults is None or fc.label in faults]
    runs = {}
    for name, model in (("parent", parent), ("candidate", candidate)):
        t0 = time.perf_counter()
        jobs = [j for ci, fc in classes for j in class_jobs(ci, fc, model, per_class, seed_base)]
        runs[name] = run_jobs(jobs, n_procs)
        log(f"  evaluated {name}: {len(jobs)} episodes in {time.perf_counter() - t0:.0f} s")
    table = []
    for k, (_, fc) in enumerate(classes):
        row: dict[str, Any] = {"fault": fc.label, "episodes": per_class}
        for name in runs:
            part = runs[name][k * per_class:(k + 1) * per_class]
            row[name] = round(100.0 * sum(r.success for r in part) / per_class, 1)
            row[f"{name}_attempts"] = round(sum(r.attempts for r in part) / per_class, 2)
        table.append(row)
    return {"episodes_per_class": per_class, "seed_base": seed_base,
            "paired": "the same seeds, faults and severities for parent and candidate",
            "success": table}

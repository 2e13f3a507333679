"""Which journalled decisions form a dataset's episodes, and the columns each frame gets.

One finished task is one episode: its decisions (format 2: task id and step) paired with the
episode record its end left in the episode journal (store/episodes.py). Decisions the dataset
cannot use are left out and counted by reason (`LEFT_OUT`):

    no_task            made outside a task (format 1, or before episodes existed)
    running            the task has no episode record yet (still running, or the daemon died)
    incomplete         steps not 0..n-1, or fewer than the record's `decisions` (the journal's
                       oldest segment was deleted under its bound, or the queue dropped one), or
                       the part of a task before a restart (a resumed task starts again at step
                       0 and its record counts the decisions after the resume)
    obs_dim            an observation of another length than the dataset's
    no_decisions       (episode records) a record without any decision left in the journal

Everything here reads the journal without repairing or locking it (safe while the daemon
writes: a torn last record is skipped), and needs NumPy only: pyarrow is the writer's
(dataset/lerobot.py).
"""

from __future__ import annotations

import itertools
import math
from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from edge_agent.store.decisions import Decision, read_decisions
from edge_agent.store.episodes import read_episodes
from edge_agent.store.labels import VERDICTS, latest_labels

LEFT_OUT = ("no_task", "running", "incomplete", "obs_dim", "no_decisions")
OUTCOMES = ("success", "failed", "aborted")
NONE = "none"  # a categorical column's name for "not given"


@dataclass(frozen=True, slots=True)
class Episode:
    """One task: its episode record and its decisions, step 0 first."""

    record: Mapping[str, Any]
    decisions: tuple[Decision, ...]

    @property
    def task(self) -> str:
        return str(self.record.get("task") or "task")


@dataclass(slots=True)
class Gathered:
    """What the journal holds for a dataset (see the module doc)."""

    episodes: list[Episode]
    obs_names: tuple[str, ...]
    action_names: tuple[str, ...]
    labels: dict[tuple[str, int | None], dict[str, Any]]
    left_out: dict[str, int] = field(default_factory=lambda: dict.fromkeys(LEFT_OUT, 0))
    undecodable: int = 0  # records no decoder understood (a torn tail while the daemon writes)


def gather(directory: Path, obs_names: Sequence[str] | None = None,
           action_names: Sequence[str] = ()) -> Gathered:
    """Read the journal in `directory` into episodes. `obs_names`: the model card's input
    fields (None: `policy_seam.OBS_FIELDS`, or obs_<i> when the journal's length differs)."""
    from edge_agent.policy_seam import OBS_FIELDS, Action

    skipped = [0]
    decisions = list(read_decisions(directory, skipped=skipped))
    records = list(read_episodes(directory))
    out = Gathered([], (), (), latest_labels(directory), undecodable=skipped[0])
    runs: dict[str, list[list[Decision]]] = defaultdict(list)
    for d in decisions:
        if d.task_id is None:
            out.left_out["no_task"] += 1
        elif d.step == 0 or not runs[d.task_id]:
            runs[d.task_id].append([d])  # a task id seen again starts a new run at step 0
        else:
            runs[d.task_id][-1].append(d)
    recs: dict[str, list[Mapping[str, Any]]] = defaultdict(list)
    for r in records:
        recs[r["task_id"]].append(r)
    paired: list[Episode] = []
    unpaired_records = 0
    for tid, task_runs in runs.items():
        nxt = 0  # each record takes the first later run that fits it; runs skipped are cut
        for rec in recs.get(tid, []):
            k = next((k for k in range(nxt, len(task_runs)) if _fits(task_runs[k], rec)), None)
            if k is None:  # its decisions are there but broken (or gone: no_decisions)
                if nxt < len(task_runs):
                    out.left_out["incomplete"] += len(task_runs[nxt])
                    nxt += 1
                else:
                    unpaired_records += 1
                continue
            out.left_out["incomplete"] += sum(len(r) for r in task_runs[nxt:k])
            paired.append(Episode(rec, tuple(task_runs[k])))
            nxt = k + 1
        out.left_out["running"] += sum(len(r) for r in task_runs[nxt:])
    unpaired_records += sum(len(v) for k, v in recs.items() if k not in runs)
    out.left_out["no_decisions"] = unpaired_records
    dims = Counter(len(e.decisions[0].observation) for e in paired)
    if obs_names is None:
        default = tuple(f.name for f in OBS_FIELDS)
        dim = len(default) if not dims or len(default) in dims else dims.most_common(1)[0][0]
        obs_names = default if dim == len(default) else tuple(f"obs_{i}" for i in range(dim))
    out.obs_names = tuple(obs_names)
    for e in sorted(paired, key=lambda e: (e.decisions[0].wall, e.decisions[0].t)):
        if all(len(d.observation) == len(out.obs_names) for d in e.decisions):
            out.episodes.append(e)
        else:
            out.left_out["obs_dim"] += len(e.decisions)
    names = list(action_names) or [a.name.lower() for a in Action]
    for e in out.episodes:
        names += sorted({d.action for d in e.decisions if d.action and d.action not in names})
    out.action_names = tuple(names)
    return out


def _fits(run: list[Decision], rec: Mapping[str, Any]) -> bool:
    """The run is the whole episode the record closed: steps 0..n-1, as many as it counted."""
    want = rec.get("decisions")
    return [d.step for d in run] == list(range(len(run))) and (
        not isinstance(want, int) or want == len(run))


def _codes(values: Sequence[str | None], vocab: list[str]) -> list[int]:
    """Each value's index in `vocab` (None → NONE), growing it with unseen values."""
    out = []
    for v in values:
        key = v if v is not None else NONE
        if key not in vocab:
            vocab.append(key)
        out.append(vocab.index(key))
    return out


def frame_columns(g: Gathered, fps: int) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    """Every frame's columns (NumPy arrays, one row per decision, episodes in order) and their
    LeRobot features (dtype, shape, names; `categories` for a coded column)."""
    import numpy as np

    decisions = [d for e in g.episodes for d in e.decisions]
    n, dim, acts = len(decisions), len(g.obs_names), g.action_names
    lengths = [len(e.decisions) for e in g.episodes]
    ep_index = np.repeat(np.arange(len(lengths), dtype=np.int64), lengths)
    frame = np.concatenate([np.arange(k, dtype=np.int64) for k in lengths]) if n else \
        np.zeros(0, np.int64)
    last = np.zeros(n, dtype=bool)
    last[np.cumsum(lengths, dtype=np.int64) - 1] = True
    tasks = sorted({e.task for e in g.episodes})
    success = np.repeat([e.record.get("outcome") == "success" for e in g.episodes], lengths)
    obs = np.array([d.observation for d in decisions], dtype=np.float32).reshape(n, dim)
    act_index = np.array([acts.index(d.action) if d.action else -1 for d in decisions],
                         dtype=np.int64)
    one_hot = np.zeros((n, len(acts)), dtype=np.float32)
    one_hot[np.flatnonzero(act_index >= 0), act_index[act_index >= 0]] = 1.0
    starts = np.repeat([e.decisions[0].t for e in g.episodes], lengths)
    verdicts = list(VERDICTS)
    step_label = [g.labels.get((e.record["task_id"], d.step), {}).get("verdict")
                  for e in g.episodes for d in e.decisions]
    ep_label = np.repeat([g.labels.get((e.record["task_id"], None), {}).get("verdict")
                          for e in g.episodes], lengths)
    outcome_vocab, backend_vocab, state_vocab = [NONE], [NONE], [NONE]
    ep_outcomes = [*OUTCOMES, NONE]
    cols: dict[str, Any] = {
        "observation.state": obs,
        "action": one_hot,
        "action.index": act_index,
        "timestamp": (frame / fps).astype(np.float32),
        "frame_index": frame,
        "episode_index": ep_index,
        "index": np.arange(n, dtype=np.int64),
        "task_index": np.repeat([tasks.index(e.task) for e in g.episodes], lengths)
        .astype(np.int64),
        "next.done": last,
        "next.success": last & success,
        "next.reward": (last & success).astype(np.float32),
        "decision.t_s": np.array([d.t for d in decisions], dtype=np.float64) - starts,
        "decision.latency_ms": np.array([d.latency_ms for d in decisions], dtype=np.float32),
        "decision.accepted": np.array([-1 if d.accepted is None else int(d.accepted)
                                       for d in decisions], dtype=np.int64),
        "decision.outcome": np.array(_codes([d.outcome for d in decisions], outcome_vocab),
                                     dtype=np.int64),
        "decision.backend": np.array(_codes([d.backend for d in decisions], backend_vocab),
                                     dtype=np.int64),
        "decision.state": np.array(_codes([d.state for d in decisions], state_vocab),
                                   dtype=np.int64),
        "episode.outcome": np.repeat(_codes([e.record.get("outcome") for e in g.episodes],
                                            ep_outcomes), lengths).astype(np.int64),
        "label.step": np.array([verdicts.index(v) if v else -1 for v in step_label],
                               dtype=np.int64),
        "label.episode": np.array([verdicts.index(v) if v else -1 for v in ep_label],
                                  dtype=np.int64),
    }
    scalar = {"names": None, "shape": [1]}
    feats: dict[str, dict[str, Any]] = {
        "observation.state": {"dtype": "float32", "shape": [dim], "names": list(g.obs_names)},
        "action": {"dtype": "float32", "shape": [len(acts)], "names": list(acts),
                   "description": "the policy's decision, one-hot (all 0: no decision)"},
        "action.index": {"dtype": "int64", **scalar, "categories": list(acts),
                         "description": "index into categories; -1: no decision"},
        **{k: {"dtype": "int64", **scalar} for k in ("frame_index", "episode_index", "index",
                                                      "task_index")},
        "timestamp": {"dtype": "float32", **scalar,
                      "description": "frame_index / fps (the decision's real time: "
                                     "decision.t_s)"},
        "next.done": {"dtype": "bool", **scalar, "description": "the episode's last decision"},
        "next.success": {"dtype": "bool", **scalar,
                         "description": "the last decision of an episode whose outcome is "
                                        "success"},
        "next.reward": {"dtype": "float32", **scalar, "description": "1.0 where next.success"},
        "decision.t_s": {"dtype": "float64", **scalar,
                         "description": "seconds since the episode's first decision"},
        "decision.latency_ms": {"dtype": "float32", **scalar,
                                "description": "inference latency; NaN: not given"},
        "decision.accepted": {"dtype": "int64", **scalar, "categories": ["rejected", "accepted"],
                              "description": "did the executor accept it; -1: not given"},
        "decision.outcome": {"dtype": "int64", **scalar, "categories": outcome_vocab},
        "decision.backend": {"dtype": "int64", **scalar, "categories": backend_vocab},
        "decision.state": {"dtype": "int64", **scalar, "categories": state_vocab},
        "episode.outcome": {"dtype": "int64", **scalar, "categories": ep_outcomes},
        "label.step": {"dtype": "int64", **scalar, "categories": verdicts,
                       "description": "a person's label of this decision; -1: none"},
        "label.episode": {"dtype": "int64", **scalar, "categories": verdicts,
                          "description": "a person's label of the whole episode; -1: none"},
    }
    return cols, feats


def measured_fps(g: Gathered, default: int = 20) -> int:
    """The decision rate as the journal shows it: 1 / the lower decile of the intervals between
    a task's consecutive decisions. A decision is due a period after the tick that made the last
    one, on the next tick (control.rate_hz), and a loaded host only makes it later: the median
    interval of a 20 Hz daemon on a loaded VM was 55 ms; its lower decile is the period."""
    gaps = sorted(b.t - a.t for e in g.episodes for a, b in itertools.pairwise(e.decisions)
                  if b.t > a.t)
    if not gaps:
        return default
    low = gaps[len(gaps) // 10]
    return max(1, round(1.0 / low)) if math.isfinite(low) and low > 0 else default


def config_fps(path: Path) -> int:
    """control.decision_hz of a daemon config (TOML; only that key is read, its schema default
    when absent), rounded: LeRobot's fps is an integer."""
    import tomllib

    from edge_agent.config.schema import ControlSection

    with path.open("rb") as f:
        raw = tomllib.load(f)
    hz = (raw.get("control") or {}).get("decision_hz", ControlSection().decision_hz)
    if isinstance(hz, bool) or not isinstance(hz, int | float) or not hz > 0:
        raise ValueError(f"control.decision_hz = {hz!r}: expected a number > 0")
    return max(1, round(hz))

"""Fine-tunes the current policy model on exported robot datasets (DAgger on a person's labels).

    python models/finetune_policy.py --parent models/pick-place-policy.onnx --dataset DIR
        [--dataset DIR2 ...] --out /tmp/candidate.onnx [--seed 0] [--epochs 30]
        [--needs-work drop|expert] [--eval-episodes 4] [--eval-faults none,gripper:slip]

Issue 28 item 4, the seed's incremental training: start from the parent model's own weights and
input scaling (read from its ONNX initializers), train at 1/10 of the initial learning rate (the
from-scratch run's `lr` in the parent's card, or the `initial_lr` a fine-tuned parent carries),
on the frames of one or more LeRobot v3 exports (`edge-agent journal export`). A frame's target:

- labelled `wrong` (its step label, else its episode's): the reference expert's action for that
  exact observation (DAgger). `ExpertPolicy` reads only the vector and the executor state, and
  the state is in the vector's one-hot (and the `decision.state` column), so the relabel is exact;
- labelled `needs_work`: left out by default (the person says the decision was not right, but not
  what would be: neither reinforced nor replaced); `--needs-work expert` relabels it as `wrong`;
- `correct` or unlabelled: the action the robot took (the parent's own decision, so what nobody
  objected to is kept); a frame with no decision (inference failed) is left out unless `wrong`.

Class-weighted cross-entropy, Adam, cosine decay, as models/train_policy.py (whose pieces this
reuses). The candidate's card: the parent's inputs/outputs, version `<parent>+ft.<sha8>`, and a
`training` naming the parent's sha256, each dataset's hash, episode / frame / label counts and
the held-out lock-step evaluation (success per fault class, the same seeds for parent and
candidate). The candidate is unsigned. Deterministic: the same parent, datasets, seed and
counts give a byte-identical .onnx and card. Needs the `train` and `dataset` extras.
"""

from __future__ import annotations

import os

for _v in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_v, "1")  # one BLAS thread: reproducible sums

import argparse  # noqa: E402
import hashlib  # noqa: E402
import json  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable, Sequence  # noqa: E402
from dataclasses import dataclass  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import numpy as np  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))  # train_policy beside this file
if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import train_policy as tp  # noqa: E402

from edge_agent.executor.policy import ExpertPolicy  # noqa: E402
from edge_agent.policy_seam import OBS_DIM, OBS_INDEX, POLICY_STATES, Observation  # noqa: E402
from edge_agent.vocab import State  # noqa: E402
from hil.policy_eval import evaluate_pair, expert_for  # noqa: E402

VERDICTS = ("correct", "wrong", "needs_work")
DEFAULT_EPOCHS = 30


@dataclass(frozen=True, slots=True)
class Frames:
    """One dataset's frames as the fine-tune needs them."""

    sha256: str
    episodes: int
    obs: tp.Array  # float64 [n, OBS_DIM]
    action: tp.Array  # int64, -1: no decision
    state: list[str | None]  # the executor state the decision was made in
    verdict: list[str | None]  # the step label, else the episode's


def dataset_sha256(root: Path) -> str:
    """sha256 over every file's relative path and bytes, in path order (provenance excluded:
    meta/edge_agent.json holds the export's wall time)."""
    h = hashlib.sha256()
    for p in sorted(q for q in root.rglob("*") if q.is_file()):
        rel = p.relative_to(root).as_posix()
        if rel == "meta/edge_agent.json":
            continue
        h.update(rel.encode() + b"\0" + hashlib.sha256(p.read_bytes()).digest())
    return h.hexdigest()


def read_dataset(root: Path) -> Frames:
    """A LeRobot v3 export read with pyarrow through its info.json and episode table."""
    import pyarrow.parquet as pq

    info = json.loads((root / "meta/info.json").read_text())
    feats = info["features"]
    names = feats["observation.state"].get("names")
    if names != [f for f in OBS_INDEX]:
        raise SystemExit(f"{root}: observation.state names are not the policy's layout")
    eps = pq.read_table(root / "meta/episodes/chunk-000/file-000.parquet").to_pylist()
    files = sorted({(e["data/chunk_index"], e["data/file_index"]) for e in eps})
    cols = ["observation.state", "action.index", "decision.state", "label.step", "label.episode"]
    parts = [pq.read_table(root / info["data_path"].format(chunk_index=c, file_index=f),
                           columns=cols).to_pydict() for c, f in files]
    rows = {k: [v for part in parts for v in part[k]] for k in cols}

    def cat(col: str, i: int) -> str | None:
        values = feats[col]["categories"]
        return str(values[i]) if 0 <= i < len(values) and values[i] != "none" else None

    verdict = [cat("label.step", s) if s >= 0 else cat("label.episode", e)
               for s, e in zip(rows["label.step"], rows["label.episode"], strict=True)]
    return Frames(dataset_sha256(root), len(eps),
                  np.asarray(rows["observation.state"], dtype=np.float64).reshape(-1, OBS_DIM),
                  np.asarray(rows["action.index"], dtype=np.int64),
                  [cat("decision.state", s) for s in rows["decision.state"]], verdict)


def expert_action(expert: ExpertPolicy, vector: Sequence[float], state: str | None) -> int:
    """The expert's action for this observation; the state from the column, else the one-hot."""
    known = {s.value: s for s in State}
    st = known[state] if state in known else next(
        (s for s in POLICY_STATES if vector[OBS_INDEX[f"state_{s.value}"]] >= 0.5), State.IDLE)
    act = expert.decide(Observation(st, tuple(float(v) for v in vector)))
    assert act is not None  # the expert always decides
    return int(act)


def targets(frames: Sequence[Frames], needs_work: str) -> tuple[tp.Array, tp.Array,
                                                                  dict[str, int]]:
    """The training set: (observations, target actions) and what happened to each frame."""
    expert = expert_for()
    xs: list[tp.Array] = []
    ys: list[int] = []
    n = {"frames": 0, "kept_taken": 0, "relabelled_wrong": 0, "relabelled_changed": 0,
         "relabelled_needs_work": 0, "dropped_needs_work": 0, "dropped_no_decision": 0}
    for ds in frames:
        for i in range(len(ds.action)):
            n["frames"] += 1
            v, taken = ds.verdict[i], int(ds.action[i])
            if v == "wrong" or (v == "needs_work" and needs_work == "expert"):
                y = expert_action(expert, ds.obs[i], ds.state[i])
                n["relabelled_wrong" if v == "wrong" else "relabelled_needs_work"] += 1
                n["relabelled_changed"] += int(y != taken)
            elif v == "needs_work":
                n["dropped_needs_work"] += 1
                continue
            elif taken < 0:
                n["dropped_no_decision"] += 1
                continue
            else:
                y = taken
                n["kept_taken"] += 1
            xs.append(ds.obs[i])
            ys.append(y)
    x = np.asarray(xs, dtype=np.float64).reshape(-1, OBS_DIM)
    return x, np.asarray(ys, dtype=np.int64), n


def label_counts(frames: Sequence[Frames]) -> dict[str, int]:
    out = dict.fromkeys(VERDICTS, 0)
    for ds in frames:
        for v in ds.verdict:
            if v is not None:
                out[v] += 1
    return out


def load_parent(path: Path) -> tuple[tp.Mlp, dict[str, Any], bytes]:
    """The parent's Mlp (scaling and layers from its ONNX initializers), its card and bytes."""
    import onnx
    from onnx import numpy_helper

    data = path.read_bytes()
    init = {t.name: numpy_helper.to_array(t).astype(np.float64)
            for t in onnx.load_from_string(data).graph.initializer}
    layers = []
    i = 1
    while f"W{i}" in init:
        layers.append((init[f"W{i}"], init[f"b{i}"]))
        i += 1
    if not layers or "center" not in init:
        raise SystemExit(f"{path}: not a models/train_policy.py graph (no center / W1)")
    scaling = tp.Scaling(init["center"], init["inv_scale"], float(init["hi"]))
    card = json.loads(path.with_name(path.stem + ".card.json").read_text())
    return tp.Mlp(scaling, layers), card, data


def format_table(ev: dict[str, Any]) -> str:
    lines = [f"held-out success % ({ev['episodes_per_class']} lock-step episodes per row, "
             "the same seeds for both; mean attempts in brackets)",
             f"{'fault':34s} {'parent':>15s} {'candidate':>15s}"]
    for r in ev["success"]:
        cells = [f"{r[n]:5.1f} ({r[n + '_attempts']:4.2f})" for n in ("parent", "candidate")]
        lines.append(f"{r['fault']:34s} {cells[0]:>15s} {cells[1]:>15s}")
    return "\n".join(lines)


def finetune(parent_path: Path, datasets: Sequence[Path], *, seed: int = 0,
             epochs: int = DEFAULT_EPOCHS, needs_work: str = "drop", eval_episodes: int = 0,
             eval_faults: Sequence[str] | None = None, n_procs: int = 2,
             log: Callable[[str], None] = print) -> tuple[bytes, dict[str, Any]]:
    """The candidate's ONNX bytes and card."""
    parent, pcard, pbytes = load_parent(parent_path)
    frames = [read_dataset(d) for d in datasets]
    x, y, counts = targets(frames, needs_work)
    if not len(y):
        raise SystemExit("no frame to train on (every frame left out)")
    ptrain = pcard.get("training", {})
    initial_lr = float(ptrain.get("initial_lr", ptrain.get("lr", 3e-3)))
    hidden = parent.layers[0][0].shape[1]
    t0 = time.perf_counter()
    mlp, train = tp.train_mlp(x, y, seed=seed, hidden=hidden, epochs=epochs,
                              lr=initial_lr / 10, init=parent, log=log)
    model = tp.build_onnx(mlp)
    log(f"fine-tuned on {len(y)} frames in {time.perf_counter() - t0:.1f} s")
    sha = hashlib.sha256(model).hexdigest()
    psha = hashlib.sha256(pbytes).hexdigest()
    evaluation = None
    if eval_episodes > 0:
        evaluation = evaluate_pair(pbytes, model, eval_episodes, eval_faults, n_procs, log)
    pred = mlp.predict(x)
    training = {
        "kind": "fine-tune (DAgger on labels)", "expert": "ExpertPolicy(band_n=1.0)",
        "parent": {"name": pcard.get("name"), "version": pcard.get("version"),
                   "sha256": psha},
        "datasets": [{"name": d.name, "sha256": f.sha256, "episodes": f.episodes,
                      "frames": len(f.action)} for d, f in zip(datasets, frames, strict=True)],
        "episodes": sum(f.episodes for f in frames), "labels": label_counts(frames),
        "targets": counts, "observations": len(y),
        "action_counts": dict(zip(tp.LABELS, np.bincount(y, minlength=tp.N_ACTIONS).tolist(),
                                  strict=True)),
        "needs_work": ("left out" if needs_work == "drop" else "relabelled by the expert"),
        "seed": seed, "opset": tp.OPSET, "initial_lr": initial_lr,
        "train_agreement": round(float((pred == y).mean()), 5), **train,
        "evaluation": evaluation}
    card = {k: pcard[k] for k in ("name", "inputs", "outputs")}
    card.update({"version": f"{pcard['version'].split('+')[0]}+ft.{sha[:8]}", "sha256": sha,
                 "description": ("pick-and-place decision policy fine-tuned by "
                                 "models/finetune_policy.py from its parent "
                                 f"{psha[:12]} on {len(frames)} exported robot dataset(s); "
                                 "unsigned"),
                 "training": training})
    return model, card


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--parent", type=Path, default=tp.DEFAULT_OUT)
    ap.add_argument("--dataset", type=Path, action="append", required=True)
    ap.add_argument("--out", type=Path, required=True, help="the candidate .onnx (card beside)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--epochs", type=int, default=DEFAULT_EPOCHS)
    ap.add_argument("--needs-work", choices=("drop", "expert"), default="drop")
    ap.add_argument("--eval-episodes", type=int, default=4,
                    help="held-out episodes per fault class and model (0: no evaluation)")
    ap.add_argument("--eval-faults", help="comma-separated fault classes (default: all)")
    ap.add_argument("--jobs", type=int, choices=(1, 2), default=2)
    a = ap.parse_args(argv)
    t0 = time.perf_counter()
    faults = a.eval_faults.split(",") if a.eval_faults else None
    model, card = finetune(a.parent, a.dataset, seed=a.seed, epochs=a.epochs,
                           needs_work=a.needs_work, eval_episodes=a.eval_episodes,
                           eval_faults=faults, n_procs=a.jobs)
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_bytes(model)
    a.out.with_name(a.out.stem + ".card.json").write_text(json.dumps(card, indent=2) + "\n")
    tr = card["training"]
    print(f"targets: {tr['targets']}; labels: {tr['labels']}")
    if tr["evaluation"]:
        print(format_table(tr["evaluation"]))
    print(f"{a.out}: sha256 {card['sha256']} version {card['version']} (unsigned); "
          f"total {time.perf_counter() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

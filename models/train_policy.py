"""Trains the pick-and-place policy from the reference expert's demonstrations; writes ONNX + card.

    python models/train_policy.py [--out models/pick-place-policy.onnx] [--seed 0] [--jobs 2]
        [--train-episodes 12] [--eval-episodes 40] [--no-eval]

1. Demonstrations: lock-step episodes (`hil.episodes.run_episode`, the real Executor against the
   simulated edge-arm-4) on seeded cube poses, with no fault and with each fault class in
   `hil.policy_eval.FAULT_CLASSES` injected (before the task starts; a transient class while
   the part is carried, timed by `hil.episodes.transient_slip(seed)`). Every decision tick records
   (observation vector, the action `ExpertPolicy` chooses). Half the episodes are *driven* by
   `AlwaysAdvancePolicy` while still labelled by the expert, so the data also covers states the
   expert itself leaves early (a stalled grasp held until its L1 timeout, a re-grasp window
   held to its end) — the states a slightly wrong student reaches.
2. A 26→H→H→4 ReLU MLP in numpy (seeded He init, Adam, class-weighted cross-entropy: "continue"
   dominates) behind a fixed robust input scaling (`Scaling`); the ONNX graph takes the raw
   observation (the executor's interface, models/README.md): Sub, Mul, Clip, then three Gemm.
3. Evaluation on held-out seeds, identically for the model (a real onnxruntime session behind the
   `Policy` protocol), `ExpertPolicy` and `AlwaysAdvancePolicy`: task success per fault class
   (paired: the same seeds for all three), and the model-vs-expert confusion matrix on held-out
   observations (from the expert's own episodes and from the model's).

Deterministic: the same `--seed` (and counts) gives a byte-identical .onnx and card — episodes
are seeded, results are gathered in order whatever `--jobs` is, BLAS runs on one thread, and the
card carries no wall times. Needs the `train` extra (`onnx`).
"""

from __future__ import annotations

import os

for _v in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_v, "1")  # one BLAS thread: reproducible sums, and a shared machine

import argparse  # noqa: E402
import hashlib  # noqa: E402
import itertools  # noqa: E402
import json  # noqa: E402
import random  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable, Sequence  # noqa: E402
from dataclasses import dataclass  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import numpy as np  # noqa: E402
from numpy.typing import NDArray  # noqa: E402

if __name__ == "__main__":  # run as a script from a checkout: make edge_agent/hil importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from edge_agent.policy_seam import OBS_DIM, OBS_FIELDS, Action  # noqa: E402
from hil.policy_eval import (  # noqa: E402  (the shared core: fault classes, seeded episodes)
    CLASS_SEED_STRIDE,
    EVAL_SEED_BASE,
    FAULT_CLASSES,
    EpisodeJob,
    EpisodeRecord,
    OnnxPolicy,
    run_jobs,
)

OPSET = 17
NAME = "pick-place-policy"
VERSION = "1.0.0"
DEFAULT_OUT = Path(__file__).resolve().parent / f"{NAME}.onnx"
N_ACTIONS = len(Action)
LABELS = [a.name.lower() for a in Action]
Array = NDArray[Any]

POLICIES = ("model", "expert", "always_advance")


# ---------------------------------------------------------------------------- episodes
# Disjoint seed ranges: training (10 + seed) × 1e6 + …; the others in hil/policy_eval.py.

def train_seed_base(seed: int) -> int:
    return (10 + seed) * 1_000_000


def demonstration_jobs(seed: int, per_class: int,
                       skip: Sequence[str] = ()) -> list[EpisodeJob]:
    """Per fault class `per_class` episodes, alternately driven by the expert / always-advance.
    `skip`: class labels left out (a deliberately weaker policy; the other classes keep their
    seeds and severities)."""
    rng = random.Random(seed)
    jobs = []
    for ci, fc in enumerate(FAULT_CLASSES):
        for i in range(per_class):
            sev = fc.severity
            if fc.train_severity is not None:
                sev = round(rng.uniform(*fc.train_severity), 3)
            if fc.label in skip:
                continue
            jobs.append(EpisodeJob(train_seed_base(seed) + ci * CLASS_SEED_STRIDE + i, fc.fault,
                                   sev, "expert" if i % 2 == 0 else "always_advance",
                                   transient=fc.transient))
    return jobs


def eval_jobs(per_class: int, behaviour: str, model: bytes | None = None) -> list[EpisodeJob]:
    return [EpisodeJob(EVAL_SEED_BASE + ci * CLASS_SEED_STRIDE + i, fc.fault, fc.severity,
                       behaviour, model, fc.transient)
            for ci, fc in enumerate(FAULT_CLASSES) for i in range(per_class)]


def stack(records: Sequence[EpisodeRecord]) -> tuple[Array, Array]:
    xs = [v for r in records for v in r.vectors]
    ys = [y for r in records for y in r.labels]
    return (np.asarray(xs, dtype=np.float64).reshape(-1, OBS_DIM),
            np.asarray(ys, dtype=np.int64))


# ---------------------------------------------------------------------------- the MLP

Params = list[tuple[Array, Array]]


def _forward(params: Params, x: Array) -> tuple[Array, list[Array]]:
    acts = [x]
    h = x
    for i, (w, b) in enumerate(params):
        h = h @ w + b
        if i < len(params) - 1:
            h = np.maximum(h, 0.0)
        acts.append(h)
    return h, acts


def class_weights(y: Array) -> Array:
    """Inverse-frequency weights, square-rooted (rare actions count more, not overwhelmingly);
    a class absent from the data gets 0."""
    counts = np.bincount(y, minlength=N_ACTIONS).astype(np.float64)
    w = np.zeros(N_ACTIONS)
    present = counts > 0
    w[present] = np.sqrt(counts[present].sum() / (present.sum() * counts[present]))
    return np.asarray(w / w[present].mean())


@dataclass(frozen=True, slots=True)
class Scaling:
    """The model's fixed input transform: z = clip((obs - center) * inv_scale, -clip, clip).

    Robust (median / median absolute deviation), not mean / std: the expert's grip-stall rule
    looks at a finger speed below 1 mm/s in a feature whose std is set by 1 m/s transients, and
    at force rates of a few N/s beside ±400 N/s spikes. Clipping keeps those outliers from
    dominating the first layer.
    """

    center: Array
    inv_scale: Array
    clip: float = 10.0

    @classmethod
    def fit(cls, x: Array) -> Scaling:
        center = np.median(x, axis=0)
        mad = np.median(np.abs(x - center), axis=0)
        std = x.std(axis=0)
        scale = np.where(mad > 1e-9, mad, np.where(std > 1e-9, std, 1.0))  # one-hots: std
        return cls(center, 1.0 / scale)

    def __call__(self, x: Array) -> Array:
        return np.asarray(np.clip((x - self.center) * self.inv_scale, -self.clip, self.clip))


@dataclass(frozen=True, slots=True)
class Mlp:
    scaling: Scaling
    layers: Params

    def predict(self, x: Array) -> Array:
        return np.asarray(_forward(self.layers, self.scaling(x))[0].argmax(axis=1))


def train_mlp(x: Array, y: Array, *, seed: int, hidden: int = 32, epochs: int = 120,
              batch: int = 256, lr: float = 3e-3, init: Mlp | None = None,
              log: Callable[[str], None] = print) -> tuple[Mlp, dict[str, Any]]:
    """Scale, then train (Adam, cosine decay, class-weighted softmax cross-entropy); from `init`
    (its scaling kept, its weights the start: a fine-tune) or from a seeded He init."""
    rng = np.random.default_rng(seed)
    scaling = Scaling.fit(x) if init is None else init.scaling
    z = scaling(x)
    sizes = [OBS_DIM, hidden, hidden, N_ACTIONS]
    params: Params = [(rng.standard_normal((a, b)) * np.sqrt(2.0 / a), np.zeros(b))
                      for a, b in itertools.pairwise(sizes)] if init is None else \
        [(w.copy(), b.copy()) for w, b in init.layers]
    m1 = [[np.zeros_like(w), np.zeros_like(b)] for w, b in params]
    m2 = [[np.zeros_like(w), np.zeros_like(b)] for w, b in params]
    cw = class_weights(y)
    sample_w = cw[y]
    b1, b2, eps, step = 0.9, 0.999, 1e-8, 0
    n = len(y)
    loss = float("nan")
    for epoch in range(epochs):
        rate = lr * 0.5 * (1.0 + np.cos(np.pi * epoch / epochs))
        order = rng.permutation(n)
        total = 0.0
        for s in range(0, n, batch):
            idx = order[s:s + batch]
            rows = np.arange(len(idx))
            logits, acts = _forward(params, z[idx])
            p = np.exp(logits - logits.max(axis=1, keepdims=True))
            p /= p.sum(axis=1, keepdims=True)
            wi = sample_w[idx]
            total += float(-(wi * np.log(p[rows, y[idx]] + 1e-12)).sum())
            g = p
            g[rows, y[idx]] -= 1.0
            g *= (wi / wi.sum())[:, None]
            step += 1
            for li in range(len(params) - 1, -1, -1):
                w, b = params[li]
                grads = (acts[li].T @ g, g.sum(axis=0))
                if li > 0:
                    g = (g @ w.T) * (acts[li] > 0)
                new = []
                for k, (param, grad) in enumerate(zip((w, b), grads, strict=True)):
                    m1[li][k] = b1 * m1[li][k] + (1 - b1) * grad
                    m2[li][k] = b2 * m2[li][k] + (1 - b2) * grad * grad
                    mhat, vhat = m1[li][k] / (1 - b1 ** step), m2[li][k] / (1 - b2 ** step)
                    new.append(param - rate * mhat / (np.sqrt(vhat) + eps))
                params[li] = (new[0], new[1])
        loss = total / float(sample_w.sum())
        if epoch % 20 == 0 or epoch == epochs - 1:
            acc = float((_forward(params, z)[0].argmax(axis=1) == y).mean())
            log(f"  epoch {epoch:3d}  weighted loss {loss:.4f}  train accuracy {acc:.4f}")
    info = {"hidden": hidden, "epochs": epochs, "batch": batch, "lr": lr, "optimizer": "adam",
            "lr_schedule": "cosine", "loss": "class-weighted softmax cross-entropy",
            "class_weights": [round(float(v), 4) for v in cw],
            "input_scaling": "clip((obs - median) / MAD, -10, 10); std where MAD is 0",
            "final_weighted_loss": round(loss, 5)}
    return Mlp(scaling, params), info


def build_onnx(mlp: Mlp) -> bytes:
    """obs → Sub → Mul → Clip (the scaling) → Gemm → Relu → Gemm → Relu → Gemm → scores."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    def f32(a: Any, name: str) -> Any:
        return numpy_helper.from_array(np.asarray(a, dtype=np.float32), name)

    sc = mlp.scaling
    inits = [f32(sc.center, "center"), f32(sc.inv_scale, "inv_scale"), f32(-sc.clip, "lo"),
             f32(sc.clip, "hi")]
    nodes = [helper.make_node("Sub", ["obs", "center"], ["centered"]),
             helper.make_node("Mul", ["centered", "inv_scale"], ["scaled"]),
             helper.make_node("Clip", ["scaled", "lo", "hi"], ["a0"])]
    prev = "a0"
    for i, (w, b) in enumerate(mlp.layers, start=1):
        inits += [f32(w, f"W{i}"), f32(b, f"b{i}")]
        out = "scores" if i == len(mlp.layers) else f"h{i}"
        nodes.append(helper.make_node("Gemm", [prev, f"W{i}", f"b{i}"], [out]))
        if i < len(mlp.layers):
            nodes.append(helper.make_node("Relu", [out], [f"a{i}"]))
            prev = f"a{i}"
    graph = helper.make_graph(
        nodes, "policy",
        [helper.make_tensor_value_info("obs", TensorProto.FLOAT, ["batch", OBS_DIM])],
        [helper.make_tensor_value_info("scores", TensorProto.FLOAT, ["batch", N_ACTIONS])],
        inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)],
                              producer_name="edge-agent train_policy", producer_version="1")
    model.ir_version = 8  # readable by every onnxruntime >= 1.14
    onnx.checker.check_model(model)
    return bytes(model.SerializeToString())


# ---------------------------------------------------------------------------- evaluation

def confusion(expert: Array, model: Array) -> list[list[int]]:
    """rows: the expert's action, columns: the model's (Action order)."""
    m = np.zeros((N_ACTIONS, N_ACTIONS), dtype=np.int64)
    np.add.at(m, (expert, model), 1)
    return [[int(v) for v in row] for row in m]


def evaluate(model: bytes, per_class: int, n_procs: int,
             log: Callable[[str], None] = print) -> dict[str, Any]:
    """Success per fault class for the three policies (same seeds), and confusion matrices."""
    runs: dict[str, list[EpisodeRecord]] = {}
    for name in POLICIES:
        t0 = time.perf_counter()
        runs[name] = run_jobs(eval_jobs(per_class, name, model if name == "model" else None),
                              n_procs)
        log(f"  evaluated {name}: {len(runs[name])} episodes in "
            f"{time.perf_counter() - t0:.0f} s")
    table = []
    for ci, fc in enumerate(FAULT_CLASSES):
        row: dict[str, Any] = {"fault": fc.label, "episodes": per_class}
        for name in POLICIES:
            part = runs[name][ci * per_class:(ci + 1) * per_class]
            row[name] = round(100.0 * sum(r.success for r in part) / per_class, 1)
            row[f"{name}_attempts"] = round(sum(r.attempts for r in part) / per_class, 2)
            row[f"{name}_regrasps"] = sum(r.regrasps for r in part)
            row[f"{name}_drops"] = sum(r.drops for r in part)
            ok = [r.duration_s for r in part if r.success]
            row[f"{name}_success_s"] = round(sum(ok) / len(ok), 2) if ok else None
        table.append(row)
    scorer = OnnxPolicy(model)
    matrices = {}
    for name in ("expert", "model"):
        x, y = stack(runs[name])
        pred = scorer.scores(x).argmax(axis=1)
        m = confusion(y, pred)
        matrices[name] = {"observations": len(y), "agreement": round(float((pred == y).mean()),
                                                                      5), "matrix": m}
    return {"episodes_per_class": per_class, "seed_base": EVAL_SEED_BASE, "success": table,
            "confusion_expert_episodes": matrices["expert"],
            "confusion_model_episodes": matrices["model"]}


def format_report(ev: dict[str, Any]) -> str:
    lines = [f"success % ({ev['episodes_per_class']} held-out episodes per row, same seeds "
             "for all three; in brackets mean attempts, mean virtual s of a successful task)",
             f"{'fault':34s} {'model':>21s} {'expert':>21s} {'always_advance':>21s}"]
    for row in ev["success"]:
        cells = [f"{row[n]:5.1f} ({row[n + '_attempts']:4.2f}, "
                 + (f"{row[n + '_success_s']:5.2f})" if row[n + "_success_s"] else "    -)")
                 for n in POLICIES]
        lines.append(f"{row['fault']:34s} {cells[0]:>21s} {cells[1]:>21s} {cells[2]:>21s}")
    for key, what in (("confusion_expert_episodes", "the expert's held-out episodes"),
                      ("confusion_model_episodes", "the model's own held-out episodes")):
        c = ev[key]
        lines.append(f"confusion on {what} ({c['observations']} observations, agreement "
                     f"{100 * c['agreement']:.2f} %); rows expert, columns model:")
        lines.append(" " * 19 + "".join(f"{lb:>19s}" for lb in LABELS))
        lines += [f"{LABELS[i]:>19s}" + "".join(f"{v:19d}" for v in row)
                  for i, row in enumerate(c["matrix"])]
    return "\n".join(lines)


# ---------------------------------------------------------------------------- the card

def card_for(sha256: str, *, seed: int, data: dict[str, Any], train: dict[str, Any],
             evaluation: dict[str, Any] | None) -> dict[str, Any]:
    card: dict[str, Any] = {
        "name": NAME, "version": VERSION, "sha256": sha256,
        "inputs": [{"name": "obs", "dtype": "float32", "shape": [None, OBS_DIM],
                    "fields": [{"name": f.name, "unit": f.unit} for f in OBS_FIELDS]}],
        "outputs": [{"name": "scores", "dtype": "float32", "shape": [None, N_ACTIONS],
                     "labels": LABELS}],
        "description": ("pick-and-place decision policy: an MLP behaviour-cloned from "
                        "edge_agent.executor.policy.ExpertPolicy on lock-step episodes of the "
                        "simulated edge-arm-4 (hil/), with and without injected rig faults; "
                        "regenerate with models/train_policy.py"),
        "training": {"kind": "behaviour-cloning", "expert": "ExpertPolicy(band_n=1.0)",
                     "seed": seed, "opset": OPSET, "robot": "configs/robot/edge-arm-4.toml",
                     "architecture": f"{OBS_DIM}-{train['hidden']}-{train['hidden']}-"
                                     f"{N_ACTIONS} ReLU MLP after a fixed input scaling",
                     **data, **train},
    }
    if evaluation is not None:
        card["evaluation"] = evaluation
    return card


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--train-episodes", type=int, default=16,
                    help="demonstration episodes per fault class")
    ap.add_argument("--eval-episodes", type=int, default=30,
                    help="held-out episodes per fault class and policy")
    ap.add_argument("--no-eval", action="store_true")
    ap.add_argument("--skip-class", action="append", default=[], metavar="LABEL",
                    help="leave this fault class out of the demonstrations (repeatable): a "
                         "deliberately weaker parent, e.g. for hil.flywheel --parent")
    ap.add_argument("--hidden", type=int, default=32)
    ap.add_argument("--epochs", type=int, default=120)
    ap.add_argument("--jobs", type=int, choices=(1, 2), default=2,
                    help="processes (2 = this one and one forked worker); results do not change")
    a = ap.parse_args(argv)
    unknown = sorted(set(a.skip_class) - {fc.label for fc in FAULT_CLASSES})
    if unknown:
        ap.error(f"--skip-class: no fault class {unknown}; the classes: "
                 + ", ".join(fc.label for fc in FAULT_CLASSES))
    t0 = time.perf_counter()
    jobs = demonstration_jobs(a.seed, a.train_episodes, a.skip_class)
    records = run_jobs(jobs, a.jobs)
    x, y = stack(records)
    counts = np.bincount(y, minlength=N_ACTIONS)
    t1 = time.perf_counter()
    print(f"demonstrations: {len(records)} episodes, {len(y)} observations "
          f"{dict(zip(LABELS, counts.tolist(), strict=True))} in {t1 - t0:.0f} s")
    mlp, train = train_mlp(x, y, seed=a.seed, hidden=a.hidden, epochs=a.epochs)
    model = build_onnx(mlp)
    t2 = time.perf_counter()
    onnx_pred = OnnxPolicy(model).scores(x).argmax(axis=1)
    print(f"trained in {t2 - t1:.1f} s; ONNX (float32) vs numpy argmax differ on "
          f"{int((onnx_pred != mlp.predict(x)).sum())} of {len(y)} training observations")
    sha = hashlib.sha256(model).hexdigest()
    data = {"episodes": len(records), "episodes_per_fault_class": a.train_episodes,
            "seed_base": train_seed_base(a.seed),
            "fault_classes": [fc.label for fc in FAULT_CLASSES
                              if fc.label not in a.skip_class],
            **({"left_out_classes": a.skip_class} if a.skip_class else {}),
            "behaviour": "alternately ExpertPolicy / AlwaysAdvancePolicy, labels ExpertPolicy",
            "observations": len(y),
            "action_counts": dict(zip(LABELS, counts.tolist(), strict=True))}
    evaluation = None
    if not a.no_eval:
        evaluation = evaluate(model, a.eval_episodes, a.jobs)
        print(format_report(evaluation))
        print(f"evaluated in {time.perf_counter() - t2:.0f} s")
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_bytes(model)
    card = card_for(sha, seed=a.seed, data=data, train=train, evaluation=evaluation)
    a.out.with_name(a.out.stem + ".card.json").write_text(json.dumps(card, indent=2) + "\n")
    print(f"{a.out}: sha256 {sha} version {VERSION}; total {time.perf_counter() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

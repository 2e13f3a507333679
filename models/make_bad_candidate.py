"""A deliberately bad candidate for the gate's tests and docs: a fine-tune on inverted labels.

    python models/make_bad_candidate.py --out /tmp/bad.onnx [--parent models/pick-place-policy.onnx]
        [--episodes 1] [--seed 0] [--epochs 40]

What a wrong labelling run would produce: demonstration episodes as models/train_policy.py
records them (the expert's action for every observation, `--episodes` per fault class), each
label *inverted* (continue <-> advance, retry_alternative <-> abort), then the parent fine-tuned
on them with models/finetune_policy.py's pieces (its weights and scaling as the start, the
from-scratch learning rate: a few epochs are enough to undo it). The card says what it is. The
release gate (`edge-agent model gate`) must refuse it and name the fault classes it fails.
Deterministic for the same arguments. Needs the `train` extra (onnx).
"""

from __future__ import annotations

import os

for _v in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_v, "1")

import argparse  # noqa: E402
import hashlib  # noqa: E402
import json  # noqa: E402
import sys  # noqa: E402
from collections.abc import Sequence  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))  # train_policy, finetune_policy
if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import finetune_policy as ft  # noqa: E402
import train_policy as tp  # noqa: E402

from hil.policy_eval import run_jobs  # noqa: E402

INVERT = np.asarray([1, 0, 3, 2])  # continue<->advance, retry_alternative<->abort


def make_bad(parent_path: Path, *, episodes: int = 1, seed: int = 0, epochs: int = 40,
             n_procs: int = 1) -> tuple[bytes, dict[str, object]]:
    parent, pcard, pbytes = ft.load_parent(parent_path)
    x, y = tp.stack(run_jobs(tp.demonstration_jobs(seed, episodes), n_procs))
    lr = float(pcard.get("training", {}).get("lr", 3e-3))
    mlp, train = tp.train_mlp(x, INVERT[y], seed=seed, hidden=parent.layers[0][0].shape[1],
                              epochs=epochs, lr=lr, init=parent, log=lambda _s: None)
    model = tp.build_onnx(mlp)
    sha = hashlib.sha256(model).hexdigest()
    card: dict[str, object] = {k: pcard[k] for k in ("name", "inputs", "outputs")}
    card.update({
        "version": f"{str(pcard['version']).split('+')[0]}+bad.inverted.{sha[:8]}",
        "sha256": sha,
        "description": "DELIBERATELY BAD: the parent fine-tuned on inverted labels "
                       "(models/make_bad_candidate.py), a fixture the release gate must refuse",
        "training": {"kind": "fine-tune on inverted labels (test fixture)",
                     "parent": {"sha256": hashlib.sha256(pbytes).hexdigest(),
                                "version": pcard.get("version")},
                     "inverted": "continue<->advance, retry_alternative<->abort",
                     "observations": len(y), "episodes_per_fault_class": episodes,
                     "seed": seed, **train}})
    return model, card


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--parent", type=Path, default=tp.DEFAULT_OUT)
    ap.add_argument("--episodes", type=int, default=1, help="per fault class")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--epochs", type=int, default=40)
    ap.add_argument("--jobs", type=int, default=1)
    a = ap.parse_args(argv)
    model, card = make_bad(a.parent, episodes=a.episodes, seed=a.seed, epochs=a.epochs,
                           n_procs=a.jobs)
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_bytes(model)
    a.out.with_name(a.out.stem + ".card.json").write_text(json.dumps(card, indent=2) + "\n")
    print(f"{a.out}: sha256 {card['sha256']} version {card['version']} (deliberately bad)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

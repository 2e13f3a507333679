"""Writes a small deterministic MLP policy (ONNX) and its model card, for tests and benchmarks.

The model has the executor's interface: input `obs` float32 [batch, OBS_DIM] (the observation
vector, fields and units in edge_agent.policy_seam.OBS_FIELDS), output `scores` float32
[batch, 4] (one score per Action, in enum order). Its weights come from numpy's seeded
generator, so the same seed gives byte-identical files (and the same sha256). It is NOT a
trained policy: the trained one comes from the executor's expert demonstrations (`train` extra).

    python models/make_test_policy.py OUT.onnx [--seed N] [--hidden 64] [--nan] [--version V]

Needs the `onnx` package (`pip install -e '.[train]'` or `.[dev]`).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np

if __name__ == "__main__":  # run as a script from a checkout: make edge_agent importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from edge_agent.policy_seam import OBS_DIM, OBS_FIELDS, Action

OPSET = 17


def build_mlp(seed: int = 0, hidden: int = 64, nan: bool = False, obs_dim: int = OBS_DIM,
              n_actions: int = len(Action)) -> Any:
    """obs → Gemm → Relu → Gemm → Relu → Gemm → scores; `nan` poisons the last bias."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(seed)
    shapes = [(obs_dim, hidden), (hidden, hidden), (hidden, n_actions)]
    inits = []
    for i, (a, b) in enumerate(shapes, start=1):
        w = (rng.standard_normal((a, b)) / np.sqrt(a)).astype(np.float32)
        bias = (0.1 * rng.standard_normal(b)).astype(np.float32)
        if nan and i == len(shapes):
            bias[:] = np.nan
        inits += [numpy_helper.from_array(w, f"W{i}"), numpy_helper.from_array(bias, f"b{i}")]
    nodes = [
        helper.make_node("Gemm", ["obs", "W1", "b1"], ["h1"]),
        helper.make_node("Relu", ["h1"], ["a1"]),
        helper.make_node("Gemm", ["a1", "W2", "b2"], ["h2"]),
        helper.make_node("Relu", ["h2"], ["a2"]),
        helper.make_node("Gemm", ["a2", "W3", "b3"], ["scores"]),
    ]
    graph = helper.make_graph(
        nodes, "policy",
        [helper.make_tensor_value_info("obs", TensorProto.FLOAT, ["batch", obs_dim])],
        [helper.make_tensor_value_info("scores", TensorProto.FLOAT, ["batch", n_actions])],
        inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)],
                              producer_name="edge-agent make_test_policy", producer_version="1")
    model.ir_version = 8  # readable by every onnxruntime >= 1.14
    onnx.checker.check_model(model)
    return model


def card_for(sha256: str, *, name: str, version: str, seed: int, hidden: int,
             nan: bool) -> dict[str, Any]:
    return {
        "name": name, "version": version, "sha256": sha256,
        "inputs": [{"name": "obs", "dtype": "float32", "shape": [None, OBS_DIM],
                    "fields": [{"name": f.name, "unit": f.unit} for f in OBS_FIELDS]}],
        "outputs": [{"name": "scores", "dtype": "float32", "shape": [None, len(Action)],
                     "labels": [a.name.lower() for a in Action]}],
        "description": "untrained deterministic MLP for tests and benchmarks (not a policy)",
        "training": {"kind": "random-init", "seed": seed, "hidden": hidden, "nan": nan,
                     "opset": OPSET},
    }


def write_policy(path: Path, *, seed: int = 0, hidden: int = 64, nan: bool = False,
                 name: str = "test-policy", version: str | None = None) -> dict[str, Any]:
    """Write `path` and `<stem>.card.json` beside it; returns the card."""
    data = build_mlp(seed, hidden, nan).SerializeToString()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    card = card_for(hashlib.sha256(data).hexdigest(), name=name,
                    version=version or f"0.0.0+seed{seed}", seed=seed, hidden=hidden, nan=nan)
    path.with_name(path.stem + ".card.json").write_text(json.dumps(card, indent=2) + "\n")
    return card


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--nan", action="store_true", help="poison the output (tests)")
    ap.add_argument("--name", default="test-policy")
    ap.add_argument("--version")
    a = ap.parse_args(argv)
    card = write_policy(a.out, seed=a.seed, hidden=a.hidden, nan=a.nan, name=a.name,
                        version=a.version)
    print(f"{a.out}: sha256 {card['sha256']} version {card['version']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

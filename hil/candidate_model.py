"""A candidate model for trials and rollouts on the simulated robot: the trained policy with
another doc string (the same decisions, another sha256) and its card, unsigned (configs/sim.toml
sets no inference.trusted_keys; docs/MODELS.md). hil.soak and tests/test_fleet_daemons.py use it.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

TRAINED = Path(__file__).resolve().parents[1] / "models" / "pick-place-policy.onnx"


def candidate(directory: Path, name: str, version: str | None = None,
              source: Path = TRAINED) -> tuple[Path, str]:
    """`<directory>/<name>.onnx` and `<name>.card.json`; (the model's path, its sha256)."""
    import onnx

    model = onnx.load(str(source))
    model.doc_string = f"edge-agent candidate {name}"
    out = directory / f"{name}.onnx"
    out.write_bytes(model.SerializeToString())
    sha = hashlib.sha256(out.read_bytes()).hexdigest()
    card = json.loads(source.with_name(source.stem + ".card.json").read_text())
    card.update(sha256=sha, version=version or f"candidate-{name}")
    card.pop("signature", None)
    out.with_name(f"{name}.card.json").write_text(json.dumps(card))
    return out, sha

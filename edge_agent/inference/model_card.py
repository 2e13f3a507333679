"""Model cards: the JSON beside every policy model (name, version, sha256, inputs and outputs).

A card says what a model file must be: its sha256, and the name, dtype, shape and meaning of each
input (the observation fields with their units) and output (one label per action). The cache
refuses a model whose bytes, loaded session or meaning disagree with its card, and a card whose
meaning disagrees with the executor's observation layout.

    {"name": "pick-place-policy", "version": "1.2.0", "sha256": "<64 hex>",
     "inputs":  [{"name": "obs", "dtype": "float32", "shape": [null, 25],
                  "fields": [{"name": "state_approach", "unit": "1"}, ...]}],
     "outputs": [{"name": "scores", "dtype": "float32", "shape": [null, 4],
                  "labels": ["continue", "advance", "retry_alternative", "abort"]}],
     "description": "...", "training": {...}}

`null` in a shape is a dynamic dimension (the batch).
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from edge_agent.errors import EdgeAgentError
from edge_agent.store.atomic import read_capped

CARD_MAX_BYTES = 1 << 20  # a card is ~1 KB (names, shapes, units); a longer file is refused unread
_SHA_RE = re.compile(r"[0-9a-f]{64}")
_ORT_DTYPES = {"tensor(float)": "float32", "tensor(double)": "float64",
               "tensor(float16)": "float16", "tensor(int64)": "int64", "tensor(int32)": "int32"}


class ModelError(EdgeAgentError):
    """A model or its card is unusable (bad card, hash mismatch, load or signature failure)."""


@dataclass(frozen=True, slots=True)
class TensorSpec:
    name: str
    dtype: str
    shape: tuple[int | None, ...]
    fields: tuple[tuple[str, str], ...] = ()  # inputs: (field name, unit) per element
    labels: tuple[str, ...] = ()  # outputs: one label per element

    @classmethod
    def parse(cls, d: Any, where: str) -> TensorSpec:
        if not isinstance(d, Mapping):
            raise ModelError(f"{where}: expected an object, got {type(d).__name__}")
        name, dtype, shape = d.get("name"), d.get("dtype", "float32"), d.get("shape")
        if not isinstance(name, str) or not name:
            raise ModelError(f"{where}.name: expected a non-empty string")
        if not isinstance(dtype, str):
            raise ModelError(f"{where}.dtype: expected a string")
        if not isinstance(shape, list) or not all(
                s is None or (isinstance(s, int) and not isinstance(s, bool) and s > 0)
                for s in shape):
            raise ModelError(f"{where}.shape: expected a list of positive ints or null")
        fields = tuple((str(f["name"]), str(f.get("unit", "")))
                       for f in d.get("fields", ()) if isinstance(f, Mapping) and "name" in f)
        labels = tuple(str(x) for x in d.get("labels", ()))
        return cls(name, dtype, tuple(shape), fields, labels)

    def as_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name, "dtype": self.dtype, "shape": list(self.shape)}
        if self.fields:
            out["fields"] = [{"name": n, "unit": u} for n, u in self.fields]
        if self.labels:
            out["labels"] = list(self.labels)
        return out


@dataclass(frozen=True, slots=True)
class ModelCard:
    name: str
    version: str
    sha256: str
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    extra: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def parse(cls, data: Any) -> ModelCard:
        if not isinstance(data, Mapping):
            raise ModelError("model card: expected a JSON object")
        for key in ("name", "version", "sha256"):
            if not isinstance(data.get(key), str) or not data[key]:
                raise ModelError(f"model card: {key} must be a non-empty string")
        sha = data["sha256"].lower()
        if not _SHA_RE.fullmatch(sha):
            raise ModelError("model card: sha256 must be 64 hex digits")
        ins, outs = data.get("inputs"), data.get("outputs")
        if not isinstance(ins, list) or not ins or not isinstance(outs, list) or not outs:
            raise ModelError("model card: inputs and outputs must be non-empty lists")
        extra = {k: v for k, v in data.items()
                 if k not in ("name", "version", "sha256", "inputs", "outputs")}
        return cls(data["name"], data["version"], sha,
                   tuple(TensorSpec.parse(d, f"inputs[{i}]") for i, d in enumerate(ins)),
                   tuple(TensorSpec.parse(d, f"outputs[{i}]") for i, d in enumerate(outs)),
                   extra)

    @classmethod
    def load(cls, path: Path) -> ModelCard:
        try:
            return cls.parse(json.loads(read_capped(path, CARD_MAX_BYTES)))
        except (OSError, ValueError) as e:
            raise ModelError(f"model card {path}: {e}") from e

    def as_json(self) -> dict[str, Any]:
        return {"name": self.name, "version": self.version, "sha256": self.sha256,
                "inputs": [t.as_json() for t in self.inputs],
                "outputs": [t.as_json() for t in self.outputs], **self.extra}

    def dumps(self) -> str:
        return json.dumps(self.as_json(), indent=2, sort_keys=False) + "\n"

    def with_identity(self, sha256: str, version: str | None = None) -> ModelCard:
        return replace(self, sha256=sha256.lower(), version=version or self.version)


def card_path_for(model_path: Path) -> Path:
    """`policy.onnx` → `policy.card.json` (the card lives beside its model)."""
    return model_path.with_name(model_path.stem + ".card.json")


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def session_signature(session: Any) -> tuple[tuple[TensorSpec, ...], tuple[TensorSpec, ...]]:
    """The inputs and outputs an onnxruntime session really has."""
    def spec(arg: Any) -> TensorSpec:
        shape = tuple(d if isinstance(d, int) and d > 0 else None for d in arg.shape)
        return TensorSpec(arg.name, _ORT_DTYPES.get(arg.type, arg.type), shape)
    return (tuple(spec(a) for a in session.get_inputs()),
            tuple(spec(a) for a in session.get_outputs()))


def signature_problems(card: ModelCard, session: Any) -> list[str]:
    """Where a loaded session disagrees with its card (empty when they agree)."""
    ins, outs = session_signature(session)
    problems: list[str] = []
    for kind, have, want in (("input", ins, card.inputs), ("output", outs, card.outputs)):
        if len(have) != len(want):
            problems.append(f"{len(have)} {kind}s in the model, {len(want)} in the card")
            continue
        for h, w in zip(have, want, strict=True):
            if (h.name, h.dtype, h.shape) != (w.name, w.dtype, w.shape):
                problems.append(f"{kind} {h.name} {h.dtype} {list(h.shape)} in the model, "
                                f"{w.name} {w.dtype} {list(w.shape)} in the card")
    return problems


def meaning_problems(card: ModelCard, fields: Sequence[tuple[str, str]],
                     labels: Sequence[str]) -> list[str]:
    """Where the card disagrees with the executor's observation layout and action labels."""
    problems: list[str] = []
    x, y = card.inputs[0], card.outputs[0]
    if not x.shape or x.shape[-1] != len(fields):
        problems.append(f"input {x.name} shape {list(x.shape)}: last dimension must be "
                        f"{len(fields)} (the observation vector)")
    elif x.fields and tuple(x.fields) != tuple(fields):
        diff = next((f"{a} vs {b}" for a, b in zip(x.fields, fields, strict=False) if a != b),
                    f"{len(x.fields)} fields vs {len(fields)}")
        problems.append(f"input {x.name}: observation fields differ from the executor's ({diff})")
    if not y.shape or y.shape[-1] != len(labels):
        problems.append(f"output {y.name} shape {list(y.shape)}: last dimension must be "
                        f"{len(labels)} (one score per action)")
    elif y.labels and tuple(y.labels) != tuple(labels):
        problems.append(f"output {y.name}: labels {list(y.labels)} differ from {list(labels)}")
    return problems

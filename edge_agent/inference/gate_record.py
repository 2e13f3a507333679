"""The gate's evaluation record in a model card: bound at signing, required by `require_gate`.

`edge-agent model gate` (hil/gate.py) writes a record; `edge-agent model sign MODEL --gate
RECORD.json` puts it into the card as its `gate` field, so the signature (model_signing.py:
the whole card but the signature, canonical JSON) covers it — a record edited after signing,
or moved to another model's card, fails verification. The record names the model it judged
(`candidate.sha256`); binding refuses a record for another model.

With `inference.require_gate = true` (which needs `inference.trusted_keys`), `model.update`
refuses a model whose card has no `gate`, a gate for another sha256, or a verdict other than
`pass`, before anything else is done with it. The configured model (`inference.model`) is not
held to it at start-up: the operator put it there with the config (`edge-agent check-config`
warns when it has no passing record). Pure: JSON in, reasons out; no heavy import.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from edge_agent.inference.model_card import ModelCard, ModelError
from edge_agent.store.atomic import read_capped

RECORD_KIND = "edge-agent gate record"
RECORD_MAX_BYTES = 256 << 10  # a record is ~5-20 KB; a card is capped at 1 MiB
# episodes: 80 pairs per class catch a true 10-point success drop ~90 % of the time at alpha
# 0.05 (measured: hil/gate_power.py, docs/MODELS.md); 20 catch it 5 % of the time.
GATE_DEFAULTS: dict[str, Any] = {"episodes": 80, "alpha": 0.05, "margin_points": 5.0,
                                 "seed_base": 6_000_000, "latency_observations": 2000}
HOW = ("run `edge-agent model gate CANDIDATE.onnx --current CURRENT.onnx --out record.json`, "
       "then `edge-agent model sign CANDIDATE.onnx --key KEY --gate record.json`")


def load_record(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(read_capped(path, RECORD_MAX_BYTES))
    except (OSError, ValueError) as exc:
        raise ModelError(f"gate record {path}: {exc}") from None
    if not isinstance(data, dict) or data.get("kind") != RECORD_KIND:
        raise ModelError(f"gate record {path}: not an `edge-agent model gate` record "
                         f"(kind {data.get('kind') if isinstance(data, dict) else None!r})")
    return data


def _candidate_sha(record: Mapping[str, Any]) -> str | None:
    cand = record.get("candidate")
    sha = cand.get("sha256") if isinstance(cand, Mapping) else None
    return sha.lower() if isinstance(sha, str) else None


def bind_record(card: ModelCard, path: Path) -> tuple[ModelCard, str]:
    """The card with the record as its `gate` field (to be signed), and a note for the user.
    Raises ModelError when the record judged another model."""
    record = load_record(path)
    sha = _candidate_sha(record)
    if sha != card.sha256:
        raise ModelError(f"gate record {path} is for sha256 {str(sha)[:12]}..., not this model "
                         f"({card.sha256[:12]}...): run the gate on this model")
    extra = {**card.extra, "gate": record}
    verdict = record.get("verdict")
    note = f"gate record bound: verdict {verdict}"
    if verdict != "pass":
        note += " (a robot with inference.require_gate refuses this model)"
    return replace(card, extra=extra), note


def gate_problem(card: ModelCard | None) -> str | None:
    """Why this card does not carry a passing gate record for its model (None: it does)."""
    if card is None:
        return f"the model has no card, so no gate record ({HOW})"
    gate = card.extra.get("gate")
    if not isinstance(gate, Mapping):
        return f"its card has no gate record ({HOW})"
    if gate.get("kind") != RECORD_KIND:
        return "its card's `gate` field is not an `edge-agent model gate` record"
    sha = _candidate_sha(gate)
    if sha != card.sha256:
        return (f"its gate record judged another model (sha256 {str(sha)[:12]}...), not this "
                f"one: run the gate on this model")
    if gate.get("verdict") != "pass":
        reasons = gate.get("reasons")
        why = "; ".join(str(r) for r in reasons[:3]) if isinstance(reasons, list) else "?"
        return f"its gate record's verdict is {gate.get('verdict')!r}, not 'pass' ({why})"
    return None


def require_passing_gate(card: ModelCard | None) -> None:
    """`inference.require_gate`: ModelError naming what is missing and what to run."""
    why = gate_problem(card)
    if why is not None:
        raise ModelError(f"inference.require_gate is set and {why}")


def describe(card: ModelCard | None) -> str:
    """One line for `model verify`."""
    gate = card.extra.get("gate") if card is not None else None
    if not isinstance(gate, Mapping):
        return "no gate record in the card"
    why = gate_problem(card)
    raw_classes, raw_cur = gate.get("classes"), gate.get("current")
    classes: list[Any] = raw_classes if isinstance(raw_classes, list) else []
    failed = [str(c.get("fault")) for c in classes
              if isinstance(c, Mapping) and c.get("verdict") == "fail"]
    cur: Mapping[str, Any] = raw_cur if isinstance(raw_cur, Mapping) else {}
    line = (f"{gate.get('verdict')} ({len(classes)} fault classes x "
            f"{gate.get('episodes_per_class')} paired episodes vs current "
            f"{str(cur.get('sha256', '?'))[:12]}, {gate.get('started', '?')})")
    if failed:
        line += f"; failed classes: {', '.join(failed)}"
    return line + ("" if why is None else f"; not accepted by require_gate: {why}")

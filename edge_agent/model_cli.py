"""`edge-agent model keygen | gate | sign | verify | status | shadow`: signed policy models.

    edge-agent model keygen --out release.key        private key (0600); prints the public key
    edge-agent model gate CANDIDATE.onnx (--current PATH | --config CFG) [--out RECORD.json]
    edge-agent model sign MODEL.onnx --key release.key [--version V] [--gate RECORD.json]
    edge-agent model verify MODEL.onnx (--config CFG | --public-key ed25519:...)
    edge-agent model status [--config CFG] [--json]   the running daemon's models (trial too)
    edge-agent model shadow MODEL.onnx --sha256 HEX | --stop   (model_shadow_cli.py)

`gate` (hil/gate.py) runs candidate and current lock-step on the simulated robot and writes an
evaluation record; `sign --gate` binds it into the card (the `gate` field, under the signature;
edge_agent/inference/gate_record.py), which `inference.require_gate` asks for.

`sign` writes (or rewrites) MODEL.card.json beside the model with the model's sha256 and an
Ed25519 signature (edge_agent/inference/model_signing.py); a model without a card gets one
derived from what onnxruntime says it has. `verify` checks what the robot will check: the
sha256 and the signature against the config's `inference.trusted_keys` (or the given keys).
Exit codes: 0 ok, 1 refused (bad signature, bad model), 2 usage.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any


def add_parser(sub: Any) -> None:
    p = sub.add_parser("model", help="sign and verify policy models (release side)",
                       description="Key generation, signing and verification of policy models: "
                                   "a robot with inference.trusted_keys installs only models "
                                   "whose card one of those keys signed.")
    msub = p.add_subparsers(dest="model_command", metavar="ACTION", required=True)
    kg = msub.add_parser("keygen", help="make an Ed25519 signing key; print its public key")
    kg.add_argument("--out", required=True, metavar="PATH",
                    help="where to write the private key (PEM, mode 0600; must not exist)")
    sg = msub.add_parser("sign", help="write MODEL.card.json with the sha256 and a signature")
    sg.add_argument("model", metavar="MODEL", help="the .onnx file")
    sg.add_argument("--key", required=True, metavar="PATH", help="the private key (PEM)")
    sg.add_argument("--version", help="set the card's version before signing")
    sg.add_argument("--name", help="the card's name when a card is derived (default: policy)")
    sg.add_argument("--gate", metavar="RECORD.json",
                    help="bind this `model gate` record into the card (its candidate sha256 "
                         "must be the model's)")
    _add_gate_parser(msub)
    vf = msub.add_parser("verify", help="check a model's sha256 and signature")
    vf.add_argument("model", metavar="MODEL", help="the .onnx file (its card beside it)")
    vf.add_argument("--config", metavar="PATH", help="use this config's inference.trusted_keys")
    vf.add_argument("--public-key", action="append", default=[], metavar="ed25519:...",
                    help="a trusted public key (repeatable)")
    from edge_agent.model_status_cli import add_status_parser

    add_status_parser(msub)  # `model status` (model_status_cli.py): the running daemon's models
    from edge_agent.model_shadow_cli import add_parser as add_shadow

    add_shadow(msub)  # `model shadow` (edge_agent/model_shadow_cli.py): on the running daemon


def run(a: argparse.Namespace) -> int:
    from edge_agent.inference.model_card import ModelError
    from edge_agent.model_status_cli import run_status

    if a.model_command == "shadow":
        from edge_agent.model_shadow_cli import run as run_shadow

        return run_shadow(a)
    try:
        return {"keygen": _keygen, "sign": _sign, "verify": _verify,
                "gate": _gate, "status": run_status}[a.model_command](a)
    except ModelError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:
        print(f"error: {exc.filename or ''}: {exc.strerror}", file=sys.stderr)
        return 1


def _add_gate_parser(msub: Any) -> None:
    from edge_agent.inference.gate_record import GATE_DEFAULTS as d

    gt = msub.add_parser("gate", help="evaluate a candidate against the current model (paired "
                                      "episodes on the simulated robot, latency, journal replay)",
                         description="The release gate (hil/gate.py, docs/MODELS.md): exit 0 "
                                     "pass, 1 fail or refused, 2 usage.")
    gt.add_argument("candidate", metavar="CANDIDATE", help="the candidate .onnx")
    gt.add_argument("--current", metavar="PATH", help="the model to compare with")
    gt.add_argument("--config", metavar="CFG",
                    help="a robot's config: its current model (model cache, else "
                         "inference.model) and deadline; the gate runs at idle priority and "
                         "not while that daemon runs a task")
    gt.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="override a key of --config (as `edge-agent run --set`)")
    gt.add_argument("--episodes", type=int, default=d["episodes"],
                    help="paired episodes per fault class (default %(default)s)")
    gt.add_argument("--faults", metavar="LABEL,...", help="only these fault classes")
    gt.add_argument("--journal", action="append", default=[], metavar="STATE_DIR",
                    help="replay this state dir's decision journal (repeatable)")
    gt.add_argument("--jobs", type=int, default=1, help="processes (default 1)")
    gt.add_argument("--out", metavar="RECORD.json", help="write the evaluation record here")
    gt.add_argument("--alpha", type=float, default=d["alpha"],
                    help="significance level per class (default %(default)s)")
    gt.add_argument("--margin", type=float, default=d["margin_points"],
                    help="success drop in points a failing class must reach "
                         "(default %(default)s)")
    gt.add_argument("--seed-base", type=int, default=d["seed_base"], help=argparse.SUPPRESS)
    gt.add_argument("--latency-observations", type=int, default=d["latency_observations"],
                    help="decisions timed per model (default %(default)s; 0: none)")
    gt.add_argument("--priority", choices=("auto", "idle", "normal"), default="auto",
                    help="idle: nice 19 + SCHED_IDLE (auto: idle with --config)")


def _gate(a: argparse.Namespace) -> int:
    try:
        from hil.gate import main
    except ImportError as exc:  # hil ships in the wheel; its numpy/onnxruntime too
        print(f"error: the gate needs the hil package: {exc}", file=sys.stderr)
        return 2
    return main(a)


def configured_model_problem(inference: Any) -> str | None:
    """For check-config: why the configured model would be refused at start-up by its
    signature (None: fine, or no keys / no model configured)."""
    from edge_agent.inference.model_card import ModelCard, ModelError, card_path_for, sha256_file
    from edge_agent.inference.model_signing import verify_card

    model = inference.model
    if not inference.trusted_keys or model is None:
        return None
    try:
        card_path = card_path_for(model)
        card = ModelCard.load(card_path) if card_path.exists() else None
        if card is not None and card.sha256 != sha256_file(model):
            return "its card's sha256 is not the model's (the model changed after signing)"
        verify_card(card, inference.trusted_keys)
    except (ModelError, OSError) as exc:
        return str(exc)
    return None


def configured_gate_warning(inference: Any) -> str | None:
    """For check-config: with inference.require_gate, the configured model's card lacks a
    passing gate record (a warning: the configured model is not held to it at start-up)."""
    from edge_agent.inference.gate_record import gate_problem
    from edge_agent.inference.model_card import ModelCard, ModelError, card_path_for

    if not inference.require_gate or inference.model is None:
        return None
    try:
        card_path = card_path_for(inference.model)
        why = gate_problem(ModelCard.load(card_path) if card_path.exists() else None)
    except (ModelError, OSError) as exc:
        why = str(exc)
    if why is None:
        return None
    return (f"inference.model: {why}; it is loaded at start-up all the same "
            "(require_gate holds model.update only)")


def _keygen(a: argparse.Namespace) -> int:
    from edge_agent.inference.model_signing import generate_key

    pem, public = generate_key()
    fd = os.open(a.out, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(pem)
    print(public)
    print(f"# private key written to {a.out} (keep it off the robots); put the line above "
          "into inference.trusted_keys", file=sys.stderr)
    return 0


def _sign(a: argparse.Namespace) -> int:
    from edge_agent.inference.model_card import ModelCard, card_path_for, sha256_file
    from edge_agent.inference.model_signing import sign_card

    model = Path(a.model)
    sha = sha256_file(model)
    card_path = card_path_for(model)
    if card_path.exists():
        card = ModelCard.load(card_path).with_identity(sha, a.version)
    else:
        card = _derive(model, sha, a.version or "unversioned", a.name or "policy")
    if a.gate:
        from edge_agent.inference.gate_record import bind_record

        card, note = bind_record(card, Path(a.gate))
        print(note, file=sys.stderr)
    signed = sign_card(card, Path(a.key).read_bytes())
    tmp = card_path.with_name(f".{card_path.name}.tmp")
    tmp.write_text(signed.dumps(), encoding="utf-8")
    os.replace(tmp, card_path)
    sig = signed.extra["signature"]
    print(f"signed {model.name}: sha256 {sha}, version {signed.version}, key id "
          f"{sig['key_id']} -> {card_path}")
    return 0


def _derive(model: Path, sha: str, version: str, name: str) -> Any:
    import onnxruntime as ort

    from edge_agent.inference.model_cache import derive_card

    session = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    return derive_card(session, sha, version, name)


def _verify(a: argparse.Namespace) -> int:
    from edge_agent.inference.model_card import ModelCard, ModelError, card_path_for, sha256_file
    from edge_agent.inference.model_signing import parse_public_key, verify_card

    keys = list(a.public_key)
    if a.config:
        from edge_agent.config import load_config
        from edge_agent.errors import ConfigError

        try:
            keys += list(load_config(a.config, sim=True).inference.trusted_keys)
        except ConfigError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1
    for k in keys:
        try:
            parse_public_key(k)
        except ValueError as exc:
            print(f"error: public key {k[:20]!r}...: {exc}", file=sys.stderr)
            return 2
    if not keys:
        print("error: no trusted key: give --config (with inference.trusted_keys) or "
              "--public-key", file=sys.stderr)
        return 2
    model = Path(a.model)
    card_path = card_path_for(model)
    card = ModelCard.load(card_path) if card_path.exists() else None
    sha = sha256_file(model)
    if card is not None and card.sha256 != sha:
        raise ModelError(f"{model.name}: the card's sha256 is not the model's (the model "
                         "changed after signing)")
    signer = verify_card(card, keys)
    print(f"OK: {model.name} sha256 {sha}, version {card.version if card else '?'}, signed by "
          f"key id {signer}")
    from edge_agent.inference.gate_record import describe

    print(f"gate: {describe(card)}")
    return 0

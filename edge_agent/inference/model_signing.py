"""Signed models: an Ed25519 signature in the card over the model's sha256 and the card itself.

The release side signs (`edge-agent model sign`), the robot verifies with the public keys in
`inference.trusted_keys` before a model is installed or loaded. The signed message is

    b"edge-agent model v1\\0" + sha256 (64 hex) + b"\\0" + the card as canonical JSON

where the canonical card is the card without its `signature` field, keys sorted, no spaces: any
change to the weights (the sha256), the card's meaning, name or version breaks the signature.
The card carries

    "signature": {"alg": "ed25519", "key_id": "<16 hex>", "sig": "<base64, 64 bytes>"}

Public keys are written `ed25519:<base64 of the 32 raw bytes>` (what `edge-agent model keygen`
prints); the key id is the first 16 hex digits of the sha256 of those 32 bytes. The crypto is
the `cryptography` library's (imported lazily: only model.update, seeding and the CLI need it).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
from collections.abc import Mapping, Sequence
from typing import Any

from edge_agent.inference.model_card import ModelCard, ModelError

PREFIX = "ed25519:"
_CONTEXT = b"edge-agent model v1\0"


def parse_public_key(text: str) -> bytes:
    """`ed25519:<base64>` → the 32 raw key bytes; ValueError with the reason otherwise."""
    if not text.startswith(PREFIX):
        raise ValueError(f"must start with {PREFIX!r} (what `edge-agent model keygen` prints)")
    try:
        raw = base64.b64decode(text[len(PREFIX):], validate=True)
    except (binascii.Error, ValueError):
        raise ValueError("is not valid base64") from None
    if len(raw) != 32:
        raise ValueError(f"an Ed25519 public key is 32 bytes, this one is {len(raw)}")
    return raw


def format_public_key(raw: bytes) -> str:
    return PREFIX + base64.b64encode(raw).decode()


def key_id(raw: bytes) -> str:
    return hashlib.sha256(raw).hexdigest()[:16]


def signed_message(card: Mapping[str, Any]) -> bytes:
    """The bytes a signature covers (see the module docstring)."""
    body = {k: v for k, v in card.items() if k != "signature"}
    sha = str(body.get("sha256", "")).lower()
    canon = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return _CONTEXT + sha.encode() + b"\0" + canon.encode()


def sign_card(card: ModelCard, private_key_pem: bytes) -> ModelCard:
    """The card with a fresh `signature` (PEM private key: PKCS#8, as keygen/openssl write)."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    try:
        key = serialization.load_pem_private_key(private_key_pem, password=None)
    except (ValueError, TypeError) as e:
        raise ModelError(f"cannot read the signing key: {e}") from None
    if not isinstance(key, Ed25519PrivateKey):
        raise ModelError("the signing key is not an Ed25519 key")
    pub = key.public_key().public_bytes(serialization.Encoding.Raw,
                                        serialization.PublicFormat.Raw)
    data = card.as_json()
    sig = key.sign(signed_message(data))
    extra = {k: v for k, v in card.extra.items() if k != "signature"}
    extra["signature"] = {"alg": "ed25519", "key_id": key_id(pub),
                          "sig": base64.b64encode(sig).decode()}
    return ModelCard(card.name, card.version, card.sha256, card.inputs, card.outputs, extra)


def verify_card(card: ModelCard | None, trusted_keys: Sequence[str]) -> str:
    """The key id that signed this card; ModelError when it is unsigned or no trusted key
    verifies it. With no trusted keys configured, nothing is checked ("")."""
    if not trusted_keys:
        return ""
    if card is None:
        raise ModelError("unsigned: the model has no card (inference.trusted_keys is set, so "
                         "only signed models are installed; sign it with `edge-agent model sign`)")
    sig_obj = card.extra.get("signature")
    if not isinstance(sig_obj, Mapping):
        raise ModelError("unsigned: the card has no signature (inference.trusted_keys is set; "
                         "sign it with `edge-agent model sign`)")
    if sig_obj.get("alg") != "ed25519":
        raise ModelError(f"signature algorithm {sig_obj.get('alg')!r} is not ed25519")
    try:
        sig = base64.b64decode(str(sig_obj.get("sig", "")), validate=True)
    except (binascii.Error, ValueError):
        raise ModelError("the signature is not valid base64") from None
    from cryptography.exceptions import InvalidSignature
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

    message = signed_message(card.as_json())
    for text in trusted_keys:
        raw = parse_public_key(text)
        try:
            Ed25519PublicKey.from_public_bytes(raw).verify(sig, message)
        except InvalidSignature:
            continue
        return key_id(raw)
    raise ModelError(f"bad signature: no trusted key verifies it (signed by key id "
                     f"{str(sig_obj.get('key_id', '?'))[:16]!r}; the card or the model was "
                     "changed after signing, or the key is not in inference.trusted_keys)")


def generate_key() -> tuple[bytes, str]:
    """A new Ed25519 key pair: (PKCS#8 PEM private key, `ed25519:` public key line)."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    key = Ed25519PrivateKey.generate()
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                            serialization.NoEncryption())
    pub = key.public_key().public_bytes(serialization.Encoding.Raw,
                                        serialization.PublicFormat.Raw)
    return pem, format_public_key(pub)

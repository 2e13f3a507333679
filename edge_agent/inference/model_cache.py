"""The model cache: a verified last-known-good copy of the active policy in `<state_dir>/models/`.

Layout (content-addressed; one pointer file decides what is active):

    <dir>/<sha256>.onnx, <dir>/<sha256>.card.json   one pair per kept model (current, previous)
    <dir>/active.json   {"current": sha, "previous": sha | null, "seeded": sha | null}

`install()` (for `model.update`) verifies the bytes' sha256 against the card and the command,
that onnxruntime loads them on CPU, that the session's inputs/outputs match the card, that the
card's meaning matches the executor's observation layout and actions, and that a zero
observation gives finite scores; then writes the model and card (tmp + fsync + os.replace), and
only then swaps the pointer (tmp + fsync + os.replace + fsync of the directory). A crash at any
point leaves the pointer on complete files: the old model or the new one, never half of either.
Reading re-verifies the sha256; a corrupt current model falls back to the previous one.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edge_agent.inference.backend import EventBus, EventKind
from edge_agent.inference.model_card import (
    ModelCard,
    ModelError,
    card_path_for,
    meaning_problems,
    session_signature,
    sha256_bytes,
    sha256_file,
    signature_problems,
)
from edge_agent.inference.model_signing import verify_card
from edge_agent.log import get_logger
from edge_agent.store.atomic import read_capped, write_atomic

log = get_logger(__name__)
POINTER = "active.json"
POINTER_MAX_BYTES = 64 << 10  # three sha256 names; a longer pointer is corrupt, not read
STATUS_REVERIFY_S = 60.0  # `current_for_status` hashes the model again at least this often


@dataclass(frozen=True, slots=True)
class CachedModel:
    path: Path
    card: ModelCard

    @property
    def sha256(self) -> str:
        return self.card.sha256


class ModelCache:
    """Current + previous verified models in one directory (see the module docstring)."""

    def __init__(self, directory: Path, bus: EventBus | None = None, *,
                 fields: Sequence[tuple[str, str]] | None = None,
                 labels: Sequence[str] | None = None,
                 trusted_keys: Sequence[str] = ()) -> None:
        self.dir = directory
        self.trusted_keys = tuple(trusted_keys)  # non-empty: only signed models (model_signing)
        self._bus = bus
        self._fields = tuple(fields) if fields is not None else None
        self._labels = tuple(labels) if labels is not None else None
        self._lock = threading.Lock()
        # (files' stat key, when verified, what current() said): status's memo
        self._described: tuple[tuple[Any, ...], float, CachedModel | None] | None = None

    # -- reading --------------------------------------------------------------------------
    def pointer(self) -> dict[str, str | None]:
        try:
            data = json.loads(read_capped(self.dir / POINTER, POINTER_MAX_BYTES))
        except FileNotFoundError:
            return {"current": None, "previous": None, "seeded": None}
        except (OSError, ValueError) as e:
            self._emit(EventKind.CACHE_CORRUPT, f"{POINTER}: {e}")
            return {"current": None, "previous": None, "seeded": None}
        return {k: data.get(k) if isinstance(data.get(k), str) else None
                for k in ("current", "previous", "seeded")}

    def entry(self, sha: str | None) -> CachedModel | None:
        """The cached model with this sha256, verified again; None if absent or corrupt."""
        if sha is None:
            return None
        path = self.dir / f"{sha}.onnx"
        try:
            card = ModelCard.load(card_path_for(path))
            actual = sha256_file(path)
        except (ModelError, OSError) as e:
            self._emit(EventKind.CACHE_CORRUPT, f"{path.name}: {e}")
            return None
        if actual != sha or card.sha256 != sha:
            self._emit(EventKind.CACHE_CORRUPT,
                       f"{path.name}: sha256 is {actual}, card says {card.sha256}")
            return None
        if self.trusted_keys:
            try:
                verify_card(card, self.trusted_keys)
            except ModelError as e:  # a key was removed from the config, or a card edited
                self._emit(EventKind.CACHE_CORRUPT, f"{path.name}: {e}")
                return None
        return CachedModel(path, card)

    def current(self) -> CachedModel | None:
        return self.entry(self.pointer()["current"])

    def current_for_status(self) -> CachedModel | None:
        """`current()`, verified again when the pointer, the model or its card changed on disk
        (inode, size, mtime) and at least every `STATUS_REVERIFY_S` (bit rot keeps the mtime):
        `status` is polled, and hashing the model for each reply held it for milliseconds."""
        key, now = self._stat_key(), time.monotonic()
        memo = self._described
        if memo is not None and memo[0] == key and now - memo[1] < STATUS_REVERIFY_S:
            return memo[2]
        cur = self.current()
        # kept only if nothing changed while it was verified (a model.update racing it)
        self._described = (key, now, cur) if self._stat_key() == key else None
        return cur

    def _stat_key(self) -> tuple[Any, ...]:
        def st(path: Path) -> tuple[int, int, int] | None:
            try:
                s = path.stat()
            except OSError:
                return None
            return (s.st_ino, s.st_size, s.st_mtime_ns)
        pointer = st(self.dir / POINTER)
        sha = self.pointer()["current"]
        if sha is None:
            return (pointer, None)
        model = self.dir / f"{sha}.onnx"
        return (pointer, sha, st(model), st(card_path_for(model)))

    def previous(self) -> CachedModel | None:
        return self.entry(self.pointer()["previous"])

    def last_known_good(self) -> CachedModel | None:
        """The current model if it verifies, else the previous one."""
        p = self.pointer()
        return self.entry(p["current"]) or self.entry(p["previous"])

    # -- writing --------------------------------------------------------------------------
    def verify(self, model: bytes | Path, card: ModelCard | None = None, *,
               sha256: str | None = None, version: str | None = None
               ) -> tuple[Any, ModelCard, str, bytes]:
        """What `install()` checks, without installing: sha256, signature, session, meaning
        and a smoke run. Returns (the CPU session, the card, the sha256, the bytes); raises
        ModelError. `model.shadow` (daemon/shadow.py) runs its candidate on that session."""
        if isinstance(model, Path):
            try:
                data = model.read_bytes()
            except OSError as e:
                raise self._reject(f"cannot read {model}: {e}") from e
        else:
            data = bytes(model)
        actual = sha256_bytes(data)
        if not sha256 and card is None:
            raise self._reject("no sha256 to verify the model against")
        # Never the hash of the bytes (nor the card's claim): a reply must not become an
        # oracle for a file's contents — the file was not accepted as a model.
        if sha256 and sha256.lower() != actual:
            raise self._reject(f"sha256 mismatch: the file's bytes do not hash to {sha256}")
        if card is not None and card.sha256 != actual:
            raise self._reject("sha256 mismatch: the card's sha256 is not the file's")
        if self.trusted_keys:  # before onnxruntime parses a single byte of it
            try:
                signer = verify_card(card, self.trusted_keys)
            except ModelError as e:
                raise self._reject(str(e)) from None
            if version and card is not None and version != card.version:
                raise self._reject(f"version {version!r}: the signed card says "
                                   f"{card.version!r} (a signed card is installed as signed)")
            version = None
            log.info("model_signature_ok", key_id=signer)
        session = self._load_session(data)
        if card is None:
            card = derive_card(session, actual, version or "unversioned", "policy")
        elif version:
            card = card.with_identity(actual, version)
        problems = signature_problems(card, session)
        if self._fields is not None and self._labels is not None:
            problems += meaning_problems(card, self._fields, self._labels)
        problems += _smoke_problems(session)
        if problems:
            raise self._reject("; ".join(problems))
        return session, card, actual, data

    def install(self, model: bytes | Path, card: ModelCard | None = None, *,
                sha256: str | None = None, version: str | None = None,
                seeded: bool = False) -> CachedModel:
        """Verify and activate a model; the old current becomes previous. Raises ModelError."""
        card, actual, data = self.verify(model, card, sha256=sha256, version=version)[1:]
        with self._lock:
            self.dir.mkdir(parents=True, exist_ok=True)
            path = self.dir / f"{actual}.onnx"
            _atomic_write(path, data)
            _atomic_write(card_path_for(path), card.dumps().encode())
            old = self.pointer()
            prev = old["current"] if old["current"] != actual else old["previous"]
            _atomic_write(self.dir / POINTER, json.dumps(
                {"current": actual, "previous": prev,
                 "seeded": actual if seeded else old["seeded"]}).encode())
            self._collect({actual, prev} - {None})
        self._emit(EventKind.MODEL_INSTALLED, f"{card.name} {card.version} sha256 {actual[:12]}")
        return CachedModel(path, card)

    def seed(self, model_path: Path) -> CachedModel | None:
        """Install the configured model when it is new to the cache, else keep the current one.

        A model.update survives restarts; a newly deployed configured model (a different sha256
        from the one seeded last) replaces it. The card beside the model is used when present.
        """
        actual = sha256_file(model_path)
        p = self.pointer()
        if p["seeded"] == actual and (cur := self.last_known_good()) is not None:
            return cur
        card_path = card_path_for(model_path)
        card = ModelCard.load(card_path) if card_path.exists() else None
        return self.install(model_path, card, sha256=actual, seeded=True)

    def rollback(self) -> CachedModel:
        """Make the previous model current again (the current one becomes previous)."""
        with self._lock:
            p = self.pointer()
            prev = self.entry(p["previous"])
            if prev is None:
                raise ModelError("no previous model to roll back to")
            _atomic_write(self.dir / POINTER, json.dumps(
                {"current": p["previous"], "previous": p["current"],
                 "seeded": p["seeded"]}).encode())
        self._emit(EventKind.MODEL_INSTALLED, f"rolled back to {prev.card.version}")
        return prev

    def revert(self, bad: str) -> CachedModel:
        """A failed trial's rollback: the previous model current again and the candidate `bad`
        dropped (its files removed: it must not become the last-known-good fallback). Already
        reverted (`bad` is not current): the current model. Raises ModelError."""
        with self._lock:
            p = self.pointer()
            if p["current"] != bad:
                cur = self.entry(p["current"])
                if cur is None:
                    raise ModelError("no usable current model after the rollback")
                return cur
            prev = self.entry(p["previous"])
            if prev is None:
                raise ModelError("no previous model to roll back to")
            _atomic_write(self.dir / POINTER, json.dumps(
                {"current": prev.sha256, "previous": None, "seeded": p["seeded"]}).encode())
            self._collect({prev.sha256})
        self._emit(EventKind.MODEL_INSTALLED, f"rolled back to {prev.card.name} "
                   f"{prev.card.version} sha256 {prev.sha256[:12]} ({bad[:12]} dropped)")
        return prev

    # -- helpers --------------------------------------------------------------------------
    def _load_session(self, data: bytes) -> Any:
        try:
            import onnxruntime as ort

            opts = ort.SessionOptions()
            opts.intra_op_num_threads = 1
            opts.inter_op_num_threads = 1
            return ort.InferenceSession(data, sess_options=opts,
                                        providers=["CPUExecutionProvider"])
        except Exception as e:
            raise self._reject(f"onnxruntime cannot load the model: {e}") from e

    def _collect(self, keep: set[str | None]) -> None:
        for f in self.dir.iterdir():
            sha = f.name.split(".", 1)[0]
            if f.name != POINTER and (sha not in keep or f.name.endswith(".tmp")):
                with contextlib.suppress(OSError):
                    f.unlink()

    def _reject(self, why: str) -> ModelError:
        self._emit(EventKind.MODEL_REJECTED, why)
        return ModelError(f"model rejected: {why}")

    def _emit(self, kind: EventKind, detail: str) -> None:
        log.info(kind.value, detail=detail)
        if self._bus is not None:
            self._bus.emit(kind, "cache", detail)


def derive_card(session: Any, sha256: str, version: str, name: str) -> ModelCard:
    """A card from what a session declares (for a model shipped without one)."""
    ins, outs = session_signature(session)
    return ModelCard(name, version, sha256, ins, outs, {"derived": True})


def _smoke_problems(session: Any) -> list[str]:
    import numpy as np

    x_arg = session.get_inputs()[0]
    dims = [d if isinstance(d, int) and d > 0 else 1 for d in x_arg.shape]
    try:
        y = session.run(None, {x_arg.name: np.zeros(dims, dtype=np.float32)})[0]
    except Exception as e:
        return [f"a zero observation fails: {e}"]
    return [] if np.isfinite(y).all() else ["a zero observation gives non-finite scores"]


def _atomic_write(path: Path, data: bytes) -> None:
    """tmp + fsync + os.replace + fsync(dir): the file is old or new after any crash."""
    write_atomic(path, data, mode=0o644)


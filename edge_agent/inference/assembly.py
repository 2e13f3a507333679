"""Composition of the inference layer from `config.inference`: backends, cache, router, loading.

The daemon builds an `InferenceStack` before READY (cheap: no heavy import, no file read),
hands `stack.router` to the executor as its `Policy`, and calls `stack.start_background()`
right after READY. That thread starts the Triton worker, seeds the cache from the configured
model, and loads + warms up the local and cached sessions; each completion is an event.

Backends, best first: `triton` (if `inference.triton_url`) → `local` (the active model on the
configured providers) → `cached` (the last-known-good model on CPU: the model before the last
`model.update`, or the active one when there is none) → `rule` (the rule-based expert: always
ready, so a decision is never dropped when every model is down).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from edge_agent.executor.policy import ExpertPolicy
from edge_agent.inference.backend import Backend, DecisionSink, EventBus, EventSink
from edge_agent.inference.gate_record import require_passing_gate
from edge_agent.inference.model_cache import CachedModel, ModelCache
from edge_agent.inference.model_card import ModelError
from edge_agent.inference.model_source import read_model
from edge_agent.inference.onnx_backend import OnnxBackend, SessionFactory
from edge_agent.inference.providers import CPU
from edge_agent.inference.router import PolicyRouter
from edge_agent.inference.rule_backend import RuleBackend
from edge_agent.inference.triton_backend import TritonBackend
from edge_agent.log import get_logger
from edge_agent.policy_seam import OBS_DIM, OBS_FIELDS, Action

if TYPE_CHECKING:
    from edge_agent.contract.status_parts import InferenceStatus

log = get_logger(__name__)

OBS_FIELD_UNITS = tuple((f.name, f.unit) for f in OBS_FIELDS)
ACTION_LABELS = tuple(a.name.lower() for a in Action)


@dataclass(frozen=True, slots=True)
class InferenceSettings:
    """What the stack needs from `config.inference` (seconds, not ms)."""

    providers: tuple[str, ...] = (CPU,)
    model: Path | None = None
    cache_dir: Path | None = None
    triton_url: str | None = None
    triton_model: str = "policy"
    deadline_s: float = 0.02
    intra_op_threads: int = 1
    model_wait_s: float = 10.0
    triton_ready_period_s: float = 1.0
    grip_force_band_n: float = 1.0  # the rule backend's expert uses the executor's band
    update_dir: Path | None = None  # where model.update may read (besides the cache)
    max_model_bytes: int = 256 << 20
    trusted_keys: tuple[str, ...] = ()  # non-empty: only signed models are installed/loaded
    require_gate: bool = False  # model.update: only a card with a passing gate record

    @classmethod
    def from_config(cls, section: Any) -> InferenceSettings:
        """From an `InferenceSection` (edge_agent.config.schema)."""
        return cls(tuple(section.providers), section.model, section.cache_dir,
                   section.triton_url, section.triton_model, section.deadline_ms / 1e3,
                   section.intra_op_threads, section.model_wait_s,
                   update_dir=section.update_dir, max_model_bytes=section.max_model_bytes,
                   trusted_keys=tuple(section.trusted_keys),
                   require_gate=section.require_gate)


class InferenceStack:
    """Backends + cache + router, built cheaply, loaded in the background."""

    def __init__(self, settings: InferenceSettings, *, event_sink: EventSink | None = None,
                 decision_sink: DecisionSink | None = None,
                 session_factory: SessionFactory | None = None) -> None:
        self.settings = settings
        self.bus = EventBus(event_sink)
        self.cache = (ModelCache(settings.cache_dir, self.bus, fields=OBS_FIELD_UNITS,
                                 labels=ACTION_LABELS, trusted_keys=settings.trusted_keys)
                      if settings.cache_dir else None)
        backends: list[Backend] = []
        self.remote: TritonBackend | None = None
        if settings.triton_url:
            self.remote = TritonBackend("triton", settings.triton_url, settings.triton_model,
                                        self.bus, request_timeout_s=settings.deadline_s,
                                        ready_period_s=settings.triton_ready_period_s)
            backends.append(self.remote)
        seam: dict[str, Any] = {"session_factory": session_factory} if session_factory else {}
        self.local = OnnxBackend("local", self._active_model, settings.providers, self.bus,
                                 intra_op_threads=settings.intra_op_threads, obs_dim=OBS_DIM,
                                 n_outputs=len(Action), **seam)
        self.cached = OnnxBackend("cached", self._last_known_good, (CPU,), self.bus,
                                  intra_op_threads=1, obs_dim=OBS_DIM, n_outputs=len(Action),
                                  **seam)
        backends += [self.local, self.cached]
        # last: the rule-based expert — no decision is dropped when every model is down
        self.rule = RuleBackend(ExpertPolicy(band_n=settings.grip_force_band_n))
        backends.append(self.rule)
        self.router = PolicyRouter(backends, self.bus, deadline_s=settings.deadline_s,
                                   decision_sink=decision_sink)
        self.load_s: float | None = None  # load() start → the first backend ready
        self._thread: threading.Thread | None = None

    def _unverified_fallback(self) -> Path | None:
        """The configured file run directly (no cache, or seeding failed) — never when
        signatures are required: only a verified, installed model is loaded then."""
        return None if self.settings.trusted_keys else self.settings.model

    def _active_model(self) -> Path | None:
        entry = self.cache.current() if self.cache else None
        return entry.path if entry else self._unverified_fallback()

    def _last_known_good(self) -> Path | None:
        if self.cache is None:
            return self._unverified_fallback()
        entry = self.cache.previous() or self.cache.current()
        return entry.path if entry else self._unverified_fallback()

    # -- loading --------------------------------------------------------------------------
    def load(self) -> None:
        """Blocking: remote worker, cache seed, local + cached sessions. Background only."""
        t0 = time.perf_counter()
        # numpy once, here, before the remote worker's thread imports tritonclient while this
        # one imports onnxruntime: numpy 2 imported by two threads at once fails in one of them
        # ("partially initialized module 'numpy._core._multiarray_umath'"), and neither
        # backend can load after that (seen in 1 daemon start of 4 on this 2-core VM)
        import numpy  # noqa: F401

        if self.remote is not None:
            self.remote.start()
        if self.cache is not None and self.settings.model is not None:
            try:
                self.cache.seed(self.settings.model)
            except (ModelError, OSError) as e:  # run the configured file directly
                log.warning("model_cache_seed_failed", model=str(self.settings.model),
                            error=str(e))
        self.local.load()
        if self.model_ready() and self.load_s is None:
            self.load_s = time.perf_counter() - t0
        self.cached.load()
        if self.model_ready() and self.load_s is None:
            self.load_s = time.perf_counter() - t0

    def start_background(self) -> threading.Thread:
        """Run load() on a daemon thread (call right after READY)."""
        if self._thread is None:
            self._thread = threading.Thread(target=self.load, name="inference-load",
                                            daemon=True)
            self._thread.start()
        return self._thread

    def model_ready(self) -> bool:
        """Some model backend (not the rule) can decide now."""
        return any(b.ready() for b in self.router.backends if b is not self.rule)

    def wait_ready(self, timeout: float | None = None, *,
                   loaded: Callable[[], bool] | None = None) -> bool:
        """A task that arrives before its model waits (bounded by inference.model_wait_s);
        False after the wait: the task then runs on whatever is ready (at worst the rule).
        `loaded`: whether `load()` has returned (the caller's start-up thread knows). Without a
        remote backend the wait ends with it: no session turns ready after it (until a
        model.update), so a refused or unloadable model does not hold every task for the whole
        wait. A remote server may still come up: it is waited for."""
        over = loaded if self.remote is None else None
        self.bus.wait_until(lambda: self.model_ready() or (over is not None and over()),
                            self.settings.model_wait_s if timeout is None else timeout)
        return self.model_ready()

    # -- model.update ---------------------------------------------------------------------
    def update_model(self, uri: str, sha256: str, version: str | None = None) -> CachedModel:
        """Read (model_source: allowed directory, regular file, size cap), verify (sha256,
        signature, meaning, smoke run) and install a model, then reload the sessions.

        Blocking (hashing, a verification session, two loads): run it off the control thread.
        Raises SourceRefused (a ValueError: the uri) or ModelError (the model).
        """
        if self.cache is None:
            raise ModelError("no model cache directory configured")
        allowed = [d for d in (self.settings.update_dir, self.cache.dir) if d is not None]
        src = read_model(uri, allowed, self.settings.max_model_bytes)
        if self.settings.require_gate:  # before anything else is done with it
            require_passing_gate(src.card)
        entry = self.cache.install(src.data, src.card, sha256=sha256, version=version)
        self.local.load()
        self.cached.load()
        return entry

    def revert_model(self, bad: str, *, reload: bool = True) -> CachedModel:
        """A trial's rollback (daemon/model_trial.py): the previous model current again, the
        candidate `bad` dropped from the cache, then (`reload`) the sessions reloaded — the
        model in use changes between two decisions. Raises ModelError (nothing to go back to)."""
        if self.cache is None:
            raise ModelError("no model cache directory configured")
        entry = self.cache.revert(bad)
        if reload:
            self.local.load()
            self.cached.load()
        return entry

    # -- failure.inject -------------------------------------------------------------------
    def inject(self, target: str, mode: str, duration_s: float,
               latency_ms: float | None = None) -> dict[str, Any]:
        """failure.inject `gpu fail` (the local model's GPU-session runs raise at the ORT seam),
        `triton down` (the Triton client sees the server unreachable) or `model slow` (each run
        of the local model's session takes `latency_ms` longer, at the ORT seam), for
        `duration_s`. Raises ValueError (the reason) where the fault cannot be injected here."""
        if not duration_s > 0:
            raise ValueError(f"duration_s must be > 0, got {duration_s}")
        if (target, mode) == ("model", "slow"):
            if latency_ms is None or not latency_ms > 0:
                raise ValueError("model slow needs latency_ms > 0")
            what = self.local.inject_slow(latency_ms / 1e3, duration_s)
        elif (target, mode) == ("gpu", "fail"):
            what = self.local.inject_gpu_fault(duration_s)
        elif (target, mode) == ("triton", "down"):
            if self.remote is None:
                raise ValueError("no Triton server is configured (inference.triton_url): "
                                 "nothing to take down")
            self.remote.inject_outage(duration_s)
            what = f"{self.remote.url} unreachable for {duration_s:g} s"
        else:
            raise ValueError(f"no inference fault {target} {mode!r} (gpu fail, triton down, "
                             "model slow)")
        log.warning("failure_injected", target=target, mode=mode, duration_s=duration_s,
                    latency_ms=latency_ms)
        out: dict[str, Any] = {"target": target, "mode": mode, "duration_s": duration_s,
                               "effect": what}
        if latency_ms is not None:
            out["latency_ms"] = latency_ms
        return out

    def status(self) -> InferenceStatus:
        cur = self.cache.current_for_status() if self.cache else None
        return {**self.router.status(),
                "model": {"name": cur.card.name, "version": cur.card.version,
                          "sha256": cur.sha256} if cur else None,
                "load_ms": round(self.load_s * 1e3, 1) if self.load_s is not None else None}

    def stop(self) -> None:
        """Stop every backend; idempotent, never raises."""
        self.router.stop()


def build_stack(section: Any, *, event_sink: EventSink | None = None,
                decision_sink: DecisionSink | None = None,
                settings_hook: Callable[[InferenceSettings], InferenceSettings] | None = None,
                session_factory: SessionFactory | None = None) -> InferenceStack:
    """The daemon's one call: `build_stack(config.inference, event_sink=..., decision_sink=...)`
    (`session_factory`: the simulated GPU of `--sim`, inference/sim_gpu.py)."""
    settings = InferenceSettings.from_config(section)
    if settings_hook is not None:
        settings = settings_hook(settings)
    return InferenceStack(settings, event_sink=event_sink, decision_sink=decision_sink,
                          session_factory=session_factory)

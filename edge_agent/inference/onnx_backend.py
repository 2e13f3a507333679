"""A local onnxruntime policy session: created lazily after READY, warmed up, run on the caller.

`load()` is slow (it imports onnxruntime, ~95 ms, and builds the session): the daemon calls it
from a background thread after READY; `ready()` turns true only after a warm-up run. `submit()`
runs the model on the caller's thread (a small MLP takes tens of µs on one CPU thread) and never
raises. What the session really runs on comes from `session.get_providers()`, never from
`get_available_providers()`: an accelerator that was asked for and is missing is reported as
`gpu_unavailable`. A run that raises on an accelerator is a GPU fault: the session is rebuilt on
CPU in the background (`gpu_failed`), and the router falls through until it is back.
"""

from __future__ import annotations

import threading
import time
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from edge_agent.inference.backend import EventBus, EventKind, Row, Ticket
from edge_agent.inference.providers import (
    ProviderResolution,
    configure_session_options,
    resolve,
    session_providers,
)
from edge_agent.log import get_logger

log = get_logger(__name__)

ModelSource = Path | Callable[[], Path | None]


class OnnxBackend:
    """One onnxruntime session on the configured providers (see the module docstring)."""

    def __init__(self, name: str, model: ModelSource, providers: Sequence[str], bus: EventBus,
                 *, intra_op_threads: int = 1, obs_dim: int | None = None,
                 n_outputs: int | None = None, warmup_runs: int = 3,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.name = name
        self._model = model
        self.providers = tuple(providers)
        self._bus = bus
        self._threads = intra_op_threads
        self._obs_dim = obs_dim
        self._n_outputs = n_outputs
        self._warmup_runs = max(1, warmup_runs)
        self._clock = clock
        self._load_lock = threading.Lock()
        # (session, input name, output name, numpy module) — one attribute, swapped atomically
        self._live: tuple[Any, str, str, Any] | None = None
        self._cpu_only = False
        self._gpu_fault_injected = False
        self._stopped = False
        self.resolution: ProviderResolution | None = None
        self.model_path: Path | None = None
        self.load_s: float | None = None  # load() start → ready, last load
        self.runs = 0
        self.failures = 0

    # -- lifecycle ------------------------------------------------------------------------
    def load(self) -> bool:
        """Create (or re-create) the session and warm it up; blocking: never the control thread."""
        with self._load_lock:
            if self._stopped:
                return False
            t0 = time.perf_counter()
            path = self._model() if callable(self._model) else self._model
            if path is None:
                self._bus.emit(EventKind.LOAD_FAILED, self.name, "no model available")
                return False
            try:
                live, res = self._create(path)
            except Exception as e:  # onnxruntime raises its own types; report, never crash
                log.warning("onnx_load_failed", backend=self.name, model=str(path), error=str(e))
                self._bus.emit(EventKind.LOAD_FAILED, self.name, f"{path}: {e}")
                return False
            if self._stopped:
                return False
            self.resolution, self.model_path = res, path
            self._gpu_fault_injected = False
            self._live = live
            self.load_s = time.perf_counter() - t0
        if res.gpu_unavailable and not self._cpu_only:
            self._bus.emit(EventKind.GPU_UNAVAILABLE, self.name, res.describe())
        self._bus.emit(EventKind.BACKEND_UP, self.name,
                       f"{path.name} on {res.device} ({res.describe()}), "
                       f"loaded in {self.load_s * 1e3:.1f} ms")
        return True

    def _create(self, path: Path) -> tuple[tuple[Any, str, str, Any], ProviderResolution]:
        import numpy as np  # heavy imports only here, after READY
        import onnxruntime as ort

        opts = configure_session_options(ort.SessionOptions(), self._threads)
        providers = session_providers(self.providers, self._cpu_only)
        with warnings.catch_warnings():  # a missing provider is reported as gpu_unavailable
            warnings.filterwarnings("ignore", message="Specified provider")
            session = ort.InferenceSession(str(path), sess_options=opts, providers=providers)
        res = resolve(providers, session.get_providers())
        x_arg, y_arg = session.get_inputs()[0], session.get_outputs()[0]
        dim = x_arg.shape[-1] if x_arg.shape and isinstance(x_arg.shape[-1], int) else None
        if self._obs_dim is not None and dim != self._obs_dim:
            raise ValueError(f"input {x_arg.name} has {dim} features, the observation has "
                             f"{self._obs_dim}")
        x = np.zeros((1, self._obs_dim or dim or 1), dtype=np.float32)
        for _ in range(self._warmup_runs):  # first runs allocate arenas and pick kernels
            y = session.run([y_arg.name], {x_arg.name: x})[0]
        if self._n_outputs is not None and y.size != self._n_outputs:
            raise ValueError(f"output {y_arg.name} has {y.size} values, expected "
                             f"{self._n_outputs} (one per action)")
        return (session, x_arg.name, y_arg.name, np), res

    def load_in_background(self) -> threading.Thread:
        t = threading.Thread(target=self.load, name=f"onnx-load-{self.name}", daemon=True)
        t.start()
        return t

    def ready(self) -> bool:
        return self._live is not None

    def wait_ready(self, timeout: float) -> bool:
        return self._bus.wait_until(self.ready, timeout)

    def stop(self) -> None:
        """Drop the session; idempotent, never raises."""
        self._stopped = True
        self._live = None

    # -- decisions ------------------------------------------------------------------------
    def submit(self, row: Row) -> Ticket:
        """Run the model now on this thread; the ticket is always complete."""
        live = self._live
        t0 = self._clock()
        if live is None:
            return Ticket.completed(t0, None, "not loaded", t0)
        session, x_name, y_name, np = live
        try:
            if self._gpu_fault_injected:
                raise RuntimeError("injected GPU fault (failure.inject gpu fail)")
            x = np.array(row, dtype=np.float32, ndmin=2)
            scores: list[float] = session.run([y_name], {x_name: x})[0][0].tolist()
        except Exception as e:
            self.failures += 1
            self._after_run_error(live, e)
            return Ticket.completed(t0, None, f"{type(e).__name__}: {e}", self._clock())
        self.runs += 1
        return Ticket.completed(t0, scores, None, self._clock())

    def _after_run_error(self, live: tuple[Any, str, str, Any], error: Exception) -> None:
        res = self.resolution
        on_gpu = res is not None and res.accelerator_active
        if not (on_gpu or self._gpu_fault_injected) or self._live is not live:
            return  # a CPU run error is one failed attempt; the router reports it
        self._live = None
        self._cpu_only = True
        self._bus.emit(EventKind.GPU_FAILED, self.name,
                       f"run failed on {res.active[0] if res and res.active else '?'}: {error}; "
                       "re-creating the session on CPU")
        self.load_in_background()

    def inject_gpu_fault(self) -> None:
        """failure.inject gpu fail: the next run fails as a GPU fault would (CPU rebuild follows).

        On a backend already on CPU this exercises the same recovery (a fresh CPU session).
        """
        self._gpu_fault_injected = True

    def status(self) -> dict[str, Any]:
        return {"name": self.name, "ready": self.ready(),
                "model": str(self.model_path) if self.model_path else None,
                "providers": self.resolution.as_dict() if self.resolution else None,
                "cpu_only_after_gpu_fault": self._cpu_only,
                "load_ms": round(self.load_s * 1e3, 2) if self.load_s is not None else None,
                "runs": self.runs, "failures": self.failures}

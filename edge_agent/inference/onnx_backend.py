"""A local onnxruntime policy session: created lazily after READY, warmed up, run on the caller.

`load()` is slow (it imports onnxruntime, ~95 ms, and builds the session): the daemon calls it
from a background thread after READY; `ready()` turns true only after a warm-up run. `submit()`
runs the model on the caller's thread (a small MLP takes tens of µs on one CPU thread) and never
raises. What the session really runs on comes from `session.get_providers()`, never from
`get_available_providers()`: an accelerator that was asked for and is missing is reported as
`gpu_unavailable`. A run that raises on an accelerator is a GPU fault: the session is rebuilt on
CPU in the background (`gpu_failed`), and the router falls through until it is back.

Back to the GPU: the health monitor's GPU probe calls `probe_gpu(recover_after)` once a period.
While the session is on CPU after a fault it builds (in the background) a fresh session on the
configured providers and runs one probe inference on it per call; after `recover_after`
successes in a row that session becomes the live one (`inference_backend_up`, "back on the
GPU"). Sessions come from `session_factory` (onnxruntime's `InferenceSession`): the ORT seam.
`inject_gpu_fault(duration_s)` (failure.inject gpu fail) makes every run on a GPU session raise
at that seam for a while — the live one, then the probe's — as a real fault would.
`inject_slow(latency_s, duration_s)` (failure.inject model slow) makes every run of the session
live now take `latency_s` longer (a sleep in the run, as onnxruntime releases the GIL while it
computes), as a slower model would: a new session (the model reloaded, rolled back) is not slow.
"""

from __future__ import annotations

import math
import threading
import time
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from edge_agent.inference.backend import EventBus, EventKind, Row, Ticket
from edge_agent.inference.bound_run import BoundRun, bind
from edge_agent.inference.providers import (
    ACCELERATORS,
    ProviderResolution,
    configure_session_options,
    resolve,
    session_providers,
)
from edge_agent.log import get_logger

if TYPE_CHECKING:
    from edge_agent.contract.status_parts import LocalBackendStatus

log = get_logger(__name__)

ModelSource = Path | Callable[[], Path | None]
# (model path, SessionOptions, providers) -> an InferenceSession (or a test's stand-in for one)
SessionFactory = Callable[[str, Any, list[str]], Any]
# (session, input name, output name, numpy module, runs on an accelerator, its bound buffers on
# the CPU: inference/bound_run.py)
Live = tuple[Any, str, str, Any, bool, BoundRun | None]
GPU_RETRY_S = 60.0  # a session that came up without its GPU: build the next probe one this late


def _ort_session(path: str, options: Any, providers: list[str]) -> Any:
    import onnxruntime as ort

    with warnings.catch_warnings():  # a missing provider is reported as gpu_unavailable
        warnings.filterwarnings("ignore", message="Specified provider")
        return ort.InferenceSession(path, sess_options=options, providers=providers)


class OnnxBackend:
    """One onnxruntime session on the configured providers (see the module docstring)."""

    def __init__(self, name: str, model: ModelSource, providers: Sequence[str], bus: EventBus,
                 *, intra_op_threads: int = 1, obs_dim: int | None = None,
                 n_outputs: int | None = None, warmup_runs: int = 3,
                 clock: Callable[[], float] = time.monotonic,
                 session_factory: SessionFactory = _ort_session) -> None:
        self.name = name
        self._model = model
        self.providers = tuple(providers)
        self._bus = bus
        self._threads = intra_op_threads
        self._obs_dim = obs_dim
        self._n_outputs = n_outputs
        self._warmup_runs = max(1, warmup_runs)
        self._clock = clock
        self._factory = session_factory
        self._load_lock = threading.Lock()
        self._gpu_lock = threading.Lock()  # GPU fault / probe / recovery transitions
        self._live: Live | None = None  # one attribute, swapped atomically
        self._cpu_only = False
        self._fault_until = -math.inf  # failure.inject gpu fail: GPU runs raise until then
        # failure.inject model slow: (the session that is slow, until, extra seconds per run)
        self._slow: tuple[Any, float, float] | None = None
        self._had_gpu = False  # some session of this backend ran on an accelerator
        self._probe_live: tuple[Live, ProviderResolution] | None = None  # GPU probe session
        self._probe_building = False
        self._probe_next_try = -math.inf
        self._probe_streak = 0
        self._width = obs_dim or 1  # the model's input width (from the session once loaded)
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
                live, res = self._create(path, self._cpu_only)
            except Exception as e:  # onnxruntime raises its own types; report, never crash
                log.warning("onnx_load_failed", backend=self.name, model=str(path), error=str(e))
                self._bus.emit(EventKind.LOAD_FAILED, self.name, f"{path}: {e}")
                return False
            if self._stopped:
                return False
            self.resolution, self.model_path = res, path
            self._live = live
            self.load_s = time.perf_counter() - t0
        if res.gpu_unavailable and not self._cpu_only:
            self._bus.emit(EventKind.GPU_UNAVAILABLE, self.name, res.describe())
        self._bus.emit(EventKind.BACKEND_UP, self.name,
                       f"{path.name} on {res.device} ({res.describe()}), "
                       f"loaded in {self.load_s * 1e3:.1f} ms")
        return True

    def _create(self, path: Path, cpu_only: bool) -> tuple[Live, ProviderResolution]:
        import numpy as np  # heavy imports only here, after READY
        import onnxruntime as ort

        opts = configure_session_options(ort.SessionOptions(), self._threads)
        providers = session_providers(self.providers, cpu_only)
        session = self._factory(str(path), opts, providers)
        res = resolve(providers, session.get_providers())
        x_arg, y_arg = session.get_inputs()[0], session.get_outputs()[0]
        dim = x_arg.shape[-1] if x_arg.shape and isinstance(x_arg.shape[-1], int) else None
        if self._obs_dim is not None and dim != self._obs_dim:
            raise ValueError(f"input {x_arg.name} has {dim} features, the observation has "
                             f"{self._obs_dim}")
        live: Live = (session, x_arg.name, y_arg.name, np, res.accelerator_active, None)
        self._width = self._obs_dim or dim or 1
        x = np.zeros((1, self._width), dtype=np.float32)
        for _ in range(self._warmup_runs):  # first runs allocate arenas and pick kernels
            y = self._run(live, x)
        if self._n_outputs is not None and y.size != self._n_outputs:
            raise ValueError(f"output {y_arg.name} has {y.size} values, expected "
                             f"{self._n_outputs} (one per action)")
        if not res.accelerator_active:  # GPU sessions keep session.run (the fault seam)
            live = (*live[:5], bind(session, np, self._width, y))
        if res.accelerator_active:
            self._had_gpu = True
        return live, res

    def _run(self, live: Live, x: Any) -> Any:
        """One session run (the ORT seam); an injected GPU fault raises here, on GPU sessions."""
        session, x_name, y_name, _, on_gpu, _ = live
        if on_gpu and self._clock() < self._fault_until:
            raise RuntimeError("injected GPU fault (failure.inject gpu fail)")
        slow = self._slow
        if slow is not None and slow[0] is session and self._clock() < slow[1]:
            time.sleep(slow[2])  # a slower model: the run takes longer, the GIL released
        return session.run([y_name], {x_name: x})[0]

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
        self._probe_live = None

    # -- decisions ------------------------------------------------------------------------
    def submit(self, row: Row) -> Ticket:
        """Run the model now on this thread; the ticket is always complete."""
        live = self._live
        t0 = self._clock()
        if live is None:
            return Ticket.completed(t0, None, "not loaded", t0)
        try:
            slow = self._slow  # a slowed session's runs take _run's sleep
            bound = live[5] if slow is None or slow[0] is not live[0] or t0 >= slow[1] else None
            scores = bound.scores(row) if bound is not None else None
            if scores is None:
                np = live[3]
                x = np.array(row, dtype=np.float32, ndmin=2)
                scores = self._run(live, x)[0].tolist()
        except Exception as e:
            self.failures += 1
            self._after_run_error(live, e)
            return Ticket.completed(t0, None, f"{type(e).__name__}: {e}", self._clock())
        self.runs += 1
        return Ticket.completed(t0, scores, None, self._clock())

    def _after_run_error(self, live: Live, error: Exception) -> None:
        if not live[4]:
            return  # a CPU run error is one failed attempt; the router reports it
        with self._gpu_lock:
            if self._live is not live:
                return  # another thread saw the same fault first
            self._live = None
            self._cpu_only = True
            self._probe_streak = 0
        res = self.resolution
        self._bus.emit(EventKind.GPU_FAILED, self.name,
                       f"run failed on {res.active[0] if res and res.active else '?'}: {error}; "
                       "re-creating the session on CPU")
        self.load_in_background()

    # -- the GPU: failure injection, probe, recovery ---------------------------------------
    @property
    def gpu_requested(self) -> bool:
        return any(p in ACCELERATORS for p in self.providers)

    @property
    def on_gpu(self) -> bool:
        live = self._live
        return live is not None and live[4]

    def inject_gpu_fault(self, duration_s: float) -> str:
        """failure.inject gpu fail: every run on a GPU session raises for `duration_s` (the live
        session's next decision is a GPU fault: CPU rebuild; the GPU probe fails until it ends).
        Raises ValueError where there is no GPU session to fail."""
        if not self.gpu_requested:
            raise ValueError(f"inference.providers asks for no GPU ({', '.join(self.providers)})"
                             ": there is no GPU session to fail")
        if not self._had_gpu:
            why = self.resolution.describe() if self.resolution else "the model is not loaded"
            raise ValueError(f"no session of this backend runs on a GPU ({why})")
        self._fault_until = self._clock() + duration_s
        return f"runs on the GPU raise for {duration_s:g} s"

    def inject_slow(self, latency_s: float, duration_s: float) -> str:
        """failure.inject model slow: each run of the live session takes `latency_s` longer for
        `duration_s` (see the module doc). Raises ValueError when no session is loaded."""
        live = self._live
        if live is None:
            raise ValueError(f"the {self.name} model is not loaded: no session to slow down")
        self._slow = (live[0], self._clock() + duration_s, latency_s)
        name = self.model_path.name if self.model_path else "?"
        return (f"each run of {name} ({self.name}) takes {latency_s * 1e3:g} ms longer for "
                f"{duration_s:g} s")

    def probe_gpu(self, recover_after: int) -> tuple[bool | None, str, dict[str, Any]]:
        """One GPU health check (the monitor's thread; returns quickly, never raises):
        (ok — None where no GPU is configured —, a line, figures). See the module docstring."""
        if not self.gpu_requested:
            return None, "no GPU provider configured", {}
        live = self._live
        if live is not None and live[4]:
            ok, why, ms = self._probe_run(live)
            if not ok:
                self.failures += 1
                self._after_run_error(live, RuntimeError(why))
                return False, f"probe inference on the GPU failed: {why}", {"device": "gpu"}
            return True, "decisions on the GPU", {"device": "gpu", "probe_ms": ms}
        figures: dict[str, Any] = {"device": "cpu" if live is not None else None,
                                   "after_gpu_fault": self._cpu_only}
        if live is None and not self._cpu_only:
            return False, "the model is not loaded (yet)", figures
        probe = self._probe_live
        if probe is None:
            self._probe_streak = 0
            self._build_probe_session()
            res = self.resolution
            why = ("a GPU fault moved the session to CPU" if self._cpu_only
                   else f"no GPU: {res.describe()}" if res is not None else "not loaded")
            return False, f"{why}; a probe session on the GPU is being built", figures
        ok, why, ms = self._probe_run(probe[0])
        if not ok:
            self._probe_live, self._probe_streak = None, 0
            return False, f"probe inference on the GPU failed: {why}", figures
        self._probe_streak += 1
        figures.update(probe_ms=ms, successes=self._probe_streak)
        if self._probe_streak < recover_after:
            return True, (f"the GPU answers again ({self._probe_streak}/{recover_after}); "
                          "decisions stay on CPU until then"), figures
        self._back_on_gpu(*probe)
        return True, f"back on the GPU after {recover_after} good probes", {
            "device": "gpu", "probe_ms": ms}

    def _probe_run(self, live: Live) -> tuple[bool, str, float]:
        x = live[3].zeros((1, self._width), dtype=live[3].float32)
        t0 = time.perf_counter()
        try:
            self._run(live, x)
        except Exception as e:
            return False, f"{type(e).__name__}: {e}", 0.0
        return True, "", round((time.perf_counter() - t0) * 1e3, 3)

    def _build_probe_session(self) -> None:
        """Build a session on the configured providers in the background (once at a time;
        after a build that came up without its GPU, not again before GPU_RETRY_S)."""
        with self._gpu_lock:
            if self._probe_building or self._stopped or self._clock() < self._probe_next_try:
                return
            self._probe_building = True
        threading.Thread(target=self._build_probe, name=f"onnx-gpu-probe-{self.name}",
                         daemon=True).start()

    def _build_probe(self) -> None:
        try:
            path = self._model() if callable(self._model) else self._model
            if path is None:
                return
            live, res = self._create(path, cpu_only=False)
            if res.accelerator_active:
                self._probe_live = (live, res)
            else:
                self._probe_next_try = self._clock() + GPU_RETRY_S
        except Exception as e:  # the GPU is still broken: the next probe tries again
            log.info("gpu_probe_session_failed", backend=self.name, error=str(e))
        finally:
            self._probe_building = False

    def _back_on_gpu(self, live: Live, res: ProviderResolution) -> None:
        with self._gpu_lock:
            self._probe_live, self._probe_streak = None, 0
            if self._stopped:
                return
            self._cpu_only = False
            self.resolution = res
            self._live = live
        self._bus.emit(EventKind.BACKEND_UP, self.name,
                       f"back on the GPU ({res.describe()}) after a GPU fault")

    def status(self) -> LocalBackendStatus:
        return {"name": self.name, "ready": self.ready(),
                "model": str(self.model_path) if self.model_path else None,
                "providers": self.resolution.as_dict() if self.resolution else None,
                "cpu_only_after_gpu_fault": self._cpu_only, "on_gpu": self.on_gpu,
                "load_ms": round(self.load_s * 1e3, 2) if self.load_s is not None else None,
                "runs": self.runs, "failures": self.failures}

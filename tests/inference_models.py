"""Test helpers for the inference layer: generated ONNX policies, observations, odd backends.

Models come from models/make_test_policy.py (deterministic numpy weights → ONNX). The backends
here sit at the lowest seam (the `Backend` protocol) and wrap a real onnxruntime session: one
that is slow (it really takes longer than the deadline) and one that answers from a worker
thread only when a gate opens (a remote backend whose network is under the test's control).
"""

from __future__ import annotations

import importlib.util
import queue
import random
import threading
import time
from functools import cache
from pathlib import Path
from types import ModuleType
from typing import Any

from edge_agent.inference.backend import EventBus, Row, Ticket
from edge_agent.inference.onnx_backend import OnnxBackend
from edge_agent.policy_seam import OBS_DIM, POLICY_STATES, Observation

ROOT = Path(__file__).resolve().parents[1]


@cache
def policy_tool() -> ModuleType:
    spec = importlib.util.spec_from_file_location("make_test_policy",
                                                  ROOT / "models" / "make_test_policy.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def make_policy(directory: Path, name: str = "policy", *, seed: int = 0, nan: bool = False,
                version: str | None = None) -> Path:
    """Write `<directory>/<name>.onnx` + its card; returns the model path."""
    path = directory / f"{name}.onnx"
    policy_tool().write_policy(path, seed=seed, nan=nan, version=version)
    return path


def observations(n: int, seed: int = 1) -> list[Observation]:
    """Varied, finite observations (values in the ranges the executor produces)."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        state = rng.choice(POLICY_STATES)
        v = [0.0] * OBS_DIM
        v[POLICY_STATES.index(state)] = 1.0
        for i in range(len(POLICY_STATES), OBS_DIM):
            v[i] = rng.uniform(-3.0, 3.0)
        out.append(Observation(state, tuple(v)))
    return out


def bare_session(model: Path) -> Any:
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    return ort.InferenceSession(str(model), sess_options=opts,
                                providers=["CPUExecutionProvider"])


def bare_scores(session: Any, obs: Observation) -> list[float]:
    import numpy as np

    x = np.asarray(obs.vector, dtype=np.float32).reshape(1, -1)
    out: list[float] = session.run(None, {"obs": x})[0].reshape(-1).tolist()
    return out


def wait_for(predicate: Any, timeout: float = 30.0, what: str = "condition") -> None:
    """Poll a condition with a deadline (no fixed sleeps in tests)."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.005)


class SlowBackend:
    """A real ONNX backend that takes `delay_s` longer than the model needs (inline)."""

    def __init__(self, inner: OnnxBackend, delay_s: float, name: str = "slow") -> None:
        self.name = name
        self.inner = inner
        self.delay_s = delay_s

    def ready(self) -> bool:
        return self.inner.ready()

    def submit(self, row: Row) -> Ticket:
        t0 = time.monotonic()
        time.sleep(self.delay_s)  # the slowness under test, not synchronisation
        t = self.inner.submit(row)
        return Ticket.completed(t0, t.scores, t.error, time.monotonic())

    def stop(self) -> None:
        self.inner.stop()


class GatedRemote:
    """A worker-thread backend (like Triton) that answers only once `gate` is set."""

    def __init__(self, inner: OnnxBackend, bus: EventBus, name: str = "gated") -> None:
        self.name = name
        self.inner = inner
        self.gate = threading.Event()
        self._q: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._busy = False
        self.answered = 0
        self._bus = bus
        self._t = threading.Thread(target=self._run, daemon=True)
        self._t.start()

    def ready(self) -> bool:
        return self.inner.ready()

    def submit(self, row: Row) -> Ticket | None:
        if self._busy:
            return None
        self._busy = True
        t = Ticket(time.monotonic(), pending=True)
        self._q.put((t, row))
        return t

    def _run(self) -> None:
        while True:
            item = self._q.get()
            if item is None:
                return
            ticket, row = item
            self.gate.wait()
            r = self.inner.submit(row)
            ticket.complete(r.scores, r.error, time.monotonic())
            self.answered += 1
            self._busy = False

    def stop(self) -> None:
        self.gate.set()
        self._q.put(None)
        self.inner.stop()


class FakeGpu:
    """The ORT seam (`OnnxBackend(session_factory=...)`) on a machine without a GPU.

    A session asked for CUDA is a real onnxruntime CPU session whose `get_providers()` lists
    CUDA first, as a CUDA session's does; while `broken` is set, its runs raise the way a failed
    CUDA kernel does. Everything above the seam (provider resolution, the backend, the router)
    is the real code path. Sessions not asked for CUDA are plain CPU sessions.
    """

    CUDA = "CUDAExecutionProvider"

    def __init__(self) -> None:
        self.broken = False
        self.created: list[list[str]] = []  # the providers each session was asked for

    def __call__(self, path: str, options: Any, providers: list[str]) -> Any:
        import onnxruntime as ort

        self.created.append(list(providers))
        session = ort.InferenceSession(path, sess_options=options,
                                       providers=["CPUExecutionProvider"])
        return _FakeGpuSession(session, self) if self.CUDA in providers else session


class _FakeGpuSession:
    def __init__(self, session: Any, gpu: FakeGpu) -> None:
        self._s = session
        self._gpu = gpu

    def get_providers(self) -> list[str]:
        return [FakeGpu.CUDA, *self._s.get_providers()]

    def get_inputs(self) -> Any:
        return self._s.get_inputs()

    def get_outputs(self) -> Any:
        return self._s.get_outputs()

    def run(self, outputs: Any, feed: Any) -> Any:
        if self._gpu.broken:
            raise RuntimeError("CUDA failure 700: an illegal memory access was encountered")
        return self._s.run(outputs, feed)

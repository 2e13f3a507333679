"""`--sim` with `sim.gpu = true`: a simulated GPU at the lowest seam, the ONNX session factory.

The simulated robot (hil/sim) stands in for the arm; this stands in for the GPU on a machine
without one, so `failure.inject gpu fail`, the `gpu` probe and the `cpu_inference` mode run their
real code path end to end. A session asked for CUDAExecutionProvider is a real onnxruntime CPU
session whose `get_providers()` lists CUDA first, as a CUDA session's does; everything above the
factory — provider resolution, `OnnxBackend` (its GPU fault, the CPU fallback, the probe
inferences that bring it back), the router, the health probes — is the product's own code.
Sessions not asked for CUDA are plain CPU sessions. Nothing here runs without `--sim`.
"""

from __future__ import annotations

from typing import Any

CUDA = "CUDAExecutionProvider"


class SimGpu:
    """A session factory (`OnnxBackend(session_factory=...)`): see the module docstring."""

    def __init__(self) -> None:
        self.sessions = 0  # simulated-GPU sessions built

    def __call__(self, path: str, options: Any, providers: list[str]) -> Any:
        import onnxruntime as ort

        session = ort.InferenceSession(path, sess_options=options,
                                       providers=["CPUExecutionProvider"])
        if CUDA not in providers:
            return session
        self.sessions += 1
        return _SimGpuSession(session)


class _SimGpuSession:
    def __init__(self, session: Any) -> None:
        self._s = session

    def get_providers(self) -> list[str]:
        return [CUDA, *self._s.get_providers()]

    def get_inputs(self) -> Any:
        return self._s.get_inputs()

    def get_outputs(self) -> Any:
        return self._s.get_outputs()

    def run(self, outputs: Any, feed: Any) -> Any:
        return self._s.run(outputs, feed)

"""Execution-provider selection: what was asked for versus what a session really runs on.

onnxruntime-gpu on a machine without working CUDA *lists* CUDAExecutionProvider in
`get_available_providers()` and then silently builds a CPU session. The only trustworthy answer
is the created session's `get_providers()`; these pure helpers compare the two lists.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from edge_agent.contract.status_parts import Providers

CPU = "CPUExecutionProvider"
# Providers that place the model on an accelerator (a GPU/NPU): losing one is a degradation.
ACCELERATORS = frozenset({
    "CUDAExecutionProvider", "TensorrtExecutionProvider", "ROCMExecutionProvider",
    "MIGraphXExecutionProvider", "OpenVINOExecutionProvider", "QNNExecutionProvider",
    "CoreMLExecutionProvider", "DmlExecutionProvider",
})


@dataclass(frozen=True, slots=True)
class ProviderResolution:
    """The outcome of creating a session: requested vs. active providers."""

    requested: tuple[str, ...]
    active: tuple[str, ...]

    @property
    def accelerator_requested(self) -> bool:
        return any(p in ACCELERATORS for p in self.requested)

    @property
    def accelerator_active(self) -> bool:
        """True when the session's first provider is an accelerator (it owns the graph)."""
        return bool(self.active) and self.active[0] in ACCELERATORS

    @property
    def missing(self) -> tuple[str, ...]:
        """Requested providers the session does not use."""
        return tuple(p for p in self.requested if p not in self.active)

    @property
    def gpu_unavailable(self) -> bool:
        """An accelerator was asked for and the session runs without one."""
        return self.accelerator_requested and not self.accelerator_active

    @property
    def device(self) -> str:
        return "gpu" if self.accelerator_active else "cpu"

    def describe(self) -> str:
        return (f"requested {', '.join(self.requested) or '-'}; "
                f"session runs on {', '.join(self.active) or '-'}")

    def as_dict(self) -> Providers:
        return {"requested": list(self.requested), "active": list(self.active),
                "device": self.device, "gpu_unavailable": self.gpu_unavailable}


def resolve(requested: Sequence[str], active: Sequence[str]) -> ProviderResolution:
    """Compare the providers asked for with `session.get_providers()`."""
    return ProviderResolution(tuple(requested), tuple(active))


def session_providers(requested: Sequence[str], cpu_only: bool = False) -> list[str]:
    """The provider list to pass to InferenceSession (as configured; CPU only after a GPU fault)."""
    return [CPU] if cpu_only else list(requested)


def configure_session_options(options: Any, intra_op_threads: int) -> Any:
    """Latency-first options for a one-row policy: no thread pool, no spinning.

    The default intra-op pool spins worker threads; for a single small decision that adds ~4 ms
    to the P99 on a shared CPU. One thread, no spinning, sequential execution.
    """
    options.intra_op_num_threads = intra_op_threads
    options.inter_op_num_threads = 1
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    options.add_session_config_entry("session.inter_op.allow_spinning", "0")
    return options

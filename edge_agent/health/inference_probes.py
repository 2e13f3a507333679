"""Inference health probes: the GPU, the remote policy (Triton) and which kind of policy decides.

Built on the inference layer's own state, never beside it: the local `OnnxBackend` (its active
providers and a probe inference, `probe_gpu`), the `TritonBackend` (its readiness and the health
sample its worker takes, `request_health`), and the router's backends. Each `check` returns at
once: network calls stay on the Triton worker, session builds on a background thread.

- `gpu` → `cpu_inference`: the local model is asked to run on a GPU and does not (a GPU fault
  moved it to CPU, or the GPU never came up); a probe inference on the GPU session; NVML figures.
  Its successes are what return the session to the GPU (after `health.recover_after`).
- `triton` → `remote_policy_lost`: Triton live, ready, model ready, and a probe
  inference's round trip within `inference.deadline_ms` (the local model decides meanwhile).
- `policy:local` → `cached_policy`: the current model is unusable and the verified
  last-known-good (`cached`) decides.
- `policy:model` → `rule_policy`: no model backend can decide; the rule-based expert does.

`make_inference_probes(router, cfg)` builds them. The fast path is the monitor's
(`EventAware.fails_on`): the inference events the daemon publishes — `gpu_failed`, Triton's
`inference_backend_down`, the local model's `inference_load_failed` — fail their probe at once.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from edge_agent.health.probe import Figure, GuardedProbe, Probe, ProbeResult
from edge_agent.inference.backend import EventKind
from edge_agent.inference.gpu_stats import gpu_figures
from edge_agent.inference.onnx_backend import OnnxBackend
from edge_agent.inference.router import PolicyRouter
from edge_agent.inference.triton_backend import TritonBackend
from edge_agent.vocab import DegradationMode

if TYPE_CHECKING:
    from edge_agent.contract.events import Event

MODEL_BACKENDS = ("triton", "local", "cached")
GPU_WARN_TEMPERATURE_C = 85


class _Probe(GuardedProbe):
    """A probe of the inference stack; `fast_fail` names its event for the fast path."""

    # the inference event (type, backend) that is this probe's failure at once (fails_on)
    fast_fail: tuple[EventKind, str] | None = None

    def fails_on(self, event: Event) -> str | None:
        """The monitor's fast path (health/probe.py EventAware): this probe's event, at once."""
        if self.fast_fail is None:
            return None
        kind, backend = self.fast_fail
        if event.get("type") == kind.value and event.get("backend") == backend:
            return str(event.get("detail") or kind.value)
        return None


class GpuProbe(_Probe):
    """The local model on its GPU (see the module docstring)."""

    fast_fail = (EventKind.GPU_FAILED, "local")

    def __init__(self, local: OnnxBackend, recover_after: int,
                 nvml: Callable[[], dict[str, Any]] = gpu_figures) -> None:
        super().__init__("gpu", DegradationMode.CPU_INFERENCE)
        self._local = local
        self._recover_after = recover_after
        self._nvml = nvml

    def _check(self, now: float) -> ProbeResult:
        ok, message, figures = self._local.probe_gpu(self._recover_after)
        if ok is None:  # no GPU asked for: there is nothing to lose
            return ProbeResult.ok(message, device="cpu")
        figs: dict[str, Figure] = {k: v for k, v in figures.items()}
        figs.update(self._nvml())
        if not ok:
            return ProbeResult.error(message, **figs)
        temp = figs.get("temperature_c")
        ecc = figs.get("ecc_uncorrected")
        if isinstance(ecc, int) and ecc > 0:
            return ProbeResult.warn(f"{message}; {ecc} uncorrected ECC errors", **figs)
        if isinstance(temp, int | float) and temp >= GPU_WARN_TEMPERATURE_C:
            return ProbeResult.warn(f"{message}; GPU at {temp} °C", **figs)
        return ProbeResult.ok(message, **figs)


class RemotePolicyProbe(_Probe):
    """Triton live + ready + model ready, a probe inference within the deadline."""

    fast_fail = (EventKind.BACKEND_DOWN, "triton")

    def __init__(self, remote: TritonBackend, deadline_s: float,
                 clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__("triton", DegradationMode.REMOTE_POLICY_LOST)
        self._remote = remote
        self._deadline_s = deadline_s
        self._clock = clock
        self._judged: float | None = None  # the health sample the last check judged

    def _check(self, now: float) -> ProbeResult:
        r = self._remote
        h = r.health  # the sample the previous check asked for
        r.request_health()  # ... and the next one, taken by the worker meanwhile
        figs: dict[str, Figure] = {"url": r.url, "model": r.model_name,
                                   "deadline_ms": round(self._deadline_s * 1e3, 3)}
        if h is not None:
            figs.update(live=h.live, ready=h.ready, model_ready=h.model_ready,
                        sample_age_s=round(self._clock() - h.mono, 3),
                        latency_ms=round(h.latency_s * 1e3, 3) if h.latency_s is not None
                        else None)
        if not r.answered():  # start-up: the worker's first probe (import, connect) is pending
            return ProbeResult.ok("connecting: the first readiness probe has not answered yet",
                                  **figs)
        if not r.ready():  # the worker's own readiness (refreshed every ready period)
            return ProbeResult.error(
                f"Triton {r.url} unreachable or not ready: {r.last_error}", **figs)
        if h is None or h.mono == self._judged:  # judge each sample once, not once a check
            return ProbeResult.ok("ready; a fresh health sample is pending", **figs)
        self._judged = h.mono
        if h.error is not None:
            return ProbeResult.error(f"Triton {r.url}: {h.error}", **figs)
        if h.latency_s is not None and h.latency_s > self._deadline_s:
            return ProbeResult.error(f"probe inference took {h.latency_s * 1e3:.1f} ms > the "
                               f"{self._deadline_s * 1e3:g} ms deadline", **figs)
        return ProbeResult.ok("live, ready, model ready", **figs)


class LocalModelProbe(_Probe):
    """The current model usable; else the last-known-good decides (`cached_policy`)."""

    fast_fail = (EventKind.LOAD_FAILED, "local")

    def __init__(self, router: PolicyRouter) -> None:
        super().__init__("policy:local", DegradationMode.CACHED_POLICY)
        self._router = router

    def _check(self, now: float) -> ProbeResult:
        router = self._router
        local = router.backend("local")
        in_use, preferred = router.backend_in_use, router.preferred_ready()
        figs: dict[str, Figure] = {"backend_in_use": in_use, "preferred_ready": preferred,
                                   "local_ready": local is not None and local.ready()}
        if local is None:
            return ProbeResult.ok("no local model configured", **figs)
        if in_use == "cached" or preferred == "cached":
            why = ("the current model is not loaded" if not local.ready() else
                   "the current model's answers are unusable (errors, NaN or late)")
            return ProbeResult.error(f"{why}: the last-known-good model decides", **figs)
        if local.ready():
            return ProbeResult.ok("the current model is usable", **figs)
        if preferred == "triton":
            return ProbeResult.warn("the current model is not loaded; Triton decides", **figs)
        return ProbeResult.warn("no model usable (see policy:model)", **figs)


class ModelProbe(_Probe):
    """Some model backend can decide; else the rule-based expert does (`rule_policy`)."""

    def __init__(self, router: PolicyRouter) -> None:
        super().__init__("policy:model", DegradationMode.RULE_POLICY)
        self._router = router

    def _check(self, now: float) -> ProbeResult:
        ready = {n: b.ready() for n in MODEL_BACKENDS
                 if (b := self._router.backend(n)) is not None}
        figs: dict[str, Figure] = {f"{n}_ready": v for n, v in ready.items()}
        figs["backend_in_use"] = self._router.backend_in_use
        if any(ready.values()):
            return ProbeResult.ok(f"{next(n for n, v in ready.items() if v)} can decide", **figs)
        return ProbeResult.error("no model usable: the rule-based expert decides", **figs)


def make_inference_probes(router: PolicyRouter, cfg: Any) -> list[Probe]:
    """The inference probes for a router the inference stack built (`cfg`: the Config)."""
    probes: list[Probe] = []
    local = router.backend("local")
    if isinstance(local, OnnxBackend):
        probes.append(GpuProbe(local, cfg.health.recover_after))
    remote = router.backend("triton")
    if isinstance(remote, TritonBackend):
        probes.append(RemotePolicyProbe(remote, cfg.inference.deadline_ms / 1e3))
    probes += [LocalModelProbe(router), ModelProbe(router)]
    return probes

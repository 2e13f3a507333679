"""Inference health probes on real onnxruntime sessions and a real Triton server (pytriton).

The GPU is faked at the ORT seam only (inference_models.FakeGpu): a real CPU session that
reports CUDA and raises as a failed CUDA kernel does; everything above is the real code path.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from config_helpers import load
from inference_models import FakeGpu, make_policy, observations
from triton_server import TritonServer, serving, triton_unavailable

from edge_agent.config import Config
from edge_agent.executor.policy import ExpertPolicy
from edge_agent.health.inference_probes import (
    GpuProbe,
    LocalModelProbe,
    ModelProbe,
    RemotePolicyProbe,
    make_inference_probes,
)
from edge_agent.health.probe import EventAware, Level
from edge_agent.inference.backend import EventBus, InferenceEvent
from edge_agent.inference.onnx_backend import OnnxBackend
from edge_agent.inference.providers import CPU
from edge_agent.inference.router import PolicyRouter
from edge_agent.inference.rule_backend import RuleBackend
from edge_agent.inference.triton_backend import TritonBackend
from edge_agent.vocab import DegradationMode

CUDA = "CUDAExecutionProvider"
REASON = triton_unavailable()
needs_server = pytest.mark.skipif(REASON is not None, reason=str(REASON))


def _until(pred: Callable[[], bool], timeout: float = 30.0) -> bool:
    """Poll a condition another thread makes true (a background build, the Triton worker)."""
    pause = threading.Event()
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            return False
        pause.wait(0.01)
    return True


@pytest.fixture
def cfg(tmp_path: Path) -> Config:
    (tmp_path / "state").mkdir()
    return load(tmp_path, {"health": {"recover_after": "3"}, "inference": {"deadline_ms": "50"}})


def _fast_fails(probes: dict[str, Any], events: list[InferenceEvent]) -> list[tuple[str, str]]:
    """What the monitor's event tap would fail at once: (probe, message) per published event
    (the daemon publishes each inference event's as_dict())."""
    return [(name, why) for ev in events for name, p in probes.items()
            if (why := p.fails_on(ev.as_dict()))]


def _router(local: OnnxBackend, cached: OnnxBackend, bus: EventBus,
            remote: TritonBackend | None = None) -> PolicyRouter:
    backends: list[Any] = [remote] if remote is not None else []
    return PolicyRouter([*backends, local, cached, RuleBackend(ExpertPolicy())], bus,
                        deadline_s=0.5)


def test_gpu_probe_degrades_on_a_gpu_fault_and_brings_the_gpu_back(tmp_path: Path,
                                                                    cfg: Config) -> None:
    events: list[InferenceEvent] = []
    gpu, bus = FakeGpu(), EventBus(events.append)
    model = make_policy(tmp_path)
    local = OnnxBackend("local", model, [CUDA, CPU], bus, session_factory=gpu)
    cached = OnnxBackend("cached", model, [CPU], bus)
    assert local.load() and cached.load()
    router = _router(local, cached, bus)
    probes: dict[str, Any] = {p.name: p for p in make_inference_probes(router, cfg)}
    assert all(isinstance(p, EventAware) for p in probes.values())
    assert set(probes) == {"gpu", "policy:local", "policy:model"}
    probe = probes["gpu"]
    assert probe.mode is DegradationMode.CPU_INFERENCE and probe.period_s is None
    r = probe.check(time.monotonic())
    assert r.level is Level.OK and r.figures["device"] == "gpu", r
    assert "gpu" in r.figures  # NVML's answer (here: none, and why)
    gpu.broken = True
    assert router.decide(observations(1)[0]) is not None  # falls through: nothing dropped
    fast = _fast_fails(probes, events)  # the fast path: gpu_failed fails `gpu` at once
    assert [n for n, _ in fast] == ["gpu"] and "CUDA failure" in fast[0][1]
    assert local.wait_ready(30.0) and not local.on_gpu
    for _ in range(3):  # the GPU is still broken: every check fails
        assert probe.check(time.monotonic()).failed
    gpu.broken = False
    assert _until(lambda: probe.check(time.monotonic()).level is Level.OK)
    assert not local.on_gpu  # one good probe: not yet
    assert probe.check(time.monotonic()).level is Level.OK and not local.on_gpu
    r = probe.check(time.monotonic())
    assert r.level is Level.OK and local.on_gpu and "back on the GPU" in r.message
    assert router.decide(observations(1)[0]) is not None and router.backend_in_use == "local"


def test_gpu_probe_without_a_gpu_says_so(tmp_path: Path) -> None:
    bus = EventBus()
    cpu = OnnxBackend("local", make_policy(tmp_path), [CPU], bus)
    assert cpu.load()
    r = GpuProbe(cpu, 3).check(0.0)
    assert r.level is Level.OK and r.message == "no GPU provider configured"
    real = OnnxBackend("local", make_policy(tmp_path), [CUDA, CPU], bus)  # real onnxruntime
    assert real.load()
    if real.on_gpu:
        pytest.skip("this machine has a working CUDA provider")
    r = GpuProbe(real, 3).check(0.0)
    assert r.failed and r.message.startswith("no GPU: requested CUDAExecutionProvider")
    assert r.figures["gpu"] == "none" and r.figures["why"]  # NVML: no driver here


def test_policy_probes_say_which_kind_of_policy_decides(tmp_path: Path) -> None:
    bus = EventBus()
    local = OnnxBackend("local", make_policy(tmp_path, "broken", nan=True), [CPU], bus)
    cached = OnnxBackend("cached", make_policy(tmp_path, "good"), [CPU], bus)
    assert local.load() and cached.load()
    router = _router(local, cached, bus)
    cached_probe, rule_probe = LocalModelProbe(router), ModelProbe(router)
    assert cached_probe.mode is DegradationMode.CACHED_POLICY
    assert rule_probe.mode is DegradationMode.RULE_POLICY
    assert router.decide(observations(1)[0]) is not None
    assert router.backend_in_use == "cached"  # the current model answers NaN
    r = cached_probe.check(0.0)
    assert r.failed and "unusable" in r.message and r.figures["backend_in_use"] == "cached"
    assert rule_probe.check(0.0).level is Level.OK
    local.stop()
    r = cached_probe.check(0.0)
    assert r.failed and "not loaded" in r.message
    cached.stop()
    assert router.decide(observations(1)[0]) is not None and router.backend_in_use == "rule"
    r = rule_probe.check(0.0)
    assert r.failed and "rule-based expert decides" in r.message
    assert cached_probe.check(0.0).level is Level.WARN  # rule_policy covers it


def test_a_healthy_current_model_is_ok(tmp_path: Path) -> None:
    bus = EventBus()
    model = make_policy(tmp_path)
    local, cached = OnnxBackend("local", model, [CPU], bus), OnnxBackend("cached", model, [CPU],
                                                                          bus)
    assert local.load() and cached.load()
    router = _router(local, cached, bus)
    router.decide(observations(1)[0])
    assert LocalModelProbe(router).check(0.0).level is Level.OK
    assert ModelProbe(router).check(0.0).level is Level.OK


@pytest.fixture(scope="module")
def triton(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TritonServer]:
    if REASON is not None:
        pytest.skip(REASON)
    model = make_policy(tmp_path_factory.mktemp("probe-model"), "policy", seed=21)
    with serving(model, tmp_path_factory.mktemp("probe-triton") / "triton.log") as s:
        yield s


@needs_server
def test_remote_policy_probe_against_a_real_triton(triton: TritonServer, tmp_path: Path,
                                                   cfg: Config) -> None:
    events: list[InferenceEvent] = []
    bus = EventBus(events.append)
    model = make_policy(tmp_path)
    remote = TritonBackend("triton", triton.url, "policy", bus, request_timeout_s=0.5,
                           ready_period_s=0.2)
    local, cached = OnnxBackend("local", model, [CPU], bus), OnnxBackend("cached", model, [CPU],
                                                                          bus)
    assert local.load() and cached.load()
    router = _router(local, cached, bus, remote)
    probes: dict[str, Any] = {p.name: p for p in make_inference_probes(router, cfg)}
    assert isinstance(probes["triton"], RemotePolicyProbe)
    assert probes["triton"].mode is DegradationMode.REMOTE_POLICY_LOST
    # the checks below against 150 ms (the config caps deadline_ms at the 50 ms decision
    # period; a loaded test machine needs the margin)
    probe = RemotePolicyProbe(remote, 0.15)
    r = probe.check(time.monotonic())  # before the worker's first readiness probe: no fault yet
    assert r.level is Level.OK and r.message.startswith("connecting"), r
    remote.start()
    try:
        assert remote.wait_ready(60.0)
        assert probe.check(time.monotonic()).level is Level.OK  # asks for the first sample
        assert _until(lambda: remote.health is not None)
        r = probe.check(time.monotonic())
        assert r.level is Level.OK and r.message == "live, ready, model ready", r
        assert r.figures["live"] and r.figures["model_ready"]
        latency = r.figures["latency_ms"]
        assert isinstance(latency, float) and 0 < latency < 150.0
        # slower than inference.deadline_ms (150 ms): the router would not use it
        triton.set_delay_ms(300)
        results: list[Any] = []
        assert _until(lambda: results.append(probe.check(time.monotonic())) or
                      results[-1].failed, 60.0)  # each check judges the newest sample once
        r = results[-1]
        assert "> the 150 ms deadline" in r.message, r
        again = probe.check(time.monotonic())  # the next sample needs 2 x 300 ms: not yet
        assert again.level is Level.OK and "fresh health sample is pending" in again.message
        triton.set_delay_ms(0)
        # the server dies: the worker's readiness fails at once, and the fast path fires
        triton.stop(graceful=False)
        assert _until(lambda: not remote.ready())
        r = probe.check(time.monotonic())
        assert r.failed and "unreachable or not ready" in r.message
        assert "triton" in [n for n, _ in _fast_fails(probes, events)]
        triton.start()
        assert remote.wait_ready(60.0)
        assert _until(lambda: probe.check(time.monotonic()).level is Level.OK)
    finally:
        triton.set_delay_ms(0)
        router.stop()

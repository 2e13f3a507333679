"""The local onnxruntime backend: lazy load + warm-up, real providers, GPU fault → CPU session."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from inference_models import FakeGpu, bare_scores, bare_session, make_policy, observations

from edge_agent.inference.backend import EventBus, EventKind, InferenceEvent
from edge_agent.inference.onnx_backend import OnnxBackend
from edge_agent.inference.providers import CPU, resolve, session_providers

CUDA = "CUDAExecutionProvider"


def _backend(model: Path, providers: list[str], events: list[InferenceEvent],
             **kw: object) -> OnnxBackend:
    return OnnxBackend("local", model, providers, EventBus(events.append), **kw)  # type: ignore[arg-type]


def test_session_is_created_only_by_load_and_warmed_up(tmp_path: Path) -> None:
    events: list[InferenceEvent] = []
    b = _backend(make_policy(tmp_path), [CPU], events)
    assert not b.ready()
    assert b.submit(observations(1)[0].vector).error == "not loaded"
    assert events == []
    t = b.load_in_background()
    assert b.wait_ready(30.0)
    t.join(30.0)
    assert [e.kind for e in events] == [EventKind.BACKEND_UP]
    assert b.status()["load_ms"] is not None and b.runs == 0  # warm-up runs are not decisions


def test_scores_equal_a_bare_session_on_the_same_model(tmp_path: Path) -> None:
    model = make_policy(tmp_path, seed=3)
    b = _backend(model, [CPU], [])
    assert b.load()
    bare = bare_session(model)
    for obs in observations(50):
        t = b.submit(obs.vector)
        assert t.done and t.error is None
        assert t.scores == pytest.approx(bare_scores(bare, obs), abs=1e-6)


def test_cuda_requested_without_a_gpu_is_reported_from_get_providers(tmp_path: Path) -> None:
    import onnxruntime as ort

    events: list[InferenceEvent] = []
    b = _backend(make_policy(tmp_path), [CUDA, CPU], events)
    assert b.load()
    assert b.resolution is not None
    if CUDA in b.resolution.active:  # a machine with working CUDA: nothing to report
        pytest.skip("this machine has a working CUDA provider")
    # what onnxruntime *lists* is not what runs: the session decides
    print("available:", ort.get_available_providers(), "active:", b.resolution.active)
    assert b.resolution.active == (CPU,) and b.resolution.gpu_unavailable
    kinds = [e.kind for e in events]
    assert kinds == [EventKind.GPU_UNAVAILABLE, EventKind.BACKEND_UP]
    assert "session runs on CPUExecutionProvider" in events[0].detail


def test_provider_resolution_is_decided_by_the_session_list() -> None:
    r = resolve([CUDA, CPU], [CPU])
    assert r.gpu_unavailable and r.missing == (CUDA,) and r.device == "cpu"
    r = resolve([CUDA, CPU], [CUDA, CPU])
    assert not r.gpu_unavailable and r.device == "gpu" and r.accelerator_active
    r = resolve([CPU], [CPU])
    assert not r.gpu_unavailable and not r.accelerator_requested
    assert session_providers([CUDA, CPU], cpu_only=True) == [CPU]
    assert session_providers([CUDA, CPU]) == [CUDA, CPU]


def test_gpu_fault_recreates_the_session_on_cpu(tmp_path: Path) -> None:
    events: list[InferenceEvent] = []
    model = make_policy(tmp_path)
    gpu = FakeGpu()
    b = _backend(model, [CUDA, CPU], events, session_factory=gpu)
    assert b.load() and b.on_gpu
    obs = observations(1)[0]
    gpu.broken = True  # the GPU fails under a running session (at the ORT seam)
    t = b.submit(obs.vector)
    assert t.error is not None and "CUDA failure" in t.error
    assert EventKind.GPU_FAILED in [e.kind for e in events]
    assert b.wait_ready(30.0)
    assert b.resolution is not None and b.resolution.requested == (CPU,) and not b.on_gpu
    assert b.status()["cpu_only_after_gpu_fault"] is True
    assert gpu.created == [[CUDA, CPU], [CPU]]
    assert EventKind.GPU_UNAVAILABLE not in [e.kind for e in events]  # CPU on purpose
    t = b.submit(obs.vector)
    assert t.error is None and t.scores == pytest.approx(bare_scores(bare_session(model), obs),
                                                         abs=1e-6)


def _until(pred: Callable[[], bool], timeout: float = 30.0) -> bool:
    """Poll a condition another thread makes true (a background session build)."""
    done = threading.Event()
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            return False
        done.wait(0.01)
    return True


def test_the_gpu_probe_brings_the_session_back_after_recover_after_successes(
        tmp_path: Path) -> None:
    """Today's fix: a GPU fault no longer pins the CPU for the process's life."""
    events: list[InferenceEvent] = []
    model = make_policy(tmp_path)
    gpu = FakeGpu()
    b = _backend(model, [CUDA, CPU], events, session_factory=gpu)
    assert b.load()
    ok, msg, figs = b.probe_gpu(3)
    assert ok is True and figs["device"] == "gpu" and figs["probe_ms"] >= 0
    gpu.broken = True
    ok, msg, _ = b.probe_gpu(3)  # the probe itself finds the fault: CPU rebuild
    assert ok is False and "CUDA failure" in msg
    assert b.wait_ready(30.0) and not b.on_gpu
    assert b.probe_gpu(3)[0] is False  # starts building a GPU probe session: it fails
    assert _until(lambda: len(gpu.created) >= 3 and not b.probe_gpu(3)[0] and
                  len(gpu.created) >= 4)  # still broken: every build fails
    gpu.broken = False
    assert _until(lambda: b.probe_gpu(3)[0] is True)  # built, answered: 1 of 3
    ok, msg, figs = b.probe_gpu(3)
    assert ok and figs["successes"] == 2 and not b.on_gpu and "2/3" in msg
    ok, msg, figs = b.probe_gpu(3)
    assert ok and b.on_gpu and "back on the GPU" in msg and figs["device"] == "gpu"
    assert events[-1].kind is EventKind.BACKEND_UP and "back on the GPU" in events[-1].detail
    assert b.status()["cpu_only_after_gpu_fault"] is False
    obs = observations(1)[0]
    t = b.submit(obs.vector)
    assert t.error is None and t.scores == pytest.approx(bare_scores(bare_session(model), obs),
                                                         abs=1e-6)


def test_an_injected_gpu_fault_lasts_its_duration_then_the_gpu_comes_back(
        tmp_path: Path) -> None:
    now = [100.0]
    events: list[InferenceEvent] = []
    b = _backend(make_policy(tmp_path), [CUDA, CPU], events, session_factory=FakeGpu(),
                 clock=lambda: now[0])
    assert b.load() and b.on_gpu
    assert "10 s" in b.inject_gpu_fault(10.0)
    assert "injected GPU fault" in (b.submit(observations(1)[0].vector).error or "")
    assert b.wait_ready(30.0) and not b.on_gpu  # the CPU session answers meanwhile
    assert b.submit(observations(1)[0].vector).error is None
    assert b.probe_gpu(2)[0] is False
    now[0] = 105.0  # still injected: the probe session's warm-up raises at the seam
    assert _until(lambda: not b.probe_gpu(2)[0] and not b.status()["on_gpu"])
    now[0] = 110.5
    assert _until(lambda: b.probe_gpu(2)[0] is True)
    assert b.probe_gpu(2)[0] is True and b.on_gpu


def test_a_gpu_fault_is_refused_where_no_session_runs_on_a_gpu(tmp_path: Path) -> None:
    cpu = _backend(make_policy(tmp_path), [CPU], [])
    assert cpu.load()
    with pytest.raises(ValueError, match="asks for no GPU"):
        cpu.inject_gpu_fault(5.0)
    assert cpu.probe_gpu(3) == (None, "no GPU provider configured", {})
    real = _backend(make_policy(tmp_path), [CUDA, CPU], [])  # real onnxruntime, no CUDA here
    assert real.load()
    if real.on_gpu:
        pytest.skip("this machine has a working CUDA provider")
    with pytest.raises(ValueError, match="no session of this backend runs on a GPU"):
        real.inject_gpu_fault(5.0)
    ok, msg, _ = real.probe_gpu(3)
    assert ok is False and msg.startswith("no GPU: requested CUDAExecutionProvider")


def test_a_run_error_on_cpu_is_one_failed_attempt_not_a_reload(tmp_path: Path) -> None:
    events: list[InferenceEvent] = []
    b = _backend(make_policy(tmp_path), [CPU], events)
    assert b.load()
    t = b.submit((1.0, 2.0, 3.0))  # wrong width: onnxruntime itself raises
    assert t.error is not None and "INVALID_ARGUMENT" in t.error.upper()
    assert b.ready() and b.failures == 1
    assert [e.kind for e in events] == [EventKind.BACKEND_UP]


def test_a_model_of_the_wrong_width_fails_to_load(tmp_path: Path) -> None:
    events: list[InferenceEvent] = []
    b = _backend(make_policy(tmp_path), [CPU], events, obs_dim=7)
    assert not b.load() and not b.ready()
    assert [e.kind for e in events] == [EventKind.LOAD_FAILED]
    assert "7" in events[0].detail


def test_missing_or_broken_model_fails_to_load(tmp_path: Path) -> None:
    events: list[InferenceEvent] = []
    junk = tmp_path / "junk.onnx"
    junk.write_bytes(b"not a model")
    assert not _backend(junk, [CPU], events).load()
    assert not _backend(tmp_path / "absent.onnx", [CPU], events).load()
    assert [e.kind for e in events] == [EventKind.LOAD_FAILED] * 2


def test_stop_is_idempotent_and_blocks_a_late_load(tmp_path: Path) -> None:
    b = _backend(make_policy(tmp_path), [CPU], [])
    b.stop()
    b.stop()
    assert not b.load() and not b.ready()


def test_concurrent_loads_leave_one_working_session(tmp_path: Path) -> None:
    b = _backend(make_policy(tmp_path), [CPU], [])
    threads = [threading.Thread(target=b.load) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30.0)
    assert b.ready() and b.submit(observations(1)[0].vector).error is None


def test_a_gpu_fault_mid_task_drops_no_decision(tmp_path: Path) -> None:
    from edge_agent.inference.assembly import InferenceSettings, InferenceStack
    from edge_agent.inference.backend import DecisionRecord

    events: list[InferenceEvent] = []
    records: list[DecisionRecord] = []
    stack = InferenceStack(InferenceSettings(providers=(CUDA, CPU), model=make_policy(tmp_path),
                                             cache_dir=tmp_path / "state" / "models"),
                           event_sink=events.append, decision_sink=records.append,
                           session_factory=FakeGpu())
    stack.start_background().join(60.0)
    assert stack.router.ready() and stack.load_s is not None
    obs = observations(40)
    for o in obs[:10]:
        assert stack.router.decide(o) is not None
    assert stack.inject("gpu", "fail", 60.0)["effect"] == "runs on the GPU raise for 60 s"
    for o in obs[10:30]:  # the CPU session is being rebuilt meanwhile
        assert stack.router.decide(o) is not None
    assert records[10].attempts[0] == ("local", "error") and records[10].backend == "cached"
    assert stack.local.wait_ready(30.0)
    for o in obs[30:]:
        assert stack.router.decide(o) is not None
    assert records[-1].backend == "local" and stack.router.no_decisions == 0
    kinds = [e.kind for e in events]
    assert EventKind.GPU_FAILED in kinds and EventKind.FALLBACK in kinds
    assert stack.status()["backends"][0]["cpu_only_after_gpu_fault"] is True
    with pytest.raises(ValueError, match="no Triton server is configured"):
        stack.inject("triton", "down", 5.0)
    stack.stop()

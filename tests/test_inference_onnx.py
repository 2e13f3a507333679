"""The local onnxruntime backend: lazy load + warm-up, real providers, GPU fault → CPU session."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
from inference_models import bare_scores, bare_session, make_policy, observations

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
    b = _backend(model, [CUDA, CPU], events)
    assert b.load()
    obs = observations(1)[0]
    b.inject_gpu_fault()
    t = b.submit(obs.vector)
    assert t.error is not None and "GPU fault" in t.error
    assert EventKind.GPU_FAILED in [e.kind for e in events]
    assert b.wait_ready(30.0)
    assert b.resolution is not None and b.resolution.requested == (CPU,)
    assert b.status()["cpu_only_after_gpu_fault"] is True
    # no gpu_unavailable for the deliberate CPU session, and it answers like before
    assert [e.kind for e in events].count(EventKind.GPU_UNAVAILABLE) == 1
    t = b.submit(obs.vector)
    assert t.error is None and t.scores == pytest.approx(bare_scores(bare_session(model), obs),
                                                         abs=1e-6)


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
                           event_sink=events.append, decision_sink=records.append)
    stack.start_background().join(60.0)
    assert stack.router.ready() and stack.load_s is not None
    obs = observations(40)
    for o in obs[:10]:
        assert stack.router.decide(o) is not None
    stack.local.inject_gpu_fault()
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
    stack.stop()

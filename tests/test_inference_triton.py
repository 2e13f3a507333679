"""The remote backend against a real Triton server (nvidia-pytriton on CPU), and the model repo.

Skipped, with the reason, where pytriton or tritonclient cannot run (see triton_server.py).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from inference_models import bare_scores, bare_session, make_policy, observations
from triton_server import TritonServer, serving, triton_unavailable

from edge_agent.inference.backend import DecisionRecord, EventBus, EventKind, InferenceEvent
from edge_agent.inference.onnx_backend import OnnxBackend
from edge_agent.inference.router import PolicyRouter
from edge_agent.inference.triton_backend import DEADLINE_MISSES_DOWN, TritonBackend
from edge_agent.policy_seam import OBS_DIM, Action, action_from_scores

ROOT = Path(__file__).resolve().parents[1]
REASON = triton_unavailable()
needs_server = pytest.mark.skipif(REASON is not None, reason=str(REASON))
try:
    import tritonclient.grpc  # noqa: F401

    CLIENT = None
except ImportError as e:
    CLIENT = f"tritonclient[grpc] is not installed ({e})"
needs_client = pytest.mark.skipif(CLIENT is not None, reason=str(CLIENT))
DECISION_PERIOD_S = 0.05  # the executor's 20 Hz


class Rig:
    def __init__(self, url: str, model: Path, deadline_s: float = 0.5) -> None:
        self.events: list[InferenceEvent] = []
        self.records: list[DecisionRecord] = []
        self.bus = EventBus(self.events.append)
        self.remote = TritonBackend("triton", url, "policy", self.bus,
                                    request_timeout_s=deadline_s, ready_period_s=0.2)
        self.local = OnnxBackend("cached", model, ["CPUExecutionProvider"], self.bus)
        assert self.local.load()
        self.router = PolicyRouter([self.remote, self.local], self.bus, deadline_s=deadline_s,
                                   decision_sink=self.records.append)
        self.remote.start()
        self.obs = iter(observations(100_000, seed=11))

    def decide_until(self, predicate: object, timeout: float) -> None:
        """Decide at the executor's rate until predicate() holds (every decision counts)."""
        deadline = time.monotonic() + timeout
        while not predicate():  # type: ignore[operator]
            assert time.monotonic() < deadline, f"timed out; last: {self.records[-3:]}"
            self.router.decide(next(self.obs))
            time.sleep(DECISION_PERIOD_S)  # the decision rate, not synchronisation

    def stop(self) -> None:
        self.router.stop()


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_policy(tmp_path_factory.mktemp("triton-model"), "policy", seed=21)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, model: Path) -> Iterator[TritonServer]:
    """One server for the module (~5 s to start); a test that stops it starts it again."""
    with serving(model, tmp_path_factory.mktemp("triton") / "triton.log") as s:
        yield s


@needs_server
def test_triton_decisions_match_the_local_session(server: TritonServer, model: Path) -> None:
    rig = Rig(server.url, model)
    try:
        assert rig.remote.wait_ready(30.0), rig.remote.status()
        bare = bare_session(model)
        obs = observations(60, seed=4)
        for o in obs:
            t = rig.remote.submit(o.vector)
            assert t is not None and t.wait(5.0) and t.error is None
            assert t.scores == pytest.approx(bare_scores(bare, o), abs=1e-5)
        got = [rig.router.decide(o) for o in obs]
        assert got == [action_from_scores(bare_scores(bare, o)) for o in obs]
        assert {r.backend for r in rig.records} == {"triton"}
        assert rig.router.backend_in_use == "triton"
    finally:
        rig.stop()


@needs_server
def test_server_loss_falls_back_without_dropping_and_recovery_switches_back(
        server: TritonServer, model: Path) -> None:
    rig = Rig(server.url, model)
    try:
        assert rig.remote.wait_ready(30.0)
        rig.decide_until(lambda: len(rig.records) >= 5, 30.0)
        assert {r.backend for r in rig.records} == {"triton"}
        server.stop(graceful=False)  # SIGKILL: the server is gone at once
        n = len(rig.records)
        rig.decide_until(lambda: len(rig.records) >= n + 10, 60.0)
        after = rig.records[n:]
        assert all(r.action is not None for r in after)  # no decision dropped
        assert after[-1].backend == "cached" and rig.router.backend_in_use == "cached"
        kinds = [e.kind for e in rig.events]
        assert EventKind.BACKEND_DOWN in kinds and EventKind.FALLBACK in kinds
        server.start()  # same ports
        m = len(rig.records)
        rig.decide_until(lambda: rig.router.backend_in_use == "triton", 60.0)
        assert all(r.action is not None for r in rig.records[m:])
        assert rig.router.no_decisions == 0
        assert [e.kind for e in rig.events].count(EventKind.BACKEND_UP) >= 2
    finally:
        rig.stop()


@needs_server
def test_a_slow_server_misses_the_deadline_and_the_local_model_decides(
        server: TritonServer, model: Path) -> None:
    server.wait_ready(60.0)
    rig = Rig(server.url, model, deadline_s=0.1)
    try:
        assert rig.remote.wait_ready(30.0)
        server.set_delay_ms(400)
        o = observations(1, seed=2)[0]
        assert rig.router.decide(o) == action_from_scores(bare_scores(bare_session(model), o))
        # The router's own deadline and the gRPC client's timeout race on a loaded machine:
        # the late remote answer is seen as a missed deadline or as the client's
        # DEADLINE_EXCEEDED error. Either way the same decision falls through, none is dropped.
        (remote, why), last = rig.records[-1].attempts[0], rig.records[-1].attempts[-1]
        assert remote == "triton" and why in ("deadline", "error"), rig.records[-1].attempts
        assert last == ("cached", "ok")
    finally:
        server.set_delay_ms(0)
        rig.stop()


@needs_server
def test_one_late_answer_is_not_an_outage_a_hung_server_is(server: TritonServer,
                                                          model: Path) -> None:
    """A deadline miss fails that decision only; DEADLINE_MISSES_DOWN in a row take it down."""
    server.wait_ready(60.0)
    rig = Rig(server.url, model, deadline_s=0.1)
    try:
        assert rig.remote.wait_ready(30.0)
        rig.decide_until(lambda: rig.router.backend_in_use == "triton", 30.0)
        n_events = len(rig.events)
        server.set_delay_ms(300)  # every answer now comes after the 100 ms deadline

        def downs() -> list[str]:
            return [e.detail for e in rig.events[n_events:] if e.kind is EventKind.BACKEND_DOWN]

        rig.decide_until(lambda: downs(), 30.0)
        assert rig.remote.deadline_misses >= DEADLINE_MISSES_DOWN
        assert f"{DEADLINE_MISSES_DOWN} requests in a row over the 100 ms deadline" in downs()[0]
        server.set_delay_ms(0)
        rig.decide_until(lambda: rig.router.backend_in_use == "triton", 60.0)
        assert rig.router.no_decisions == 0
    finally:
        server.set_delay_ms(0)
        rig.stop()


@needs_server
def test_an_injected_outage_takes_the_path_of_a_real_one(server: TritonServer,
                                                         model: Path) -> None:
    server.wait_ready(60.0)
    rig = Rig(server.url, model)
    try:
        assert rig.remote.wait_ready(30.0)
        rig.decide_until(lambda: rig.router.backend_in_use == "triton", 30.0)
        rig.remote.inject_outage(1.0)
        rig.decide_until(lambda: rig.router.backend_in_use == "cached", 30.0)
        rig.decide_until(lambda: rig.router.backend_in_use == "triton", 30.0)
        assert rig.router.no_decisions == 0
        assert "injected outage" in " ".join(e.detail for e in rig.events
                                             if e.kind is EventKind.BACKEND_DOWN)
    finally:
        rig.stop()


@needs_client
def test_an_unreachable_server_is_down_and_skipped(tmp_path: Path, model: Path) -> None:
    import socket

    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    rig = Rig(f"127.0.0.1:{port}", model)
    try:
        assert rig.bus.wait_until(lambda: EventKind.BACKEND_DOWN in
                                  [e.kind for e in rig.events], 30.0)
        assert not rig.remote.ready()
        rig.router.decide(observations(1)[0])
        assert rig.records[-1].attempts == (("triton", "not_ready"), ("cached", "ok"))
    finally:
        rig.stop()
    rig.stop()  # idempotent


@needs_client
def test_the_production_model_repository_matches_the_executor() -> None:
    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2 as mc

    text = (ROOT / "models" / "triton" / "policy" / "config.pbtxt").read_text()
    cfg = text_format.Parse(text, mc.ModelConfig())
    assert cfg.name == "policy" and cfg.backend == "onnxruntime"
    assert cfg.max_batch_size >= 1
    (x,), (y,) = cfg.input, cfg.output
    assert (x.name, x.data_type, list(x.dims)) == ("obs", mc.TYPE_FP32, [OBS_DIM])
    assert (y.name, y.data_type, list(y.dims)) == ("scores", mc.TYPE_FP32, [len(Action)])
    assert cfg.HasField("dynamic_batching")
    assert 0 < cfg.dynamic_batching.max_queue_delay_microseconds <= 500
    assert (ROOT / "models" / "triton" / "policy" / "1").is_dir()


@needs_server
def test_the_daemon_runs_a_task_on_triton_and_keeps_deciding_when_the_server_dies(
        tmp_path: Path) -> None:
    """The whole daemon (--sim) with the trained policy served by Triton first: the task's
    decisions come from Triton; the server is killed mid-task and the task still succeeds on
    the local session with no dropped decision, the health monitor enters `remote_policy_lost`
    (event, `state.degraded`); after a restart Triton decides again and the mode is left."""
    from daemon_proc import DaemonProc
    from mosquitto import wait_until

    trained = ROOT / "models" / "pick-place-policy.onnx"
    server = TritonServer(trained, tmp_path / "triton.log")
    server.start()
    d = DaemonProc(tmp_path, None, extra=(f"inference.triton_url={server.url}",
                                          f"inference.model={trained}",
                                          "health.period_s=0.2")).start()
    try:
        server.wait_ready(60.0)
        d.wait_ready()

        def inference() -> dict[str, Any]:
            return dict(d.socket_cmd("status")["result"]["inference"] or {})

        def mode_events(kind: str) -> list[dict[str, Any]]:
            return [e for e in d.events("event") if e.get("type") == kind
                    and e.get("mode") == "remote_policy_lost"]

        def degraded() -> list[str]:
            return list(d.socket_cmd("status")["result"]["degraded"])

        wait_until(lambda: inference().get("preferred_ready") == "triton", 60, "triton ready")
        r = d.socket_cmd("task.start", {"task": "pick_place"})
        assert r["ok"], r
        # the first requests may miss the deadline (the server's first run): wait for Triton
        wait_until(lambda: inference().get("backend_in_use") == "triton"
                   and inference().get("decisions", 0) >= 20, 60, "20 decisions, from Triton")
        server.stop(graceful=False)  # SIGKILL mid-task
        wait_until(lambda: "remote_policy_lost" in degraded(), 30, "remote_policy_lost held")
        assert mode_events("degraded"), d.events("event")[-5:]
        wait_until(lambda: bool([e for e in d.events("event") if e.get("type") == "task_done"]),
                   90, "the task ends")
        done = next(e for e in d.events("event") if e.get("type") == "task_done")
        assert done["outcome"] == "success", done
        inf = inference()
        assert inf["backend_in_use"] == "local" and inf["no_decisions"] == 0, inf
        assert inf["fallbacks"] >= 1
        server.start()  # same ports
        server.wait_ready(60.0)
        wait_until(lambda: inference().get("preferred_ready") == "triton", 60, "triton back")
        wait_until(lambda: "remote_policy_lost" not in degraded(), 30, "the mode left")
        assert mode_events("recovered")
        assert d.socket_cmd("task.start", {"task": "pick_place"})["ok"]
        wait_until(lambda: inference().get("backend_in_use") == "triton", 60, "decisions again")
    finally:
        d.stop()
        server.stop(graceful=False)  # its ~4 s graceful shutdown is not under test


@needs_server
def test_failure_inject_triton_down_and_gpu_fail_on_the_daemon(tmp_path: Path) -> None:
    """failure.inject over the daemon's control socket: `triton down` makes the real Triton
    client see the server unreachable for duration_s (the local model is preferred meanwhile,
    Triton again after; the health monitor enters `remote_policy_lost` and leaves it); `gpu
    fail` on a CPU-only configuration is refused and says why."""
    from daemon_proc import DaemonProc
    from mosquitto import wait_until

    trained = ROOT / "models" / "pick-place-policy.onnx"
    server = TritonServer(trained, tmp_path / "triton.log")
    server.start()
    d = DaemonProc(tmp_path, None, extra=(f"inference.triton_url={server.url}",
                                          f"inference.model={trained}",
                                          "health.period_s=0.2")).start()
    try:
        server.wait_ready(60.0)
        d.wait_ready()

        def mode_events(kind: str) -> list[dict[str, Any]]:
            return [e for e in d.events("event") if e.get("type") == kind
                    and e.get("mode") == "remote_policy_lost"]

        def preferred() -> Any:
            return (d.socket_cmd("status")["result"]["inference"] or {}).get("preferred_ready")

        def triton_ready(within: float, what: str) -> None:
            try:
                wait_until(lambda: preferred() == "triton", within, what, interval=0.1)
            except AssertionError as e:  # a CI failure says what the backend saw
                st = d.socket_cmd("status")["result"]
                raise AssertionError(f"{e}\nbackends: {(st['inference'] or {}).get('backends')}"
                                     f"\nstart-up: {st.get('background')}\n"
                                     f"triton log:\n{server.log_tail()}") from None

        triton_ready(60, "triton ready")
        r = d.socket_cmd("failure.inject", {"target": "triton", "mode": "down"})
        assert not r["ok"] and "needs duration_s" in r["error"]["message"], r
        r = d.socket_cmd("failure.inject", {"target": "triton", "mode": "down",
                                            "duration_s": 3.0})
        assert r["ok"], r
        assert r["result"]["injected"]["effect"] == f"{server.url} unreachable for 3 s"
        wait_until(lambda: preferred() == "local", 30, "the local model preferred")
        wait_until(lambda: bool(mode_events("degraded")), 30, "remote_policy_lost entered")
        # (the cause: the outage — or, on a loaded machine, a probe inference over the
        # 20 ms deadline just before it; either is the remote policy lost)
        assert any("injected outage" in e["cause"] or "deadline" in e["cause"]
                   for e in mode_events("degraded")), mode_events("degraded")
        triton_ready(60, "triton back after 3 s")
        wait_until(lambda: bool(mode_events("recovered")), 30, "remote_policy_lost left")
        r = d.socket_cmd("failure.inject", {"target": "gpu", "mode": "fail", "duration_s": 5})
        assert not r["ok"] and r["error"]["code"] == "refused", r
        assert "asks for no GPU" in r["error"]["message"]
    finally:
        d.stop()
        server.stop(graceful=False)  # its ~4 s graceful shutdown is not under test


class _HugeReplies:
    """A real gRPC server speaking Triton's protocol (tritonclient's own service definition):
    ready, and every ModelInfer answered with `reply_bytes` of scores."""

    def __init__(self, reply_bytes: int) -> None:
        from concurrent import futures

        import grpc
        import tritonclient.grpc.service_pb2 as pb
        import tritonclient.grpc.service_pb2_grpc as svc

        floats = reply_bytes // 4
        raw = bytes(floats * 4)
        self.infers = 0
        outer = self

        class Servicer(svc.GRPCInferenceServiceServicer):  # type: ignore[misc]
            def ServerReady(self, request: Any, context: Any) -> Any:
                return pb.ServerReadyResponse(ready=True)

            def ModelReady(self, request: Any, context: Any) -> Any:
                return pb.ModelReadyResponse(ready=True)

            def ModelInfer(self, request: Any, context: Any) -> Any:
                outer.infers += 1
                out = pb.ModelInferResponse.InferOutputTensor(name="scores", datatype="FP32",
                                                              shape=[1, floats])
                return pb.ModelInferResponse(model_name="policy", outputs=[out],
                                             raw_output_contents=[raw])

        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        svc.add_GRPCInferenceServiceServicer_to_server(Servicer(), self.server)
        self.port = self.server.add_insecure_port("127.0.0.1:0")
        self.server.start()


@needs_client
def test_a_reply_over_the_bound_fails_the_request_unread(model: Path) -> None:
    """2 MiB of scores (gRPC's default limit is 4 MiB, tritonclient's own 2 GiB): refused at
    MAX_REPLY_BYTES, the request fails with the reason and the local model decides."""
    from edge_agent.inference.triton_backend import MAX_REPLY_BYTES

    huge = _HugeReplies(2 * MAX_REPLY_BYTES)
    rig = Rig(f"127.0.0.1:{huge.port}", model)
    try:
        assert rig.bus.wait_until(rig.remote.ready, 30.0)
        rig.router.decide(observations(1)[0])
        assert huge.infers == 1
        assert rig.records[-1].attempts[-1] == ("cached", "ok"), rig.records[-1]
        assert rig.records[-1].attempts[0][0] == "triton"
        assert "larger than max" in (rig.remote.last_error or ""), rig.remote.last_error
        assert str(MAX_REPLY_BYTES) in (rig.remote.last_error or "")
    finally:
        rig.stop()
        huge.server.stop(0)

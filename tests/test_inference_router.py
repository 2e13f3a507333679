"""The policy router: fall-through on NaN / exception / deadline with no dropped decision."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest
from inference_models import (
    GatedRemote,
    SlowBackend,
    bare_scores,
    bare_session,
    make_policy,
    observations,
)

from edge_agent.clock import ManualClock
from edge_agent.executor.tasks import State
from edge_agent.inference.backend import DecisionRecord, EventBus, EventKind, InferenceEvent
from edge_agent.inference.onnx_backend import OnnxBackend
from edge_agent.inference.router import PolicyRouter
from edge_agent.policy_seam import OBS_DIM, Action, Observation, action_from_scores

CPU = ["CPUExecutionProvider"]


class Rig:
    """Events and decisions of one router, kept for assertions."""

    def __init__(self) -> None:
        self.events: list[InferenceEvent] = []
        self.records: list[DecisionRecord] = []
        self.bus = EventBus(self.events.append)

    def onnx(self, name: str, model: Path, load: bool = True, **kw: object) -> OnnxBackend:
        b = OnnxBackend(name, model, CPU, self.bus, **kw)  # type: ignore[arg-type]
        if load:
            assert b.load()
        return b

    # generous default deadline: a shared 2-core VM stalls a thread for tens of ms at times
    def router(self, backends: list, deadline_s: float = 1.0, **kw: object) -> PolicyRouter:  # type: ignore[type-arg]
        return PolicyRouter(backends, self.bus, deadline_s=deadline_s,
                            decision_sink=self.records.append, **kw)  # type: ignore[arg-type]

    def kinds(self) -> list[EventKind]:
        return [e.kind for e in self.events]


@pytest.fixture
def good(tmp_path: Path) -> Path:
    return make_policy(tmp_path, "good", seed=5)


def _expected(model: Path, obs: list[Observation]) -> list[Action | None]:
    s = bare_session(model)
    return [action_from_scores(bare_scores(s, o)) for o in obs]


def test_actions_are_the_argmax_of_the_model_and_every_decision_is_recorded(good: Path) -> None:
    rig = Rig()
    r = rig.router([rig.onnx("local", good)])
    obs = observations(100)
    assert [r.decide(o) for o in obs] == _expected(good, obs)
    assert len(rig.records) == 100 and r.backend_in_use == "local"
    rec = rig.records[0]
    assert rec.observation == obs[0].vector and rec.state == obs[0].state.value
    assert rec.backend == "local" and rec.outcome == "ok" and rec.attempts == (("local", "ok"),)
    assert rec.action == _expected(good, obs[:1])[0].name.lower()  # type: ignore[union-attr]
    assert rec.latency_s >= 0 and rec.as_dict()["latency_ms"] >= 0
    assert json.loads(json.dumps(rec.as_dict()))["state"] == obs[0].state.value  # a plain str


def test_scores_are_judged_one_by_one_when_their_sum_is_not_finite() -> None:
    from edge_agent.inference.router import _action

    big = 1e308  # finite, but two of them sum to inf: the fast test alone would refuse them
    assert _action([0.0, big, big, 1.0]) is Action(1)
    assert _action([0.0, float("nan"), 1.0, 2.0]) is None
    assert _action([0.0, float("inf"), 1.0, 2.0]) is None
    assert _action([0.5, 0.25, 3.0, 1.0]) is Action(2)
    assert _action([0.5, 0.25, 3.0]) is None  # the wrong length


def test_nan_model_falls_through_for_the_same_decision(tmp_path: Path, good: Path) -> None:
    rig = Rig()
    nan = rig.onnx("nan", make_policy(tmp_path, "nan", nan=True))
    r = rig.router([nan, rig.onnx("local", good)])
    obs = observations(40)
    assert [r.decide(o) for o in obs] == _expected(good, obs)
    assert all(rec.backend == "local" and rec.outcome == "fallback" for rec in rig.records)
    assert all(rec.attempts == (("nan", "nan"), ("local", "ok")) for rec in rig.records)
    failed = [e for e in rig.events if e.kind is EventKind.ATTEMPT_FAILED]
    assert len(failed) == 40 and all(e.backend == "nan" for e in failed)


def test_an_exception_in_a_backend_falls_through(tmp_path: Path, good: Path) -> None:
    rig = Rig()
    # a model of another width: onnxruntime really raises on every run
    narrow = tmp_path / "narrow.onnx"
    narrow.write_bytes(make_policy_bytes_of_width(tmp_path, 7))
    r = rig.router([rig.onnx("narrow", narrow), rig.onnx("local", good)])
    obs = observations(20)
    assert [r.decide(o) for o in obs] == _expected(good, obs)
    assert {rec.attempts[0][1] for rec in rig.records} == {"error"}
    assert r.fallbacks == 20 and r.no_decisions == 0


def make_policy_bytes_of_width(tmp_path: Path, width: int) -> bytes:
    from inference_models import policy_tool

    return bytes(policy_tool().build_mlp(seed=1, obs_dim=width).SerializeToString())


def test_a_slow_backend_misses_its_deadline_and_falls_through(good: Path) -> None:
    rig = Rig()
    slow = SlowBackend(rig.onnx("slow-inner", good), delay_s=0.5, name="slow")
    r = rig.router([slow, rig.onnx("local", good)], deadline_s=0.2)
    obs = observations(5)
    assert [r.decide(o) for o in obs] == _expected(good, obs)
    assert [rec.attempts for rec in rig.records] == [(("slow", "deadline"), ("local", "ok"))] * 5
    assert all("ms >" in e.detail for e in rig.events if e.kind is EventKind.ATTEMPT_FAILED)


def test_poll_never_blocks_and_uses_a_remote_answer_that_arrives_in_time(good: Path) -> None:
    rig = Rig()
    clock = ManualClock(100.0)
    remote = GatedRemote(rig.onnx("remote-inner", good), rig.bus, name="remote")
    r = rig.router([remote, rig.onnx("local", good)], deadline_s=0.5, clock=clock.now)
    o = observations(1)[0]
    d = r.begin(o)
    assert not d.poll() and not d.poll()  # the remote has not answered; nothing blocked
    remote.gate.set()
    # wait for the worker's answer (a real thread) without advancing the router's clock
    d._ticket.wait(30.0)  # type: ignore[union-attr]
    assert d.poll() and d.backend == "remote" and d.action == _expected(good, [o])[0]
    assert rig.records[-1].outcome == "ok"
    remote.stop()


def test_a_remote_answer_missing_at_the_deadline_falls_through_to_local(good: Path) -> None:
    rig = Rig()
    clock = ManualClock(100.0)
    remote = GatedRemote(rig.onnx("remote-inner", good), rig.bus, name="remote")
    r = rig.router([remote, rig.onnx("local", good)], deadline_s=0.5, clock=clock.now)
    obs = observations(3)
    d = r.begin(obs[0])
    assert not d.poll()
    clock.advance(0.49)
    assert not d.poll()
    clock.advance(0.02)  # past the deadline: the same decision is taken locally
    assert d.poll() and d.backend == "local" and d.action == _expected(good, obs[:1])[0]
    assert rig.records[-1].attempts == (("remote", "deadline"), ("local", "ok"))
    # the worker is still stuck on that request: the next decision does not queue behind it
    d2 = r.begin(obs[1])
    assert d2.done and d2.backend == "local"
    assert rig.records[-1].attempts == (("remote", "busy"), ("local", "ok"))
    remote.gate.set()
    remote.stop()


def test_decide_waits_for_a_remote_at_most_the_deadline(good: Path) -> None:
    rig = Rig()
    remote = GatedRemote(rig.onnx("remote-inner", good), rig.bus, name="remote")
    r = rig.router([remote, rig.onnx("local", good)], deadline_s=0.2)
    o = observations(1)[0]
    assert r.decide(o) == _expected(good, [o])[0]
    assert rig.records[-1].attempts == (("remote", "deadline"), ("local", "ok"))
    remote.gate.set()
    remote.stop()


def test_no_decision_is_dropped_while_any_backend_works(tmp_path: Path, good: Path) -> None:
    rig = Rig()
    nan = rig.onnx("nan", make_policy(tmp_path, "nan", nan=True))
    narrow = tmp_path / "narrow.onnx"
    narrow.write_bytes(make_policy_bytes_of_width(tmp_path, 5))
    r = rig.router([nan, rig.onnx("narrow", narrow), rig.onnx("local", good)])
    obs = observations(300, seed=9)
    got = [r.decide(o) for o in obs]
    assert got == _expected(good, obs) and None not in got
    assert len(rig.records) == 300 and r.no_decisions == 0 and r.decisions == 300


def test_when_every_backend_fails_the_executor_gets_no_decision(tmp_path: Path) -> None:
    rig = Rig()
    r = rig.router([rig.onnx("nan", make_policy(tmp_path, "nan", nan=True))])
    assert r.decide(observations(1)[0]) is None
    assert rig.records[-1].outcome == "no_decision" and rig.records[-1].action is None


def test_a_non_finite_observation_is_no_decision_and_blames_no_backend(good: Path) -> None:
    rig = Rig()
    r = rig.router([rig.onnx("local", good)])
    v = list(observations(1)[0].vector)
    v[8] = float("nan")
    assert r.decide(Observation(State.GRASP, tuple(v))) is None
    assert rig.records[-1].attempts == (("-", "bad_observation"),)
    assert EventKind.ATTEMPT_FAILED not in rig.kinds()


def test_not_ready_backends_are_skipped_and_switching_is_an_event(good: Path) -> None:
    rig = Rig()
    first = rig.onnx("first", good, load=False)
    r = rig.router([first, rig.onnx("local", good)])
    obs = observations(4)
    r.decide(obs[0])
    assert rig.records[-1].attempts == (("first", "not_ready"), ("local", "ok"))
    assert rig.records[-1].outcome == "ok" and r.backend_in_use == "local"
    assert first.load()
    r.decide(obs[1])
    assert r.backend_in_use == "first"
    fallback = [e for e in rig.events if e.kind is EventKind.FALLBACK]
    assert len(fallback) == 1 and "was local" in fallback[0].detail


def test_a_task_waits_for_its_model_bounded(good: Path) -> None:
    rig = Rig()
    b = rig.onnx("local", good, load=False)
    r = rig.router([b])
    assert not r.wait_ready(0.05)  # bounded: returns, does not refuse forever
    assert r.decide(observations(1)[0]) is None
    threading.Thread(target=b.load, daemon=True).start()
    assert r.wait_ready(30.0)
    assert r.decide(observations(1)[0]) is not None


def test_a_broken_decision_sink_does_not_stop_decisions(good: Path) -> None:
    rig = Rig()

    def sink(rec: DecisionRecord) -> None:
        raise OSError("journal disk full")

    r = PolicyRouter([rig.onnx("local", good)], rig.bus, deadline_s=1.0, decision_sink=sink)
    assert r.decide(observations(1)[0]) is not None


def test_the_router_is_the_executors_policy(good: Path) -> None:
    from executor_fake import Bench

    rig = Rig()
    r = rig.router([rig.onnx("local", good)])
    b = Bench(policy=r)
    b.start()
    b.run_until(lambda: b.done() is not None or r.decisions >= 5, 20.0)
    assert r.decisions >= 1 and r.no_decisions == 0
    assert all(len(rec.observation) == OBS_DIM for rec in rig.records)

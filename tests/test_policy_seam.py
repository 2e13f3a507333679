"""The policy seam (edge_agent/policy_seam.py): below both the executor and the inference layer,
the observation filled by name, the asynchronous decision declared in the protocol."""

from __future__ import annotations

import subprocess
import sys

import pytest

from edge_agent.executor.policy import AlwaysAdvancePolicy, ExpertPolicy
from edge_agent.inference.backend import EventBus
from edge_agent.inference.router import PolicyRouter
from edge_agent.inference.rule_backend import RuleBackend
from edge_agent.policy_seam import OBS_FIELDS, Action, AsyncPolicy, Observation, Policy
from edge_agent.vocab import State

_NAMES = [f.name for f in OBS_FIELDS if not f.name.startswith("state_")]


def test_the_seam_imports_nothing_of_edge_agent_but_the_vocabulary() -> None:
    code = ("import sys, edge_agent.policy_seam; "
            "print(sorted(m for m in sys.modules if m.startswith('edge_agent.')))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "['edge_agent.policy_seam', 'edge_agent.vocab']"


def test_observation_is_filled_by_name_and_refuses_a_missing_or_unknown_field() -> None:
    obs = Observation.of(State.GRASP, {n: float(i) for i, n in enumerate(_NAMES)})
    assert obs.get("state_grasp") == 1.0 and obs.get("state_approach") == 0.0
    assert all(obs.get(n) == float(i) for i, n in enumerate(_NAMES))
    assert Observation.of(State.HOLDING, dict.fromkeys(_NAMES, 0.0)).vector == (0.0,) * len(
        OBS_FIELDS)  # no one-hot outside the policy states
    with pytest.raises(ValueError, match="regrasp_ok"):
        Observation.of(State.GRASP, {n: 0.0 for n in _NAMES if n != "regrasp_ok"})
    with pytest.raises(KeyError):
        Observation.of(State.GRASP, {**dict.fromkeys(_NAMES, 0.0), "no_such_field": 1.0})


def test_the_router_is_an_async_policy_and_the_executors_own_policies_are_not() -> None:
    router = PolicyRouter([RuleBackend()], EventBus(), deadline_s=0.005)
    assert isinstance(router, AsyncPolicy)
    assert not isinstance(ExpertPolicy(), AsyncPolicy)
    assert not isinstance(AlwaysAdvancePolicy(), AsyncPolicy)
    pending = router.begin(Observation.of(State.GRASP, dict.fromkeys(_NAMES, 0.0)))
    assert pending.poll() and pending.action is Action.CONTINUE  # the rule answers inline
    bad = router.begin(Observation(State.GRASP, (float("nan"),) * len(OBS_FIELDS)))
    assert bad.poll() and bad.action is None  # non-finite input: no decision, never a wait

    def as_policy(p: Policy) -> Action | None:
        return p.decide(Observation(State.GRASP, (0.0,) * len(OBS_FIELDS)))

    assert as_policy(ExpertPolicy()) is Action.CONTINUE

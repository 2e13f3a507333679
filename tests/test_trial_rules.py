"""The model trial's rules (inference/trial_rules.py, pure) and `edge-agent model status`'s
printout of them: each regression rule fires on its evidence and not below it; the success test
is the exact binomial at alpha / tasks; the trial ends at whichever of tasks and time is first."""

from __future__ import annotations

import math

from edge_agent.inference.trial_rules import (
    MIN_SLOW,
    Baseline,
    Evidence,
    TrialRules,
    baseline_of,
    binom_cdf,
    judge,
)
from edge_agent.model_status_cli import format_models

RULES = TrialRules(tasks=20, seconds=3600.0, latency_ms=5.0, alpha=0.05, margin=0.10)
GOOD = Baseline(40, 38)  # 95 %: p_ref 0.85


def test_binomial_cdf_is_exact() -> None:
    assert math.isclose(binom_cdf(0, 2, 0.9), 0.01)
    assert math.isclose(binom_cdf(2, 5, 0.5), 0.5)
    assert math.isclose(binom_cdf(1, 3, 0.5), 0.5)
    assert binom_cdf(3, 3, 0.2) == 1.0 and binom_cdf(-1, 3, 0.2) == 0.0


def test_nothing_wrong_stays_on_trial_then_commits_by_tasks_or_by_time() -> None:
    ev = Evidence(tasks=5, successes=5, attempts=400, worst_ms=0.3)
    assert judge(ev, GOOD, RULES, 0.0, 10.0).state == "on_trial"
    ev.tasks = ev.successes = 20
    v = judge(ev, GOOD, RULES, 0.0, 10.0)
    assert (v.state, v.by) == ("committed", "tasks")
    few = Evidence(tasks=2, successes=2)
    v = judge(few, GOOD, RULES, 0.0, 3600.0)
    assert (v.state, v.by) == ("committed", "time")


def test_latency_over_budget_needs_five_and_five_percent() -> None:
    ev = Evidence(attempts=MIN_SLOW, slow=MIN_SLOW - 1, worst_ms=9.0)
    assert judge(ev, GOOD, RULES, 0.0, 1.0).state == "on_trial"
    ev.slow = MIN_SLOW
    v = judge(ev, GOOD, RULES, 0.0, 1.0)
    assert v.state == "regression" and "decision latency" in v.reasons[0]
    # 5 spikes in 1,000 decisions (a loaded machine) is not a slow model
    assert judge(Evidence(attempts=1000, slow=5), GOOD, RULES, 0.0, 1.0).state == "on_trial"


def test_each_other_rule_is_a_regression() -> None:
    for ev, words in ((Evidence(unclean_restarts=1), "died during the trial"),
                      (Evidence(load_failures=1), "failed to load"),
                      (Evidence(attempts=100, errors=3), "inference errors"),
                      (Evidence(l3=1), "L3"),
                      (Evidence(modes=["rule_policy"]), "rule_policy")):
        v = judge(ev, GOOD, RULES, 0.0, 1.0)
        assert v.state == "regression" and words in v.reasons[0], (ev, v)
    assert judge(Evidence(attempts=1000, errors=3), GOOD, RULES, 0.0, 1.0).state == "on_trial"


def test_success_test_against_the_previous_models_rate() -> None:
    # p_ref 0.85, level 0.05 / 20 = 0.0025
    assert judge(Evidence(tasks=1, successes=0), GOOD, RULES, 0.0, 1.0).state == "on_trial"
    assert judge(Evidence(tasks=3, successes=1), GOOD, RULES, 0.0, 1.0).state == "on_trial"
    v = judge(Evidence(tasks=4, successes=0), GOOD, RULES, 0.0, 1.0)
    assert v.state == "regression" and "task success 0/4" in v.reasons[0], v
    assert v.success is not None and v.success["p_value"] < v.success["level"]
    # 16/20 against 95 % is within the 10-point margin
    assert judge(Evidence(tasks=20, successes=16), GOOD, RULES, 0.0, 1.0).state == "committed"


def test_no_baseline_skips_the_success_rule_and_says_so() -> None:
    v = judge(Evidence(tasks=4, successes=0), Baseline(2, 2), RULES, 0.0, 1.0)
    assert v.state == "on_trial" and v.success is None and "needs 5" in (v.note or "")


def test_the_baseline_is_the_previous_models_newest_judged_episodes() -> None:
    eps = [{"model": {"sha256": "a"}, "outcome": "success"},
           {"model": {"sha256": "b"}, "outcome": "failed"},
           {"model": {"sha256": "a"}, "outcome": "aborted"},
           {"model": {"sha256": "a"}, "outcome": "failed"},
           {"model": None, "outcome": "success"},
           {"model": {"sha256": "a"}, "outcome": "aborted", "message": "aborted by the policy"},
           {"model": {"sha256": "a"}, "outcome": "aborted", "message": "cancelled"}]
    assert baseline_of(eps, "a") == Baseline(3, 1)  # a policy's abort is its failure
    assert baseline_of(eps, None) == Baseline(0, 0)


def test_evidence_round_trips_through_json() -> None:
    ev = Evidence(tasks=3, successes=2, attempts=10, slow=1, worst_ms=7.5, modes=["x"],
                  first_slow_wall=12.5)
    assert Evidence.from_dict(ev.as_dict()) == ev


def test_model_status_printout() -> None:
    ref = {"name": "p", "version": "1.0.1", "sha256": "ab" * 32}
    v = judge(Evidence(attempts=10, slow=6, worst_ms=13.0), GOOD, RULES, 0.0, 1.0)
    lines = format_models({
        "current": ref, "previous": None, "shadow": None,
        "trial": {**ref, "state": "rolled_back", "tasks_done": 0, "tasks_required": 20,
                  "started_wall": 0.0, "ended_wall": 1.0, "evidence": Evidence(
                      attempts=10, slow=6).as_dict(), "verdict": v.as_dict(),
                  "rules": RULES.as_dict(), "restored": ref},
        "bad": [{**ref, "wall": 1.0, "reasons": list(v.reasons)}]})
    text = "\n".join(lines)
    assert "trial     rolled_back: p 1.0.1 (sha256 abababababab), 0/20 tasks" in text
    assert "regression: decision latency: 6 of 10" in text and "6 over 5.0 ms" in text
    assert "bad" in text and "rolled back 1970-01-01 00:00:01 UTC" in text

"""The release gate's decision rules, pure: paired outcomes and latency figures in, verdicts out.

Per fault class, candidate and current ran the same seeded episodes (hil/policy_eval.py). Of
n pairs, `b` = the current succeeded and the candidate failed, `c` = the reverse (the discordant
pairs; concordant ones say nothing about which is better).

- Test: exact one-sided McNemar, i.e. the sign test on the discordant pairs. Under H0 "the
  candidate is no worse in this class" a discordant pair goes either way with probability ½ at
  most, so p = P(X >= b) for X ~ Binomial(b + c, ½).
- A class **fails** when p < alpha (significantly worse) **and** the observed drop
  (b - c) / n is at least `margin` points (worse by an amount that matters: with many episodes a
  1-point drop is significant too). The margin is an effect-size floor, not the null
  hypothesis: testing "worse by more than 10 points" has power alpha against a true 10-point
  drop, and the gate is meant to catch one (hil/gate_power.py measures how often it does).
- A class where both policies failed every episode is **uninformative**: it shows neither is
  worse, and is not counted as evidence for the candidate (the record says so).
- Overall: fail when any class fails, when no class was informative, or on latency:
  the candidate's P99 must be within max(ratio × current P99, current P99 + slack_ms) and below
  the daemon's inference deadline (`inference.deadline_ms`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from edge_agent.inference.gate_record import GATE_DEFAULTS

DEFAULT_ALPHA = float(GATE_DEFAULTS["alpha"])
DEFAULT_MARGIN_POINTS = float(GATE_DEFAULTS["margin_points"])
LATENCY_RATIO = 1.5
LATENCY_SLACK_MS = 0.2


@dataclass(frozen=True, slots=True)
class Rule:
    alpha: float = DEFAULT_ALPHA
    margin_points: float = DEFAULT_MARGIN_POINTS
    latency_ratio: float = LATENCY_RATIO
    latency_slack_ms: float = LATENCY_SLACK_MS
    deadline_ms: float = 20.0

    def describe(self) -> dict[str, Any]:
        return {"test": "exact one-sided McNemar (sign test on the discordant pairs), "
                        "H0: the candidate is no worse in the class",
                "alpha": self.alpha, "margin_points": self.margin_points,
                "class_fails_when": f"p < {self.alpha:g} and observed drop >= "
                                    f"{self.margin_points:g} points",
                "uninformative": "both failed every episode: not evidence either way",
                "latency_budget": f"candidate P99 <= max({self.latency_ratio:g} x current P99, "
                                  f"current P99 + {self.latency_slack_ms:g} ms) and < "
                                  f"deadline {self.deadline_ms:g} ms"}


def sign_test_p(b: int, c: int) -> float:
    """P(X >= b), X ~ Binomial(b + c, ½): one-sided, exact (1.0 when there is no discordance)."""
    n = b + c
    if n == 0 or b == 0:
        return 1.0
    return math.fsum(math.comb(n, k) for k in range(b, n + 1)) / 2.0 ** n


def min_discordant_to_fail(alpha: float, c: int = 0) -> int:
    """The smallest b with p < alpha given c (the gate's threshold; for the power table)."""
    b = 1
    while sign_test_p(b, c) >= alpha:
        b += 1
    return b


def class_verdict(fault: str, pairs: Sequence[tuple[bool, bool]], rule: Rule) -> dict[str, Any]:
    """One class's row: pairs are (current succeeded, candidate succeeded) per episode."""
    n = len(pairs)
    both = sum(1 for cur, cand in pairs if cur and cand)
    b = sum(1 for cur, cand in pairs if cur and not cand)
    c = sum(1 for cur, cand in pairs if cand and not cur)
    cur_ok, cand_ok = both + b, both + c
    drop = 100.0 * (b - c) / n if n else 0.0
    p = sign_test_p(b, c)
    if n == 0:
        verdict, why = "uninformative", "no episodes"
    elif cur_ok == 0 and cand_ok == 0:
        verdict, why = "uninformative", "both failed every episode: not evidence either way"
    elif p < rule.alpha and drop >= rule.margin_points:
        verdict, why = "fail", (f"worse: {b} episodes only the current model succeeded, {c} "
                                f"only the candidate (drop {drop:.1f} points >= margin "
                                f"{rule.margin_points:g}, p = {p:.2g} < {rule.alpha:g})")
    else:
        verdict = "pass"
        why = ("no discordant pair" if b + c == 0 else
               f"{b} worse / {c} better, p = {p:.2g}, drop {drop:.1f} points")
    return {"fault": fault, "episodes": n, "current_success": cur_ok,
            "candidate_success": cand_ok, "both_success": both, "current_only": b,
            "candidate_only": c, "drop_points": round(drop, 1), "p_value": round(p, 6),
            "verdict": verdict, "why": why}


def latency_verdict(current_p99_ms: float, candidate_p99_ms: float,
                    rule: Rule) -> tuple[bool, float, str]:
    """(passes, the budget in ms, why)."""
    budget = max(rule.latency_ratio * current_p99_ms, current_p99_ms + rule.latency_slack_ms)
    if candidate_p99_ms >= rule.deadline_ms:
        return False, budget, (f"candidate P99 {candidate_p99_ms:.3f} ms is not below the "
                               f"inference deadline {rule.deadline_ms:g} ms")
    if candidate_p99_ms > budget:
        return False, budget, (f"candidate P99 {candidate_p99_ms:.3f} ms > budget "
                               f"{budget:.3f} ms (current P99 {current_p99_ms:.3f} ms)")
    return True, budget, (f"candidate P99 {candidate_p99_ms:.3f} ms <= budget {budget:.3f} ms")


def overall(classes: Sequence[dict[str, Any]], latency_ok: bool | None,
            latency_why: str) -> tuple[str, list[str]]:
    """('pass' | 'fail', the reasons)."""
    reasons = [f"{r['fault']}: {r['why']}" for r in classes if r["verdict"] == "fail"]
    if not any(r["verdict"] != "uninformative" for r in classes):
        reasons.append("no fault class was informative (both failed every episode, or none ran)")
    if latency_ok is False:
        reasons.append(f"latency: {latency_why}")
    if reasons:
        return "fail", reasons
    informative = sum(1 for r in classes if r["verdict"] == "pass")
    unk = [r["fault"] for r in classes if r["verdict"] == "uninformative"]
    out = [f"no fault class worse ({informative} informative)"]
    if unk:
        out.append(f"uninformative (both failed every episode): {', '.join(unk)}")
    if latency_ok:
        out.append(f"latency: {latency_why}")
    return "pass", out

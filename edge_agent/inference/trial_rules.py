"""Model trial rules: from the evidence counted while a new model is on trial to a verdict.

Pure (no threads, no I/O, no clock of its own: every call takes `now`), like health/modes.py.
The daemon's shell (daemon/model_trial.py) counts the evidence and acts on the verdict:
`on_trial` (keep watching), `regression` (roll back at once, file a report, mark the candidate
bad) or `committed`.

A trial ends at whichever comes first: `tasks` judged tasks or `seconds` since it began. A task
is judged when it ended `success` or `failed`, or `aborted` by the policy itself (the model's own
decision: a failure); one an operator cancelled or another task superseded is counted as
`aborted` and judges nothing.
No regression by then: committed. Any one of these is a regression, checked after every piece of
evidence:

- **restart**: the daemon died during the trial (an unclean restart: crash, kill -9, watchdog,
  power) — the boot-counter rule with a counter of 1 (RAUC, Mender): the candidate gets no
  second boot.
- **load**: the candidate's session failed to load (`inference_load_failed` of `local`).
- **errors**: the candidate's decision attempts raised or gave NaN/inf scores at least
  `MIN_ERRORS` times and in more than `ERROR_FRACTION` of its attempts.
- **latency**: the candidate's decisions over the budget (`latency_ms`; its deadline misses
  count too) at least `MIN_SLOW` times and in more than `SLOW_FRACTION` of its attempts.
- **L3**: an L3 diagnosis (a task ended in `diagnostic`) while on trial.
- **modes**: a degradation mode that says the candidate is unusable (`cached_policy`: the
  last-known-good decides; `rule_policy`: no model does) entered while on trial.
- **success**: fewer successes than the previous model's recent rate allows — a one-sided exact
  binomial test of k successes in n judged trial tasks against p_ref = p0 - `margin`, where p0 is
  the previous model's success rate over its last `BASELINE_EPISODES` judged episodes in the
  episode journal. Regression when P(X <= k | n, p_ref) < `alpha` / `tasks`: the test is run
  after every task (up to `tasks` looks), so each look spends alpha / tasks (Bonferroni) and the
  chance of rolling back a model as good as p_ref stays under alpha. Small samples are handled
  by the exact test itself (with p_ref 0.9 two failures in the first two tasks reject, one does
  not). With fewer than `MIN_BASELINE` episodes of the previous model there is no reference:
  the success rule is skipped and the evidence says so.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, cast

if TYPE_CHECKING:
    from edge_agent.contract.status_model import TrialEvidence, TrialVerdict

MIN_ERRORS = 3
ERROR_FRACTION = 0.01
MIN_SLOW = 5
SLOW_FRACTION = 0.05
BASELINE_EPISODES = 50
MIN_BASELINE = 5
UNUSABLE_MODES = frozenset({"cached_policy", "rule_policy"})
POLICY_ABORT = "aborted by the policy"  # the executor's task_done message (executor/driver.py)
ON_TRIAL, REGRESSION, COMMITTED = "on_trial", "regression", "committed"


@dataclass(frozen=True, slots=True)
class TrialRules:
    """`inference.trial_*` (config/schema.py)."""

    tasks: int = 20
    seconds: float = 3600.0
    latency_ms: float = 5.0
    alpha: float = 0.05
    margin: float = 0.10

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_config(cls, section: Any) -> TrialRules:
        """From an `InferenceSection` (config/schema.py: inference.trial_*)."""
        return cls(section.trial_tasks, section.trial_s, section.trial_latency_ms,
                   section.trial_alpha, section.trial_margin)


@dataclass(slots=True)
class Evidence:
    """What was counted while on trial (persisted with the trial; JSON round trip)."""

    tasks: int = 0  # judged: success, failed, aborted by the policy
    successes: int = 0
    aborted: int = 0
    l3: int = 0
    attempts: int = 0  # the candidate's decision attempts (backend `local`)
    errors: int = 0  # ... that raised or gave NaN/inf
    slow: int = 0  # ... over the latency budget (deadline misses included)
    worst_ms: float = 0.0  # the candidate's slowest attempt
    first_slow_wall: float | None = None  # when the first over-budget attempt was seen
    load_failures: int = 0
    modes: list[str] = field(default_factory=list)  # unusable-model modes entered
    unclean_restarts: int = 0

    def as_dict(self) -> TrialEvidence:
        return cast("TrialEvidence", asdict(self))

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Evidence:
        ev = cls()
        for k in cls.__dataclass_fields__:
            v = d.get(k)
            if v is None:
                continue
            if k == "modes":
                ev.modes = [str(m) for m in v][:16]
            elif k in ("worst_ms", "first_slow_wall"):
                setattr(ev, k, float(v))
            else:
                setattr(ev, k, int(v))
        return ev


@dataclass(frozen=True, slots=True)
class Baseline:
    """The previous model's recent record: judged episodes and successes (from the journal)."""

    episodes: int
    successes: int

    @property
    def rate(self) -> float | None:
        return self.successes / self.episodes if self.episodes else None


@dataclass(frozen=True, slots=True)
class Verdict:
    """`state`: on_trial | regression | committed; `reasons` (regression); `by` (commit:
    tasks | time); `success`: the success rule's figures (None: not applied, `note` says why)."""

    state: str
    reasons: tuple[str, ...] = ()
    by: str | None = None
    success: Mapping[str, Any] | None = None
    note: str | None = None

    def as_dict(self) -> TrialVerdict:
        return {"state": self.state, "reasons": list(self.reasons), "by": self.by,
                "success": dict(self.success) if self.success is not None else None,
                "note": self.note}


def binom_cdf(k: int, n: int, p: float) -> float:
    """P(X <= k) for X ~ Binomial(n, p), exact."""
    if k < 0:
        return 0.0
    if k >= n:
        return 1.0
    p = min(max(p, 0.0), 1.0)
    return min(1.0, sum(math.comb(n, i) * p ** i * (1.0 - p) ** (n - i) for i in range(k + 1)))


def judged(outcome: Any, message: Any) -> bool | None:
    """A task's end as evidence: True (a success), False (a failure: failed, or aborted by the
    policy), None (judges nothing: cancelled, superseded)."""
    if outcome == "success":
        return True
    if outcome == "failed" or (outcome == "aborted" and message == POLICY_ABORT):
        return False
    return None


def baseline_of(episodes: Iterable[Mapping[str, Any]], sha: str | None) -> Baseline:
    """The newest `BASELINE_EPISODES` judged episodes (success/failed) decided by model `sha`;
    `episodes` newest first (episode journal records, store/episodes.py)."""
    n = s = 0
    if sha is None:
        return Baseline(0, 0)
    for rec in episodes:
        model = rec.get("model")
        if not isinstance(model, Mapping) or model.get("sha256") != sha:
            continue
        verdict = judged(rec.get("outcome"), rec.get("message"))
        if verdict is None:
            continue
        n += 1
        s += verdict
        if n >= BASELINE_EPISODES:
            break
    return Baseline(n, s)


def success_test(ev: Evidence, base: Baseline | None, rules: TrialRules
                 ) -> tuple[dict[str, Any] | None, str | None]:
    """(figures of the success rule, None) or (None, why it is not applied)."""
    if base is None or base.episodes < MIN_BASELINE:
        have = 0 if base is None else base.episodes
        return None, (f"success not compared: {have} judged episodes of the previous model in "
                      f"the journal (the rule needs {MIN_BASELINE})")
    p0 = base.successes / base.episodes
    p_ref = max(0.0, p0 - rules.margin)
    level = rules.alpha / max(1, rules.tasks)
    p_value = binom_cdf(ev.successes, ev.tasks, p_ref) if ev.tasks else 1.0
    return {"k": ev.successes, "n": ev.tasks, "p0": round(p0, 4), "baseline": base.episodes,
            "p_ref": round(p_ref, 4), "p_value": round(p_value, 6), "level": round(level, 6),
            "reject": ev.tasks > 0 and p_value < level}, None


def judge(ev: Evidence, base: Baseline | None, rules: TrialRules, started_wall: float,
          now_wall: float) -> Verdict:
    """The verdict on the evidence so far (see the module doc)."""
    why: list[str] = []
    if ev.unclean_restarts:
        why.append(f"the daemon died during the trial ({ev.unclean_restarts} unclean "
                   "restart(s): crash, kill -9, watchdog or power loss)")
    if ev.load_failures:
        why.append(f"the candidate failed to load ({ev.load_failures} time(s))")
    if ev.errors >= MIN_ERRORS and ev.errors > ERROR_FRACTION * ev.attempts:
        why.append(f"inference errors: {ev.errors} of {ev.attempts} attempts raised or gave "
                   f"non-finite scores (limit: {MIN_ERRORS} and {ERROR_FRACTION:.0%})")
    if ev.slow >= MIN_SLOW and ev.slow > SLOW_FRACTION * ev.attempts:
        why.append(f"decision latency: {ev.slow} of {ev.attempts} attempts over the "
                   f"{rules.latency_ms:g} ms budget (worst {ev.worst_ms:.1f} ms; limit: "
                   f"{MIN_SLOW} and {SLOW_FRACTION:.0%})")
    if ev.l3:
        why.append(f"{ev.l3} L3 diagnosis(es) while on trial")
    if ev.modes:
        why.append(f"degradation mode(s) {', '.join(sorted(set(ev.modes)))} entered while on "
                   "trial (the candidate unusable)")
    success, note = success_test(ev, base, rules)
    if success is not None and success["reject"]:
        why.append(f"task success {ev.successes}/{ev.tasks} against the previous model's "
                   f"{success['p0']:.0%} over {success['baseline']} episodes: "
                   f"P(X <= {ev.successes} | p_ref {success['p_ref']:.2f}) = "
                   f"{success['p_value']:.4g} < {success['level']:.4g} (alpha / tasks)")
    if why:
        return Verdict(REGRESSION, tuple(why), None, success, note)
    if ev.tasks >= rules.tasks:
        return Verdict(COMMITTED, (), "tasks", success, note)
    if now_wall >= started_wall + rules.seconds:
        return Verdict(COMMITTED, (), "time", success, note)
    return Verdict(ON_TRIAL, (), None, success, note)

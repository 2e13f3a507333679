"""`status.model` (docs/MODELS.md): the model cache's current and previous models, the last
trial, the shadow candidate and the models marked bad, as TypedDicts (part of status.py;
docs/asyncapi.yaml's ModelRef, ShadowStatus and ModelStatus are generated from these).
"""

# No `from __future__ import annotations`: TypedDict reads NotRequired from live annotations.
from typing import Annotated, Any, Literal, NotRequired, TypedDict

from edge_agent.contract.base import S

Sha256 = Annotated[str, S(pattern="^[0-9a-f]{64}$")]
Count = Annotated[int, S(minimum=0)]


class ModelRef(TypedDict):
    """A cached model (null where there is none)."""

    name: str | None
    version: str | None
    sha256: Sha256


class ShadowCandidate(TypedDict):
    name: str
    version: str
    sha256: str


Ms = Annotated[float | None, "ms; null before any decision"]


class ShadowLatency(TypedDict):
    """Decision latency of the acting model and of the shadow candidate (its own thread)."""

    acting_p50_ms: Ms
    acting_p99_ms: Ms
    shadow_p50_ms: Ms
    shadow_p99_ms: Ms


class ShadowStateFigures(ShadowLatency):
    """One executor state's compared decisions."""

    decisions: Count
    agreement: Annotated[float | None, S(minimum=0, maximum=1)]


class ShadowStatus(TypedDict):
    """model.shadow: null when no shadow ran this boot; else the running one's figures (`active`
    true) or the last stopped one's (`active` false). `agreement` is the share of compared
    decisions where the candidate chose the acting policy's action (overall and in
    `per_state`, by executor state); `latency` (and each state's) holds `acting_p50_ms`,
    `acting_p99_ms` (the acting decision, on the control thread) and `shadow_p50_ms`,
    `shadow_p99_ms` (the candidate's run on its own thread), over the newest 4096 decisions;
    `dropped`: decisions the shadow's full queue dropped, `skipped`: acting no-decisions,
    `errors`: candidate runs that failed, `scheduling`: the worker thread's
    (`inference.shadow_priority`)."""

    active: bool
    candidate: ShadowCandidate
    since: Annotated[float, "wall-clock s when it started"]
    decisions: Count
    agreement: Annotated[float | None, S(minimum=0, maximum=1)]
    per_state: Annotated[dict[str, ShadowStateFigures], "per executor state"]
    latency: ShadowLatency
    dropped: Count
    skipped: NotRequired[Count]
    errors: NotRequired[Count]
    report_after: NotRequired[Count]
    reports_filed: NotRequired[Count]
    scheduling: NotRequired[Annotated[str, S(examples=["SCHED_FIFO 1", "SCHED_OTHER"])]]


class TrialEvidence(TypedDict):
    """What was counted while on trial (edge_agent/inference/trial_rules.py Evidence)."""

    tasks: Annotated[Count, "judged: success, failed, aborted by the policy"]
    successes: Count
    aborted: Count
    l3: Count
    attempts: Annotated[Count, "the candidate's decision attempts (backend local)"]
    errors: Annotated[Count, "attempts that raised or gave NaN/inf"]
    slow: Annotated[Count, "attempts over the latency budget (deadline misses included)"]
    worst_ms: Annotated[float, "the candidate's slowest attempt"]
    first_slow_wall: Annotated[float | None, "when the first over-budget attempt was seen"]
    load_failures: Count
    modes: Annotated[list[str], "unusable-model modes entered"]
    unclean_restarts: Count


class TrialVerdict(TypedDict):
    """`state` on_trial | regression | committed; `reasons` (regression); `by` (commit: tasks |
    time); `success`: the success rule's figures (null: not applied, `note` says why)."""

    state: str
    reasons: list[str]
    by: str | None
    success: Annotated[dict[str, Any] | None, "the one-sided binomial test's figures"]
    note: str | None


class TrialStatus(TypedDict):
    """The open or last trial: `state` (pending, on_trial, rolling_back, rolled_back,
    committed), the candidate (`sha256`, `name`, `version`), `previous`, `started_wall`,
    `deadline_wall`, `ended_wall`, `tasks_done` / `tasks_required`, `evidence` (tasks,
    successes, aborted, l3, attempts, errors, slow, worst_ms, first_slow_wall, load_failures,
    modes, unclean_restarts), `verdict` (state, reasons, by, success test figures, note),
    `baseline` (the previous model's judged episodes and successes), `rules`, `restored`,
    `rollback_error`, `allow_bad`."""

    state: Literal["pending", "on_trial", "rolling_back", "rolled_back", "committed"]
    sha256: str
    tasks_done: Count
    tasks_required: Annotated[int, S(minimum=1)]
    evidence: TrialEvidence
    verdict: TrialVerdict | None


class BadModel(TypedDict):
    sha256: str
    name: NotRequired[str | None]
    version: NotRequired[str | None]
    wall: float
    reasons: list[str]


class ModelStatus(TypedDict):
    """`status.model` (docs/MODELS.md): the current and previous models of the cache, the last
    trial (null: none yet), the shadow candidate (null: none), the models marked bad."""

    current: ModelRef | None
    previous: ModelRef | None
    trial: TrialStatus | None
    shadow: ShadowStatus | None
    bad: list[BadModel]

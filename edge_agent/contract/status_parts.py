"""Parts of the `status` command's result (StatusResult): the decision journal's figures, the
report outbox, the policy router, the background workers, as TypedDicts (part of status.py;
inlined in docs/asyncapi.yaml's generated StatusResult).
"""

# No `from __future__ import annotations`: TypedDict reads NotRequired from live annotations.
from typing import Annotated, Any, Literal, NotRequired, TypedDict

from edge_agent.contract.base import Ref, S, values_of
from edge_agent.contract.status_model import ModelRef
from edge_agent.vocab import Mode, State

Count = Annotated[int, S(minimum=0)]


Vec = Annotated[list[float], S(minItems=3, maxItems=3)]


class TaskInfo(TypedDict):
    """The running task, or the one frozen by a stop and saved for `resume`
    (edge_agent/executor/records.py TaskProgress)."""

    task_id: Annotated[str, Ref("TaskId")]
    task: Annotated[str, "the task's name (`pick_place`)"]
    object: Annotated[Vec, "the object's pose the task was given or found, m (base frame)"]
    place: Annotated[Vec, "where the object goes, m (base frame)"]
    state: Annotated[str | None, "the motion state it is in (or was in when frozen)",
                     values_of(State)]
    attempts: Annotated[Count, "attempts of every sub-goal so far"]
    failures: Annotated[list[str], "the failed attempts' causes, oldest first"]
    grip_limit_a: Annotated[float | None, "the finger current limit of the grip that holds the "
                            "part, A (null before a grip)"]
    regrasps: Annotated[Count, "re-grasps after a lost part"]


class LinkWatch(TypedDict):
    """The daemon's deadman on the guardian's stream (STATUS relay, G_STATE heartbeat every half
    deadman; edge_agent/daemon/deadman.py)."""

    guardian_silent: Annotated[bool, "no guardian message within the deadman now"]
    moved_at: Annotated[float | None, "monotonic s of the last moving command; null before the "
                        "first"]
    trips: Annotated[Count, "latched `deadman` stops it caused"]
    deadman_ms: Annotated[float, "the deadman, ms (link.deadman_ms)"]


class JournalStats(TypedDict):
    """The decision journal's figures (edge_agent/store/decisions.py)."""

    enabled: Annotated[bool, "decisions are being journaled now"]
    disabled: Annotated[str | None, "why the journal was turned off (disk_full, io_error), null "
                        "while it is on", S(enum=["disk_full", "io_error", None])]
    submitted: Annotated[Count, "records queued to the writer"]
    written: Annotated[Count, "records written"]
    dropped: Annotated[Count, "records the writer's full queue dropped"]
    rejected: Annotated[Count, "malformed records, queue full, or after it was turned off"]
    errors: Annotated[Count, "the writer's I/O errors"]
    shedding: Annotated[bool, "not journaling while the disk is short (storage_low)"]
    shed: Annotated[Count, "records not journaled while shedding"]
    segments: Annotated[Count, "the journal's segment files"]


class DriftStatus(TypedDict):
    """The periodic policy drift report (edge_agent/daemon/drift.py, journal.drift_period_s)."""

    period_s: Annotated[float, "journal.drift_period_s"]
    period_start: Annotated[float, "wall-clock s the current period started"]
    next_report: Annotated[float, "wall-clock s the current period's report is due"]
    filed: Annotated[Count, "drift reports filed since start"]


class ReportsStatus(TypedDict):
    """The repair report outbox (edge_agent/reports/outbox.py) and the drift report."""

    pending: Annotated[Count, "reports not yet delivered to every sink"]
    dropped: Annotated[Count, "reports the full queue dropped (kept across restarts)"]
    built: Annotated[Count, "reports built since start"]
    delivered: Annotated[dict[str, int], "per sink: reports delivered"]
    failed_attempts: Annotated[dict[str, int], "per sink: failed delivery attempts"]
    corrupt: Annotated[Count, "outbox entries that could not be read at start"]
    unpersisted: Annotated[Count, "entry writes that failed (a full disk): kept in memory"]
    shed_plots: Annotated[bool, "no new plots while the disk is short (storage_low)"]
    last_error: Annotated[dict[str, str], "per sink: its last delivery error"]
    sinks: Annotated[list[str], "the sinks' names"]
    drift: NotRequired[DriftStatus]


class Providers(TypedDict):
    """The ONNX Runtime providers asked for and what `session.get_providers()` gave."""

    requested: list[str]
    active: list[str]
    device: Annotated[str, "cpu or gpu: where the session really runs"]
    gpu_unavailable: Annotated[bool, "a GPU provider was asked for and not given"]


class LocalBackendStatus(TypedDict):
    """An ONNX Runtime session (`local`, or `cached`: the last good model)."""

    name: str
    ready: bool
    model: Annotated[str | None, "the model file"]
    providers: Providers | None
    cpu_only_after_gpu_fault: Annotated[bool, "moved to the CPU after a GPU failure"]
    on_gpu: bool
    load_ms: Annotated[float | None, "the session's load time (null before)"]
    runs: Count
    failures: Count


class TritonBackendStatus(TypedDict):
    """The Triton client (`triton`)."""

    name: str
    url: str
    model: str
    ready: bool
    requests: Count
    failures: Count
    deadline_misses: Annotated[Count, "of `failures`: answers that came after the deadline"]
    last_error: str | None


class RuleBackendStatus(TypedDict):
    """The rule-based expert (`rule`): always ready."""

    name: str
    ready: bool
    kind: Literal["rule"]
    runs: Count


BackendStatus = LocalBackendStatus | TritonBackendStatus | RuleBackendStatus


class RouterStatus(TypedDict):
    """The policy router (edge_agent/inference/router.py): its backends and counters."""

    backend_in_use: Annotated[str | None, "the backend that made the last decision"]
    preferred_ready: Annotated[str | None, "the backend the next decision will try first (null: "
                               "none is ready)"]
    decisions: Annotated[Count, "decisions made"]
    fallbacks: Annotated[Count, "backend attempts that failed over to the next one"]
    no_decisions: Annotated[Count, "ticks where no backend decided"]
    backends: Annotated[list[BackendStatus], "per backend, in preference order"]


class InferenceStatus(RouterStatus):
    """The policy router's backends and counters, the model in use and its load time (null
    without a model)."""

    model: Annotated[ModelRef | None, "the cached model in use (null: none)"]
    load_ms: Annotated[float | None, "load start → the first backend ready (null until then)"]


class InferenceStart(TypedDict):
    """How the policy stack's start went (edge_agent/daemon/policy_loader.py)."""

    ok: Annotated[bool, "a model backend is ready (true without a model configured)"]
    ms: NotRequired[Annotated[float, "build and load time"]]
    backend: NotRequired[Annotated[str | None, "the backend the first decision will try"]]
    policy: NotRequired[Annotated[str, "without a model: the rule-based expert"]]
    error: NotRequired[Annotated[str, "why the stack could not be built"]]


class JournalOpen(TypedDict):
    """How the decision journal's open (its tail's scan and repair) went."""

    ok: bool
    error: NotRequired[str]


class EstimatorsStart(TypedDict):
    """The sensor hub's estimators (built with the hub)."""

    ok: bool
    ms: float
    since: str


class BackgroundStatus(TypedDict, total=False):
    """The start-up work done after READY (edge_agent/daemon/startup_work.py), each part once it
    is over: `inference`, `journal`, `estimators`, `calibration`."""

    inference: InferenceStart
    journal: JournalOpen
    estimators: EstimatorsStart
    calibration: Annotated[dict[str, Any], "the rest calibration's summary (ok, ms; on success "
                           "applied and the calibration's figures, else reason)"]


class ExecutorStatus(TypedDict):
    """`Executor.status()`: the executor's mode, state, task, saved task, L3 count and counters
    (edge_agent/executor/records.py Counters)."""

    mode: Annotated[Mode, Ref("Mode")]
    state: Annotated[str, "the executor state", Ref("ExecutorState"), values_of(State)]
    task: Annotated[TaskInfo | None, "the running task, null when none"]
    saved: Annotated[bool, "a task is saved (resume continues it)"]
    l3_count: Annotated[Count, "L3 faults so far"]
    counters: Annotated[dict[str, int], "ticks, decisions, advance_refused, inference_failures, "
                        "policy_retries, regrasps, regrasp_refused, policy_aborts, "
                        "attempts_failed, collisions, jog_lost, no_measurement, stale_decisions"]

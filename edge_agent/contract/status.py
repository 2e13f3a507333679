"""The retained `state` (MQTT `<prefix>/state`) and the `status` command's result, as TypedDicts.

`StateFields` is what edge_agent/daemon/state.py `state_fields` builds; `StatusResult` is
`daemon_status` (the state fields plus diagnostics). Parts' `status()` dicts that have a record
here return it. docs/asyncapi.yaml's StopInfo, StateFields, StatePayload and StatusResult are
generated from these (python -m edge_agent.contract.asyncapi --write).
"""

# No `from __future__ import annotations`: TypedDict reads NotRequired from live annotations.
from typing import Annotated, Any, Literal, NotRequired, TypedDict

from edge_agent.contract.base import Ref, S, values_of
from edge_agent.contract.status_model import ModelStatus
from edge_agent.contract.status_observe import ObserveStatus
from edge_agent.contract.status_parts import (
    BackgroundStatus,
    ExecutorStatus,
    InferenceStatus,
    JournalStats,
    LinkWatch,
    ReportsStatus,
    TaskInfo,
)
from edge_agent.link.messages import StopReason
from edge_agent.vocab import DegradationMode, Mode, State, StopCause, StopKind

# `str`: the health monitor keeps the modes' values
Degraded = list[Annotated[str, Ref("DegradationMode"), values_of(DegradationMode)]]


class StopInfo(TypedDict):
    """The latched stop."""

    kind: Annotated[StopKind, Ref("StopKind")]
    cause: Annotated[StopCause | None, "The first cause (for an e-stop, the first e-stop cause).",
                     Ref("StopCause")]
    causes: NotRequired[list[Annotated[StopCause, Ref("StopCause")]]]
    hardware_input: NotRequired[Annotated[bool, "the hardware e-stop input is active now"]]


class TaskRef(TypedDict):
    """The running or saved task, when there is one."""

    task_id: Annotated[str, Ref("TaskId")]


class StateFields(TypedDict):
    """The executor's mode and state, the task, the latched stop, the link and the policy in use."""

    mode: Annotated[Mode, Ref("Mode")]
    state: Annotated[str, "the executor state", Ref("ExecutorState"), values_of(State)]
    task: NotRequired[Annotated[TaskInfo | None, "The running or saved task, when there is "
                                "one."]]
    degraded: Degraded
    stop: NotRequired[StopInfo]
    homed: bool
    link_up: NotRequired[bool]
    policy: NotRequired[Annotated[str, "The policy backend that made the last decision (triton, "
                                  "local, cached) or `rule` (the rule-based expert: no model "
                                  "configured, or every model backend down)."]]


class StatePayload(StateFields):
    """The retained `state` message."""

    v: Annotated[Literal[1], Ref("ProtocolVersion")]


class GuardianState(TypedDict):
    """The link guardian's last G_STATE (docs/PROTOCOL.md)."""

    latched: Annotated[bool, "the guardian's stop is latched"]
    estop_input: Annotated[bool, "the hardware e-stop input is active"]
    deadman_hold: bool
    cause: Annotated[str, "the guardian's stop reason (StopReason, lower case)",
                     S(enum=[r.name.lower() for r in StopReason])]
    flags: Annotated[int, S(minimum=0)]


class FirmwareHello(TypedDict):
    """The firmware's HELLO answer."""

    protocol: Annotated[int, "the firmware's protocol version"]
    accepted: Annotated[bool, "the firmware accepted the daemon's protocol version"]
    version: Annotated[str, "the firmware's version string"]
    joints: Annotated[int, S(minimum=0)]


class LinkStatus(TypedDict):
    """The firmware link as the daemon sees it."""

    link_up: bool
    frames: NotRequired[int]
    guardian: NotRequired[Annotated[GuardianState | None, "the link guardian's last G_STATE "
                                    "(null before the first)"]]
    firmware: NotRequired[Annotated[FirmwareHello | None, "the firmware's HELLO (null before "
                                    "it)"]]
    watch: NotRequired[LinkWatch]


class LoopFigures(TypedDict):
    """The control loop's figures since it started (TelemetryPayload.loop)."""

    ticks: Annotated[int, S(minimum=0)]
    overruns: Annotated[int, S(minimum=0)]
    missed_periods: Annotated[int, S(minimum=0)]
    max_late_ms: float
    max_tick_ms: float
    tick_errors: Annotated[int, S(minimum=0)]
    late_p50_ms: Annotated[float | None, "tick start after its deadline since the loop started, "
                           "50 µs bins"]
    late_p99_ms: float | None
    tick_p50_ms: Annotated[float | None, "tick duration since the loop started, 50 µs bins"]
    tick_p99_ms: float | None


class LoopStatus(LoopFigures, total=False):
    """The control loop's figures (those of TelemetryPayload.loop) and how it runs."""

    rate_hz: Annotated[float, "the loop's rate (control.rate_hz)"]
    scheduling: Annotated[str, S(examples=["SCHED_FIFO 20",
                                           "SCHED_OTHER (SCHED_FIFO 20 refused)"])]
    reader_scheduling: Annotated[str | None, "the link reader thread's"]
    output_at_deadline: bool
    sent_at_once: int


Gens = Annotated[list[int], "per generation 0, 1, 2", S(minItems=3, maxItems=3)]
GensMs = Annotated[list[float], "per generation 0, 1, 2, ms", S(minItems=3, maxItems=3)]


class GcWindow(TypedDict):
    """Garbage collections per generation (edge_agent/executor/collector.py): by the wall clock
    (how long the GIL was held) and by the collecting thread's CPU time (how long it scanned);
    `preempted_5ms`: over 5 ms on the wall clock, under half of that on CPU."""

    collections: Gens
    max_ms: GensMs
    over_1ms: Gens
    over_5ms: Gens
    max_cpu_ms: GensMs
    max_cpu_collected: Annotated[list[int], "objects the most CPU-costly one freed, per "
                                 "generation"]
    cpu_over_5ms: Gens
    preempted_5ms: Gens
    max_thread: Annotated[list[str | None], "the thread that ran the longest one, per "
                          "generation"]


class GcFigures(GcWindow):
    """The whole run, the `after_startup` window (automatic collections once the start-up work
    is done: the tasks' pauses) and `idle` (the full collections the daemon runs itself at safe
    points, daemon/heap.py)."""

    after_startup: Annotated[GcWindow | None, "null until the start-up work is done"]
    idle: GcWindow
    frozen: Annotated[int, "objects frozen out of the collector's way (the start-up heap)",
                      S(minimum=0)]


class LoopReport(LoopStatus, total=False):
    """The control loop's figures (those of TelemetryPayload.loop) and how it runs."""

    gc: Annotated[GcFigures, "the garbage collector's figures (collections, pauses)"]


class ProbeStatus(TypedDict):
    """One health probe's last run and schedule."""

    level: Annotated[str | None, "null: not run yet",
                     S(enum=["ok", "warn", "error", "stale", None])]
    message: str
    figures: dict[str, Any]
    mode: NotRequired[str | None]
    subject: NotRequired[str]
    strikes: Annotated[int, S(minimum=0)]
    good_runs: NotRequired[int]
    holding: NotRequired[bool]
    period_s: NotRequired[float]
    runs: NotRequired[int]
    stale_runs: NotRequired[int]
    fast_fails: NotRequired[int]
    took_ms: NotRequired[float | None]
    last_run_s_ago: NotRequired[float | None]
    next_run_in_s: float | None
    next_run_wall: NotRequired[float | None]


class ActiveMode(TypedDict):
    """A degradation mode held now, and for what."""

    mode: Annotated[str, Ref("DegradationMode"), values_of(DegradationMode)]
    subject: Annotated[str, "what is degraded within the mode (a sensor channel for "
                       "sensor_predicted, sensor_filtered; else empty)"]


class HealthStatus(TypedDict, total=False):
    """The health monitor (docs/HEALTH.md; null before READY): `degraded` and `active` (mode +
    subject) now, `fail_after`, `recover_after`, `period_s`, `budget_s`, `cpu_s` (the monitor's
    threads' CPU time so far), and `probes`: per probe its `level` (ok, warn, error, stale),
    `message`, `figures`, `mode` (null: levels only), `subject`, `strikes` (consecutive failed
    runs), `good_runs`, `holding`, `period_s`, `runs`, `stale_runs`, `fast_fails` (failures
    counted from events), `took_ms`, `last_run_s_ago`, `next_run_in_s` and `next_run_wall`
    (null while a check is past its budget)."""

    degraded: Degraded
    active: list[ActiveMode]
    fail_after: int
    recover_after: int
    period_s: float
    budget_s: float
    running: bool
    cpu_s: float
    probes: dict[str, ProbeStatus]


class ThreadStatus(TypedDict):
    """One supervised thread or part."""

    name: str
    kind: Annotated[str, S(enum=["thread", "part"])]
    alive: bool | None
    started_at: float | None
    stopped_at: float | None
    last_error: str | None


class MqttStatus(TypedDict):
    """The MQTT bridge: `connected`, and why not in `error` (a TLS file that cannot be loaded, with
    its config key; a certificate the client rejected, with OpenSSL's reason; a refused login; a
    command subscription the broker refused while connected). The daemon retries with backoff for
    as long as it runs."""

    connected: bool
    bridge: Annotated[bool, "false while the bridge could not be built (see error)"]
    error: str | None
    attempts: NotRequired[Annotated[int, "bridge build attempts (while bridge is false)",
                                    S(minimum=0)]]
    connections: NotRequired[Annotated[int, "successful connections since start (while "
                                       "bridge is true)", S(minimum=0)]]


class StatusResult(StateFields):
    """The `status` command's result (the `state` fields plus diagnostics)."""

    device: str
    version: str
    boot_id: Annotated[str, Ref("BootId")]
    uptime_s: Annotated[float, S(minimum=0)]
    startup_ms: NotRequired[Annotated[float | None, "exec → READY"]]
    link_up_ms: NotRequired[Annotated[float | None, "exec → the guardian's first link-up (null "
                                      "until then, or when none came within "
                                      "link.hello_timeout_s)"]]
    config_hash: str
    sim: bool
    executor: NotRequired[ExecutorStatus]
    journal: NotRequired[Annotated[JournalStats | None, "the decision journal's figures (null "
                                   "without a journal)"]]
    inference: NotRequired[Annotated[InferenceStatus | None, "the policy router's backends and "
                                     "counters (null without a model)"]]
    model: NotRequired[ModelStatus]
    link: LinkStatus
    reports: NotRequired[ReportsStatus]
    loop: NotRequired[LoopReport | None]
    background: NotRequired[BackgroundStatus]
    threads: NotRequired[Annotated[list[ThreadStatus], "The daemon's threads and moving parts "
                                   "(edge_agent/daemon/supervisor.py), in stop order: `kind` "
                                   "`thread` (run by the supervisor: start-up work, calibration, "
                                   "the MQTT bridge's builder, the signal router) or `part` (owns "
                                   "its threads: control loop, link guardian, store writer, "
                                   "report outbox, comms); `alive` (null: the part does not "
                                   "say), `started_at`/`stopped_at` (monotonic s), "
                                   "`last_error`."]]
    mqtt_connected: NotRequired[Annotated[bool, "connected to the broker with the command "
                                          "subscription granted (a command published now is "
                                          "received)"]]
    mqtt: NotRequired[MqttStatus]
    health: NotRequired[HealthStatus | None]
    observe: NotRequired[ObserveStatus]

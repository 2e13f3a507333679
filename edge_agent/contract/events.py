"""Every event the daemon publishes (`<prefix>/event`), one TypedDict per `EventType`.

A record holds what its producer sets: `type` and the type's fields. The hub adds the envelope
(`EventEnvelope`: `ts`, `mono`, `boot_id`; the bridge adds `v`; executor events carry `t`) before
anyone else sees it. `Event` is the union of all records (those of health, reports, inference
and the model trial/shadow live in events_more.py); `schema_gen.event_records()` maps each
`EventType` to its record (tests/test_contract.py checks that every member has one). Field
descriptions are the `Annotated` strings (edge_agent/contract/base.py); docs/asyncapi.yaml is
generated from here.
Fields may be added; consumers ignore what they do not know.
"""

# No `from __future__ import annotations`: TypedDict reads NotRequired from live annotations.
from typing import Annotated, Any, Literal, NotRequired, TypedDict

from edge_agent.contract.base import EventBase, Ref, S, values_of
from edge_agent.contract.events_more import (
    DegradedEvent,
    GpuFailedEvent,
    GpuUnavailableEvent,
    InferenceAttemptFailedEvent,
    InferenceBackendDownEvent,
    InferenceBackendUpEvent,
    InferenceFallbackEvent,
    InferenceLoadFailedEvent,
    ModelCacheCorruptEvent,
    ModelCommittedEvent,
    ModelInstalledEvent,
    ModelRejectedEvent,
    ModelRolledBackEvent,
    ModelTrialStartedEvent,
    RecoveredEvent,
    ReportDroppedEvent,
    ShadowStartedEvent,
    ShadowStoppedEvent,
)
from edge_agent.vocab import EventType, Mode, State, StopCause, StopKind

ET = EventType
TaskIdF = Annotated[str, Ref("TaskId")]
StateName = Annotated[str, "the executor state (ExecutorState)", Ref("ExecutorState"),
                      values_of(State)]
Vec3F = Annotated[list[float], Ref("Vec3")]
# The wire protocol's EVENT codes, lower case (edge_agent.link.codec EventCode).
FirmwareEventCode = Literal["deadman_trip", "cmd_rejected", "bad_frame", "version_mismatch",
                            "limit_clamped", "overcurrent"]


class EventEnvelope(TypedDict):
    """Every event carries `type`, `ts` (wall clock), `mono` (the daemon's monotonic clock) and
    `boot_id`; the other fields depend on the type (listed with EventType). Fields may be
    added; consumers ignore what they do not know."""

    v: Annotated[Literal[1], Ref("ProtocolVersion")]
    type: Annotated[EventType, Ref("EventType")]
    ts: Annotated[float, Ref("Timestamp")]
    mono: float
    boot_id: Annotated[str, Ref("BootId")]
    t: NotRequired[Annotated[float, "the executor's tick time (monotonic s) when it emitted it"]]


# ------------------------------------------------------------------- daemon: start-up, link, stops
class ReadyEvent(EventBase):
    """The daemon is READY (systemd notified): the control loop runs, commands are served."""

    type: Literal[ET.READY]
    startup_ms: Annotated[float, "exec to READY", S(minimum=0)]
    eager: NotRequired[Annotated[bool, "the policy stack loaded before READY"]]
    unclean_restart: NotRequired[Annotated[bool, "the previous run did not stop cleanly"]]


class EstimatorsReadyEvent(EventBase):
    """The Kalman estimators run (from the first frame)."""

    type: Literal[ET.ESTIMATORS_READY]
    ms: float


class PolicyReadyEvent(EventBase):
    """The policy stack loaded (after READY)."""

    type: Literal[ET.POLICY_READY]
    ms: float
    model_ready: Annotated[bool, "a model backend can decide (else the rule-based expert)"]
    backend: Annotated[str | None, "the backend that decides now"]


class CalibrationReadyEvent(EventBase):
    """The rest calibration finished (after READY)."""

    type: Literal[ET.CALIBRATION_READY]
    ms: float
    applied: Annotated[list[str], "the channels whose offsets were applied"]
    at_rest: bool
    wrist_force_offset_n: float | None
    joint_encoder_offsets_rad: list[float] | None
    clock_offset_us: float | None
    clock_bound_us: float | None
    rtt_min_ms: float | None
    rtt_median_ms: float | None


class CalibrationFailedEvent(EventBase):
    """The rest calibration could not run (e.g. the link never came up)."""

    type: Literal[ET.CALIBRATION_FAILED]
    reason: str


class SnapshotCorruptEvent(EventBase):
    """A state snapshot failed verification at start."""

    type: Literal[ET.SNAPSHOT_CORRUPT]
    files: list[str]
    used_previous: Annotated[bool, "the previous snapshot was restored instead"]


class JournalDisabledEvent(EventBase):
    """A journal's writes stopped (the daemon goes on without it)."""

    type: Literal[ET.JOURNAL_DISABLED]
    journal: str
    cause: Annotated[str, "e.g. disk_full"]
    error: str
    records_written: Annotated[int, S(minimum=0)]


class LinkUpEvent(EventBase):
    """The link guardian reports the firmware link up."""

    type: Literal[ET.LINK_UP]
    cause: NotRequired[None]


class LinkFaultEvent(EventBase):
    """The firmware link is down or unusable."""

    type: Literal[ET.LINK_FAULT]
    cause: Annotated[Literal["no_device", "serial_link", "version_mismatch"],
                     Ref("LinkFaultCause")]
    firmware_version: NotRequired[Annotated[int, "version_mismatch: the firmware's"]]
    port: NotRequired[Annotated[str, "no_device: the serial port waited for"]]
    waited_s: NotRequired[float]


class DeadmanHoldEvent(EventBase):
    """The link guardian held the drives (the daemon's command stream stopped; a latched stop
    `deadman` too when the robot was moving)."""

    type: Literal[ET.DEADMAN_HOLD]
    source: Literal["guardian"]


class FirmwareEventEvent(EventBase):
    """The firmware sent an EVENT frame (docs/PROTOCOL.md)."""

    type: Literal[ET.FIRMWARE_EVENT]
    code: Annotated[FirmwareEventCode, Ref("FirmwareEventCode")]
    detail: int


class EstopInputEvent(EventBase):
    """The hardware e-stop input changed."""

    type: Literal[ET.ESTOP_INPUT]
    pressed: bool


class StopEvent(EventBase):
    """The stop latch tripped (also on a repeated e-stop)."""

    type: Literal[ET.STOP]
    kind: Annotated[StopKind, Ref("StopKind")]
    cause: Annotated[StopCause, Ref("StopCause")]


class StopUpdateEvent(EventBase):
    """Still latched; something changed."""

    type: Literal[ET.STOP_UPDATE]
    hardware_input: Annotated[bool, "the hardware e-stop input is active now"]


class StopClearedEvent(EventBase):
    """A reset cleared the latch."""

    type: Literal[ET.STOP_CLEARED]
    hardware_input: Annotated[bool, "the hardware e-stop input is active now"]


class MqttConnectedEvent(EventBase):
    """Connected to the broker."""

    type: Literal[ET.MQTT_CONNECTED]


class MqttDisconnectedEvent(EventBase):
    """The broker connection was lost."""

    type: Literal[ET.MQTT_DISCONNECTED]


# ------------------------------------------------------------------------------------- executor
class TaskStartedEvent(EventBase):
    """A task started."""

    type: Literal[ET.TASK_STARTED]
    task_id: TaskIdF
    task: Annotated[str, "the task spec's name"]
    object: Vec3F
    place: Vec3F


class TaskResumedEvent(EventBase):
    """A frozen task resumed."""

    type: Literal[ET.TASK_RESUMED]
    task_id: TaskIdF
    state: StateName


class TaskFrozenEvent(EventBase):
    """A stop froze the running task (`resume` continues it)."""

    type: Literal[ET.TASK_FROZEN]
    task_id: TaskIdF
    state: StateName
    stop: Annotated[StopKind | None, Ref("StopKind")]
    cause: Annotated[StopCause | None, Ref("StopCause")]


class TaskDoneEvent(EventBase):
    """A task ended."""

    type: Literal[ET.TASK_DONE]
    task_id: TaskIdF
    outcome: Annotated[Literal["success", "failed", "aborted"], Ref("TaskOutcome")]
    message: NotRequired[str]
    attempts: NotRequired[Annotated[int, S(minimum=0)]]
    duration_s: NotRequired[float]
    failures: NotRequired[Annotated[list[Any], "the failed attempts' records"]]


class AttemptStartedEvent(EventBase):
    """An attempt at a subgoal started."""

    type: Literal[ET.ATTEMPT_STARTED]
    task_id: TaskIdF
    state: StateName
    attempt: Annotated[int, S(minimum=1)]
    alternative: Annotated[str | None, "the alternative strategy tried (null: the first)"]


class AttemptFailedEvent(EventBase):
    """An attempt failed: what was detected and what the fault ladder decided."""

    type: Literal[ET.ATTEMPT_FAILED]
    task_id: TaskIdF
    state: StateName
    attempt: Annotated[int, S(minimum=1)]
    kind: Annotated[str, "the failure kind"]
    detail: str
    verdict: Annotated[str, "the fault ladder's verdict (L1, L2, L3)"]
    alternative: str | None
    l3_count: Annotated[int, S(minimum=0)]


class SubgoalReachedEvent(EventBase):
    """A subgoal was reached."""

    type: Literal[ET.SUBGOAL_REACHED]
    state: StateName
    attempt: Annotated[int, S(minimum=1)]
    duration_s: float


class PartLostHoldEvent(EventBase):
    """The part was lost: holding for a re-grasp decision."""

    type: Literal[ET.PART_LOST_HOLD]
    task_id: TaskIdF
    state: StateName
    window_s: float


class RegraspEvent(EventBase):
    """A re-grasp was accepted: the object moved."""

    type: Literal[ET.REGRASP]
    task_id: TaskIdF
    state: StateName
    object: Vec3F
    old_object: Vec3F
    regrasp: Annotated[int, "the task's re-grasps so far", S(minimum=0)]


class RegraspRefusedEvent(EventBase):
    """The re-grasp guard said no."""

    type: Literal[ET.REGRASP_REFUSED]
    task_id: Annotated[str | None, Ref("TaskId")]
    state: StateName
    reason: str


class DiagnosticEvent(EventBase):
    """L3: the fault record (its sensor_window: samples, sample_hz)."""

    type: Literal[ET.DIAGNOSTIC]
    record: dict[str, Any]


class ModeChangedEvent(EventBase):
    """The executor's mode changed."""

    type: Literal[ET.MODE_CHANGED]
    mode: Annotated[Mode, Ref("Mode")]
    state: NotRequired[StateName]


class CollisionEvent(EventBase):
    """The collision monitor tripped."""

    type: Literal[ET.COLLISION]
    joint: str
    detail: Annotated[dict[str, Any] | None, "the monitor's figures at the trip"]


class JogLostEvent(EventBase):
    """Manual jog commands stopped coming."""

    type: Literal[ET.JOG_LOST]


class SensorLostEvent(EventBase):
    """Sensors lost past their bound (a `sensor_bound` stop)."""

    type: Literal[ET.SENSOR_LOST]
    channels: list[str]
    age_s: Annotated[dict[str, float | None], "per channel: seconds since its last sample"]


class SensorBackEvent(EventBase):
    """Every lost sensor is back (a reset may clear the stop)."""

    type: Literal[ET.SENSOR_BACK]
    channels: list[str]


Event = (
    ReadyEvent | EstimatorsReadyEvent | PolicyReadyEvent | CalibrationReadyEvent
    | CalibrationFailedEvent | SnapshotCorruptEvent | JournalDisabledEvent | LinkUpEvent
    | LinkFaultEvent | DeadmanHoldEvent | FirmwareEventEvent | EstopInputEvent | StopEvent
    | StopUpdateEvent | StopClearedEvent | MqttConnectedEvent | MqttDisconnectedEvent
    | TaskStartedEvent | TaskResumedEvent | TaskFrozenEvent | TaskDoneEvent | AttemptStartedEvent
    | AttemptFailedEvent | SubgoalReachedEvent | PartLostHoldEvent | RegraspEvent
    | RegraspRefusedEvent | DiagnosticEvent | ModeChangedEvent | CollisionEvent | JogLostEvent
    | SensorLostEvent | SensorBackEvent | DegradedEvent | RecoveredEvent | ReportDroppedEvent
    | InferenceBackendUpEvent | InferenceBackendDownEvent | InferenceLoadFailedEvent
    | InferenceAttemptFailedEvent | GpuUnavailableEvent | GpuFailedEvent | InferenceFallbackEvent
    | ModelInstalledEvent | ModelRejectedEvent | ModelCacheCorruptEvent | ModelTrialStartedEvent
    | ModelCommittedEvent | ModelRolledBackEvent | ShadowStartedEvent | ShadowStoppedEvent
)

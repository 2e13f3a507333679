"""The daemon's vocabulary: every enum that crosses a module boundary or the wire, in one low layer.

Nothing here imports anything of edge_agent, so every layer (link, sensors, executor, commands,
daemon, health, reports) may import it. docs/asyncapi.yaml mirrors these enums by name
(`x-enum-source: edge_agent.vocab:...`) and tests/test_asyncapi.py compares the two; adding a
value is a documented change.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum
from types import MappingProxyType


class ErrorCode(StrEnum):
    """Stable reply error codes (also the executor's refusal codes)."""

    # The payload itself.
    BAD_JSON = "bad_json"
    TOO_LARGE = "too_large"
    TOO_DEEP = "too_deep"
    NOT_OBJECT = "not_object"
    MISSING_ID = "missing_id"
    BAD_ID = "bad_id"
    DUPLICATE_ID = "duplicate_id"  # the id was already used for another command
    BAD_VERSION = "bad_version"
    UNKNOWN_COMMAND = "unknown_command"
    BAD_ARGS = "bad_args"
    # Admission and execution.
    BUSY = "busy"
    REFUSED = "refused"
    NOT_ADMITTED = "not_admitted"
    ESTOP_ACTIVE = "estop_active"
    CAUSE_PRESENT = "cause_present"
    NOTHING_TO_RESUME = "nothing_to_resume"
    OUT_OF_WORKSPACE = "out_of_workspace"
    UNREACHABLE = "unreachable"
    EXPIRED = "expired"
    STALE = "stale"  # sent before the latest stop or reset (commands/freshness.py)
    CLOCK_SKEW = "clock_skew"  # `ts` further ahead of the daemon's clock than allowed
    RETAINED = "retained"  # a retained MQTT message is never a command
    RATE_LIMITED = "rate_limited"
    DISABLED = "disabled"
    NOT_IMPLEMENTED = "not_implemented"  # no handler registered for a known command
    TIMEOUT = "timeout"
    OVERLOADED = "overloaded"  # a transport's inbox overflowed
    INTERNAL = "internal"


class Mode(StrEnum):
    """The executor's externally visible mode (`state.mode`; one column of the admission matrix)."""

    IDLE = "idle"
    RUNNING = "running"
    HOLDING = "holding"
    DIAGNOSTIC = "diagnostic"
    MANUAL = "manual"
    PROTECTIVE_STOP = "protective_stop"
    ESTOP = "estop"


class State(StrEnum):
    """Every state of the executor's machine (`state.state`; a policy observation's one-hot)."""

    IDLE = "idle"
    APPROACH = "approach"
    GRASP = "grasp"
    LIFT = "lift"
    TRANSFER = "transfer"
    RELEASE = "release"
    RETREAT = "retreat"
    HOLDING = "holding"
    DIAGNOSTIC = "diagnostic"
    MANUAL = "manual"
    PROTECTIVE_STOP = "protective_stop"
    ESTOP = "estop"


class StopKind(StrEnum):
    ESTOP = "estop"
    PROTECTIVE = "protective_stop"


class StopCause(StrEnum):
    ESTOP_INPUT = "estop_input"  # the hardware button
    ESTOP_MQTT = "estop_mqtt"
    ESTOP_FLEET = "estop_fleet"
    ESTOP_LOCAL = "estop_local"  # CLI / control socket
    ESTOP_SIGNAL = "estop_signal"  # SIGUSR1
    LINK_FAULT = "link_fault"
    GUARDIAN_LOST = "guardian_lost"
    DEADMAN = "deadman"
    COLLISION = "collision"
    JOG_LOST = "jog_lost"
    SENSOR_BOUND = "sensor_bound"
    SNAPSHOT_FAILED = "snapshot_failed"
    UNCLEAN_RESTART = "unclean_restart"


ESTOP_CAUSES: frozenset[StopCause] = frozenset({
    StopCause.ESTOP_INPUT, StopCause.ESTOP_MQTT, StopCause.ESTOP_FLEET,
    StopCause.ESTOP_LOCAL, StopCause.ESTOP_SIGNAL,
})

# Where an `estop` command came from (the transport's name) -> the latch cause it trips.
ESTOP_SOURCE_CAUSE: Mapping[str, StopCause] = MappingProxyType({
    "mqtt": StopCause.ESTOP_MQTT,
    "fleet": StopCause.ESTOP_FLEET,
    "socket": StopCause.ESTOP_LOCAL,
    "signal": StopCause.ESTOP_SIGNAL,
})


def estop_cause(source: str) -> StopCause:
    """The cause an `estop` from `source` trips; any other caller (the CLI in-process) is local."""
    return ESTOP_SOURCE_CAUSE.get(source, StopCause.ESTOP_LOCAL)


class EventType(StrEnum):
    """`event.type`: every event the daemon publishes (docs/asyncapi.yaml EventType)."""

    # daemon: start-up, link, stop latch, MQTT
    READY = "ready"
    ESTIMATORS_READY = "estimators_ready"
    POLICY_READY = "policy_ready"
    CALIBRATION_READY = "calibration_ready"
    CALIBRATION_FAILED = "calibration_failed"
    SNAPSHOT_CORRUPT = "snapshot_corrupt"
    JOURNAL_DISABLED = "journal_disabled"
    LINK_UP = "link_up"
    LINK_FAULT = "link_fault"
    DEADMAN_HOLD = "deadman_hold"
    FIRMWARE_EVENT = "firmware_event"
    ESTOP_INPUT = "estop_input"
    STOP = "stop"
    STOP_UPDATE = "stop_update"
    STOP_CLEARED = "stop_cleared"
    MQTT_CONNECTED = "mqtt_connected"
    MQTT_DISCONNECTED = "mqtt_disconnected"
    # executor
    TASK_STARTED = "task_started"
    TASK_RESUMED = "task_resumed"
    TASK_FROZEN = "task_frozen"
    TASK_DONE = "task_done"
    ATTEMPT_STARTED = "attempt_started"
    ATTEMPT_FAILED = "attempt_failed"
    SUBGOAL_REACHED = "subgoal_reached"
    PART_LOST_HOLD = "part_lost_hold"
    REGRASP = "regrasp"
    REGRASP_REFUSED = "regrasp_refused"
    DIAGNOSTIC = "diagnostic"
    MODE_CHANGED = "mode_changed"
    COLLISION = "collision"
    JOG_LOST = "jog_lost"
    SENSOR_LOST = "sensor_lost"
    SENSOR_BACK = "sensor_back"
    # health (edge_agent/health/): a degradation mode entered / left
    DEGRADED = "degraded"
    RECOVERED = "recovered"
    # reports
    REPORT_DROPPED = "report_dropped"
    # inference (edge_agent.inference.backend.EventKind carries these values)
    INFERENCE_BACKEND_UP = "inference_backend_up"
    INFERENCE_BACKEND_DOWN = "inference_backend_down"
    INFERENCE_LOAD_FAILED = "inference_load_failed"
    INFERENCE_ATTEMPT_FAILED = "inference_attempt_failed"
    GPU_UNAVAILABLE = "gpu_unavailable"
    GPU_FAILED = "gpu_failed"
    INFERENCE_FALLBACK = "inference_fallback"
    MODEL_INSTALLED = "model_installed"
    MODEL_REJECTED = "model_rejected"
    MODEL_CACHE_CORRUPT = "model_cache_corrupt"
    # the model trial after model.update (daemon/model_trial.py, docs/MODELS.md)
    MODEL_TRIAL_STARTED = "model_trial_started"
    MODEL_COMMITTED = "model_committed"
    MODEL_ROLLED_BACK = "model_rolled_back"
    SHADOW_STARTED = "shadow_started"  # model.shadow: a candidate runs beside the policy
    SHADOW_STOPPED = "shadow_stopped"  # stopped (its report filed) or dropped by a restart


class DegradationMode(StrEnum):
    """A degradation mode (`state.degraded`): the daemon keeps working with a part lost."""

    CPU_INFERENCE = "cpu_inference"  # the GPU is lost or unusable: the policy runs on the CPU
    REMOTE_POLICY_LOST = "remote_policy_lost"  # Triton unreachable: the local model decides
    CACHED_POLICY = "cached_policy"  # the current model unusable: the last-known-good decides
    RULE_POLICY = "rule_policy"  # no model usable: the rule-based expert decides
    SENSOR_PREDICTED = "sensor_predicted"  # a channel lost: Kalman-predicted inside its bound
    SENSOR_FILTERED = "sensor_filtered"  # a spike storm on a channel: its running median is used
    BROKER_LOST = "broker_lost"  # MQTT down: commands only over the local socket, outbound buffered
    # the state dir's disk under store.min_free_bytes (or the snapshot reserve not whole): the
    # journal and report plots shed, snapshots written into the preallocated reserve
    STORAGE_LOW = "storage_low"

"""Event records of the health monitor, the report outbox, inference and the model trial/shadow.

Part of edge_agent/contract/events.py (which unites them in `Event`); same conventions.
"""

# No `from __future__ import annotations`: TypedDict reads NotRequired from live annotations.
from typing import Annotated, Any, Literal, TypedDict

from edge_agent.contract.base import EventBase, Ref, S
from edge_agent.contract.status_model import TrialEvidence
from edge_agent.vocab import DegradationMode, EventType

ET = EventType
CommitBy = Literal["tasks", "time"]  # what committed a model on trial
Subject = Annotated[str, "what within the mode: a sensor channel for sensor_predicted and "
                    "sensor_filtered, else empty"]
Figures = Annotated[dict[str, Any], "the deciding run's figures"]


# --------------------------------------------------------------------------------------- health
class DegradedEvent(EventBase):
    """A degradation mode entered (docs/HEALTH.md)."""

    type: Literal[ET.DEGRADED]
    mode: Annotated[DegradationMode, Ref("DegradationMode")]
    subject: Subject
    probe: Annotated[str, "the probe whose runs decided it (status.health.probes)"]
    cause: Annotated[str, "the deciding run's message"]
    figures: Figures


class RecoveredEvent(EventBase):
    """A degradation mode left (docs/HEALTH.md)."""

    type: Literal[ET.RECOVERED]
    mode: Annotated[DegradationMode, Ref("DegradationMode")]
    subject: Subject
    probe: Annotated[str, "the probe whose runs decided it (status.health.probes)"]
    cause: Annotated[str, "the deciding run's message"]
    figures: Figures


class ReportDroppedEvent(EventBase):
    """The report outbox was full: its oldest report was dropped."""

    type: Literal[ET.REPORT_DROPPED]
    id: Annotated[str, "the dropped report's id"]
    dropped: Annotated[int, "reports dropped so far", S(minimum=0)]


# ------------------------------------------------------------------------------------ inference
class InferenceFields(EventBase):
    backend: Annotated[str, "the backend concerned (triton, local, cached, ...)"]
    detail: str


class InferenceBackendUpEvent(InferenceFields):
    """A backend loaded, or is ready again after being down."""

    type: Literal[ET.INFERENCE_BACKEND_UP]


class InferenceBackendDownEvent(InferenceFields):
    """A backend is no longer ready (server gone, model unloaded)."""

    type: Literal[ET.INFERENCE_BACKEND_DOWN]


class InferenceLoadFailedEvent(InferenceFields):
    """A session or client could not be created."""

    type: Literal[ET.INFERENCE_LOAD_FAILED]


class InferenceAttemptFailedEvent(InferenceFields):
    """One decision's attempt failed: error, NaN, deadline."""

    type: Literal[ET.INFERENCE_ATTEMPT_FAILED]


class GpuUnavailableEvent(InferenceFields):
    """An accelerator was asked for; the runtime lacks it."""

    type: Literal[ET.GPU_UNAVAILABLE]


class GpuFailedEvent(InferenceFields):
    """A run on the accelerator raised; the session moves to the CPU."""

    type: Literal[ET.GPU_FAILED]


class InferenceFallbackEvent(InferenceFields):
    """The backend that decides changed."""

    type: Literal[ET.INFERENCE_FALLBACK]


class ModelInstalledEvent(InferenceFields):
    """model.update verified and swapped in."""

    type: Literal[ET.MODEL_INSTALLED]


class ModelRejectedEvent(InferenceFields):
    """model.update refused (hash, load or shape mismatch)."""

    type: Literal[ET.MODEL_REJECTED]


class ModelCacheCorruptEvent(InferenceFields):
    """A cached model failed verification."""

    type: Literal[ET.MODEL_CACHE_CORRUPT]


# -------------------------------------------------------------------------- model trial, shadow
class ModelName(TypedDict):
    """A model: name, version, sha256."""

    name: str | None
    version: str | None
    sha256: str


class TrialBaseline(TypedDict):
    """The previous model's judged episodes and successes."""

    episodes: Annotated[int, S(minimum=0)]
    successes: Annotated[int, S(minimum=0)]


class ModelTrialStartedEvent(EventBase):
    """A trial of a new model started (docs/MODELS.md "Trial, commit and rollback")."""

    type: Literal[ET.MODEL_TRIAL_STARTED]
    sha256: str
    name: str | None
    version: str | None
    previous: Annotated[str | None, "the previous model's sha256"]
    tasks_required: Annotated[int, S(minimum=1)]
    deadline_wall: float
    baseline: TrialBaseline


class ModelCommittedEvent(EventBase):
    """The trial passed: the model is committed."""

    type: Literal[ET.MODEL_COMMITTED]
    sha256: str
    name: str | None
    version: str | None
    by: CommitBy
    tasks: Annotated[int, S(minimum=0)]
    successes: Annotated[int, S(minimum=0)]
    evidence: TrialEvidence


class ModelRolledBackEvent(EventBase):
    """The trial failed (or the daemon died during it): the previous model is back."""

    type: Literal[ET.MODEL_ROLLED_BACK]
    sha256: str
    name: str | None
    version: str | None
    to: Annotated[ModelName | None, "the model restored"]
    reasons: list[str]
    at_start: Annotated[bool, "found at start (kill -9 or crash during the trial)"]
    error: str | None
    evidence: TrialEvidence
    verdict_to_rollback_ms: float | None
    first_slow_to_rollback_s: float | None


class ShadowStartedEvent(EventBase):
    """model.shadow: a candidate runs beside the acting policy."""

    type: Literal[ET.SHADOW_STARTED]
    candidate: ModelName
    report_after: Annotated[int, S(minimum=0)]


class ShadowStoppedEvent(EventBase):
    """The shadow stopped (its report filed) or was dropped by a restart."""

    type: Literal[ET.SHADOW_STOPPED]
    candidate: ModelName
    decisions: Annotated[int, S(minimum=0)]
    agreement: Annotated[float | None, S(minimum=0, maximum=1)]
    dropped: Annotated[int, S(minimum=0)]
    report: Annotated[str | None, "the filed report's id"]

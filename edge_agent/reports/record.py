"""The repair report as a value, and the typed fault records it is built from.

A report is built from records captured when the fault happened (a stop, an L3 fault record, a
mode change), never from live executor state: `StopRecord`, `DiagnosisRecord` and `ModeRecord`
are what a source hands to the reports layer; `Report` is what the outbox persists, renders and
delivers. Both are frozen and round-trip through plain JSON (`as_dict` / `from_dict`).
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

REPORT_VERSION = 1
_CROCKFORD = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"


class ReportKind(StrEnum):
    """What a report is about (docs/asyncapi.yaml ReportKind)."""

    ESTOP = "estop"
    PROTECTIVE_STOP = "protective_stop"
    DIAGNOSIS = "diagnosis"  # L3: too many failed attempts in a row
    MODE_ENTERED = "mode_entered"  # a degradation mode (fed by the health monitor, #18)
    MODE_LEFT = "mode_left"
    DRIFT = "drift"  # the periodic policy drift report (issue #28; daemon/drift.py)
    MODEL_ROLLBACK = "model_rollback"  # a model trial rolled back (daemon/model_trial.py, #29)
    SHADOW = "shadow"  # a shadow candidate's summary (issue #29; daemon/shadow.py)


def new_report_id(wall: float | None = None) -> str:
    """A ULID: 48 bits of milliseconds + 80 random bits, Crockford base32 (sorts by time)."""
    ms = int((time.time() if wall is None else wall) * 1000) & ((1 << 48) - 1)
    value = (ms << 80) | int.from_bytes(os.urandom(10), "big")
    return "".join(_CROCKFORD[(value >> (5 * i)) & 31] for i in range(25, -1, -1))


def is_report_id(text: str) -> bool:
    return len(text) == 26 and all(c in _CROCKFORD for c in text)


# -- what the sources hand over -------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class StopRecord:
    """A stop latched: its kind and cause, what ran, and the sensor window before it."""

    kind: str  # "estop" | "protective_stop"
    cause: str  # a StopCause value
    causes: tuple[str, ...]
    hardware_input: bool
    wall: float
    mono: float
    mode: str  # the executor's mode when it latched
    state: str
    task: Mapping[str, Any] | None
    window: Mapping[str, Any] | None  # monitor.window_of(...)


@dataclass(frozen=True, slots=True)
class DiagnosisRecord:
    """The executor's L3 fault record (executor/faults.py `FaultRecord`)."""

    wall: float
    mono: float
    record: Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class ModeRecord:
    """A degradation mode entered or left (the health monitor's decision, issue #18).

    `recovery` is the mode's own rule in words ("back on the GPU after 3 good probes"),
    `next_probe_wall` when the next probe runs (None: not scheduled)."""

    mode: str
    entered: bool
    reason: str
    wall: float
    mono: float
    capabilities: tuple[str, ...]
    fallback: str | None
    recovery: str
    next_probe_wall: float | None = None
    figures: Mapping[str, Any] = field(default_factory=dict)


FaultRecord = StopRecord | DiagnosisRecord | ModeRecord


@dataclass(frozen=True, slots=True)
class Origin:
    """Which robot, boot, configuration and model a report comes from."""

    device: str
    boot_id: str
    config_hash: str
    model_sha: str | None = None


@dataclass(frozen=True, slots=True)
class Scope:
    """What the fault affects: capabilities out of service, the task and state it hit."""

    capabilities: tuple[str, ...]
    mode: str | None = None
    state: str | None = None
    task_id: str | None = None


# -- the report ------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Report:
    """One repair report (what the outbox persists and every sink delivers)."""

    id: str
    kind: ReportKind
    fault: str  # the merge key: repeats of one fault share it ("protective_stop:collision")
    title: str
    wall: float  # UTC seconds since the epoch
    mono: float  # the daemon's monotonic clock (same boot only)
    origin: Origin
    scope: Scope
    measures: tuple[str, ...]
    recovery: str
    checks: tuple[str, ...]
    details: Mapping[str, Any]
    window: Mapping[str, Any] | None  # columns + raw rows, or None
    decisions: tuple[Mapping[str, Any], ...]  # the newest journal decisions, oldest first
    v: int = REPORT_VERSION
    recording: str | None = None  # the flight recorder's MCAP file of it (docs/OBSERVE.md)

    @property
    def has_plot(self) -> bool:
        """A plot is drawn for it: a sensor window, or the drift report's action bars."""
        return bool(self.window) or self.kind is ReportKind.DRIFT

    def as_dict(self) -> dict[str, Any]:
        return {"v": self.v, "id": self.id, "kind": self.kind.value, "fault": self.fault,
                "title": self.title, "wall": self.wall, "mono": self.mono,
                "origin": {"device": self.origin.device, "boot_id": self.origin.boot_id,
                           "config_hash": self.origin.config_hash,
                           "model_sha": self.origin.model_sha},
                "scope": {"capabilities": list(self.scope.capabilities),
                          "mode": self.scope.mode, "state": self.scope.state,
                          "task_id": self.scope.task_id},
                "measures": list(self.measures), "recovery": self.recovery,
                "checks": list(self.checks), "details": dict(self.details),
                "window": dict(self.window) if self.window is not None else None,
                "decisions": [dict(d) for d in self.decisions], "recording": self.recording}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Report:
        """Rebuild a persisted report (KeyError / ValueError / TypeError when malformed)."""
        if int(d["v"]) != REPORT_VERSION:
            raise ValueError(f"report format {d['v']} (this build reads {REPORT_VERSION})")
        o, s = d["origin"], d["scope"]
        window = d.get("window")
        return cls(
            id=str(d["id"]), kind=ReportKind(d["kind"]), fault=str(d["fault"]),
            title=str(d["title"]), wall=float(d["wall"]), mono=float(d["mono"]),
            origin=Origin(str(o["device"]), str(o["boot_id"]), str(o["config_hash"]),
                          o.get("model_sha")),
            scope=Scope(tuple(str(c) for c in s["capabilities"]), s.get("mode"), s.get("state"),
                        s.get("task_id")),
            measures=_strs(d["measures"]), recovery=str(d["recovery"]),
            checks=_strs(d["checks"]), details=dict(d.get("details") or {}),
            window=dict(window) if isinstance(window, Mapping) else None,
            decisions=tuple(dict(x) for x in d.get("decisions") or ()),
            recording=str(d["recording"]) if d.get("recording") else None)


def _strs(values: Sequence[Any]) -> tuple[str, ...]:
    if isinstance(values, str):
        raise TypeError("expected a list of strings")
    return tuple(str(v) for v in values)

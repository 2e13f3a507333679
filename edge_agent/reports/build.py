"""From a fault record to a report: the title, scope, measures, expected recovery, what to check.

Pure: `build_report(record, origin, decisions)` reads only its arguments (the records were
captured when the fault happened), so the same record always gives the same report text.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from typing import Any

from edge_agent.reports.record import (
    DiagnosisRecord,
    FaultRecord,
    ModeRecord,
    Origin,
    Report,
    ReportKind,
    Scope,
    StopRecord,
    new_report_id,
)

MOTION = ("motion", "task.start", "resume", "manual.jog")

# One line an operator understands at a glance, per stop cause.
_STOP_TITLES: dict[str, str] = {
    "estop_input": "Emergency stop: the e-stop button was pressed",
    "estop_mqtt": "Emergency stop: requested over MQTT",
    "estop_fleet": "Emergency stop: fleet-wide e-stop",
    "estop_local": "Emergency stop: requested on the robot's local socket / CLI",
    "estop_signal": "Emergency stop: SIGUSR1 sent to the daemon",
    "link_fault": "Protective stop: the serial link to the drives failed",
    "guardian_lost": "Protective stop: the link guardian process was lost",
    "deadman": "Protective stop: the command stream stopped (deadman)",
    "collision": "Protective stop: collision detected (joint current over its bound)",
    "jog_lost": "Protective stop: the jog stream stopped",
    "sensor_bound": "Protective stop: a sensor was lost past its prediction bound",
    "snapshot_failed": "Protective stop: the state snapshot could not be written",
    "unclean_restart": "Protective stop: the daemon restarted after a crash",
}

_STOP_CHECKS: dict[str, tuple[str, ...]] = {
    "estop_input": ("Why the button was pressed: ask the person who pressed it.",
                    "The work cell is clear of people and parts out of place.",
                    "Release the button (a reset is refused while it is pressed)."),
    "estop_mqtt": ("Who sent the e-stop (the broker's log of the `cmd/estop` publisher).",
                   "The work cell is clear."),
    "estop_fleet": ("Why the fleet was stopped (the fleet e-stop topic's publisher).",
                    "The work cell is clear."),
    "estop_local": ("Who used the local socket / CLI on the controller.",
                    "The work cell is clear."),
    "estop_signal": ("Which process sent SIGUSR1 (journalctl on the controller).",),
    "link_fault": ("The serial cable and connector to the drive controller.",
                   "The drive controller is powered and its firmware answers HELLO.",
                   "`link.port` names the right device (dmesg for USB re-enumeration)."),
    "guardian_lost": ("journalctl -u edge-agent for the guardian's exit (crash, OOM kill).",
                      "The tty is still present (`ls -l` on link.port)."),
    "deadman": ("The controller's load (a starved control loop trips the deadman).",
                "`status.loop` late/overrun figures and the host's CPU steal."),
    "collision": ("The arm and the work cell for an obstacle or a trapped part.",
                  "The joint named in the details: cable, gearbox, brake.",
                  "Whether a heavier part than configured was picked."),
    "jog_lost": ("The jog client's connection (a jog stream is a deadman: ttl_ms).",),
    "sensor_bound": ("The sensor named in the details: cable, power, its own status.",),
    "snapshot_failed": ("Free space and health of the state directory's disk "
                        "(df, dmesg for I/O errors).",),
    "unclean_restart": ("journalctl -u edge-agent before the restart: crash, OOM kill, "
                        "power loss.", "The robot's pose before moving it again."),
}

_DIAGNOSIS_CHECKS = (
    "The failed attempts (the report's details): the same state and kind in a row points at "
    "hardware.",
    "The gripper (fingers, force sensor, current limit) when grasp or carry failed.",
    "The part and its pose: present, where the camera says, the configured type.",
    "The sensor window: forces and currents during the failed attempts.",
)


def build_report(record: FaultRecord, origin: Origin,
                 decisions: Sequence[Mapping[str, Any]] = (),
                 report_id: str | None = None) -> Report:
    """The report for one record (see the module doc)."""
    if isinstance(record, StopRecord):
        return _stop_report(record, origin, decisions, report_id)
    if isinstance(record, DiagnosisRecord):
        return _diagnosis_report(record, origin, decisions, report_id)
    return _mode_report(record, origin, decisions, report_id)


def _stop_report(r: StopRecord, origin: Origin, decisions: Sequence[Mapping[str, Any]],
                 report_id: str | None) -> Report:
    estop = r.kind == "estop"
    kind = ReportKind.ESTOP if estop else ReportKind.PROTECTIVE_STOP
    task = dict(r.task) if r.task else None
    title = _STOP_TITLES.get(r.cause, f"{'Emergency' if estop else 'Protective'} stop: {r.cause}")
    measures = ["Drives disabled: stop frame sent at once (category 0/1), latched."
                if estop else
                "Joints hold position with power on (category 2), latched.",
                "No motion command passes until a reset (in the link guardian too).",
                "State snapshot saved (the latch survives a restart)."]
    if task:
        measures.append(f"Task {task.get('task_id')} frozen in state {task.get('state')}; "
                        "it can be resumed after the reset.")
    if estop:
        recovery = ("Needs an operator: go through what to check, release the e-stop input, then "
                    "send `reset` (refused while the input is pressed; it never moves the robot)"
                    "; then `resume` the frozen task or start a new one.")
    elif r.cause == "unclean_restart":
        recovery = ("Needs an operator: check the robot's pose, then `reset` (it never moves "
                    "the robot); the task before the crash is not resumed.")
    else:
        recovery = ("Needs an operator: once the cause is gone, send `reset` (refused while it "
                    "is present; it never moves the robot); then `resume` the frozen task.")
    details: dict[str, Any] = {"cause": r.cause, "causes": list(r.causes),
                               "hardware_input": r.hardware_input}
    if task:
        details["task"] = task
    return Report(
        id=report_id or new_report_id(r.wall), kind=kind, fault=f"{kind.value}:{r.cause}",
        title=title, wall=r.wall, mono=r.mono, origin=origin,
        scope=Scope(MOTION, r.mode, r.state, task.get("task_id") if task else None),
        measures=tuple(measures), recovery=recovery,
        checks=_STOP_CHECKS.get(r.cause, ("The cause named in the details.",)),
        details=details, window=r.window, decisions=tuple(decisions))


def _diagnosis_report(r: DiagnosisRecord, origin: Origin,
                      decisions: Sequence[Mapping[str, Any]], report_id: str | None) -> Report:
    rec = dict(r.record)
    failures = [dict(f) for f in rec.get("last_failures") or () if isinstance(f, Mapping)]
    kinds = sorted({f"{f.get('state')}:{f.get('kind')}" for f in failures})
    title = (f"Diagnosis: {rec.get('l3_count')} failed attempts in a row"
             + (f" ({', '.join(kinds)})" if kinds else ""))
    window = rec.pop("sensor_window", None)
    measures = ("Task ended `failed`; the robot holds (controlled hold: the gripper keeps its "
                "force, a held part is not dropped).",
                "The executor is in `diagnostic`: task.start is refused until a reset.",
                "The last seconds of sensor data were captured (the report's sensor window).")
    recovery = ("Needs an operator: go through what to check, then send `reset` (it leaves "
                "diagnostic and clears the failure count; it never moves the robot).")
    return Report(
        id=report_id or new_report_id(r.wall), kind=ReportKind.DIAGNOSIS,
        fault="diagnosis:" + (",".join(kinds) or "unknown"), title=title, wall=r.wall,
        mono=r.mono, origin=origin,
        scope=Scope(("task.start", "resume"), "diagnostic", rec.get("state"),
                    rec.get("task_id")),
        measures=measures, recovery=recovery, checks=_DIAGNOSIS_CHECKS, details=rec,
        window=window if isinstance(window, Mapping) and "rows" in window else None,
        decisions=tuple(decisions))


def _mode_report(r: ModeRecord, origin: Origin, decisions: Sequence[Mapping[str, Any]],
                 report_id: str | None) -> Report:
    kind = ReportKind.MODE_ENTERED if r.entered else ReportKind.MODE_LEFT
    title = (f"Degraded: {r.mode} ({r.reason})" if r.entered
             else f"Recovered: {r.mode} left ({r.reason})")
    recovery = r.recovery
    if r.entered and r.next_probe_wall is not None:
        recovery += f"; next probe at {utc(r.next_probe_wall, seconds=True)}"
    measures = ((f"Mode {r.mode} entered"
                 + (f"; fallback in use: {r.fallback}" if r.fallback else "") + ".",)
                if r.entered else (f"Mode {r.mode} left; normal operation.",))
    return Report(
        id=report_id or new_report_id(r.wall), kind=kind, fault=f"mode:{r.mode}", title=title,
        wall=r.wall, mono=r.mono, origin=origin, scope=Scope(r.capabilities),
        measures=measures, recovery=recovery,
        checks=(f"The probe's figures for {r.mode} (the report's details).",) if r.entered else (),
        details={"mode": r.mode, "reason": r.reason, **dict(r.figures)}, window=None,
        decisions=tuple(decisions))


def utc(wall: float, *, seconds: bool = False) -> str:
    """`2026-12-04 14:03:10.123 UTC` (or whole seconds)."""
    t = dt.datetime.fromtimestamp(wall, dt.UTC)
    text = t.strftime("%Y-%m-%d %H:%M:%S") + ("" if seconds else f".{t.microsecond // 1000:03d}")
    return text + " UTC"

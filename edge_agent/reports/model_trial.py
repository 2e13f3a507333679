"""The repair report of a model trial that ended in a rollback (daemon/model_trial.py), as a Report.

Pure: the trial record (daemon/trial_store.py) in, a `Report` of kind `model_rollback` out, filed
through the report outbox like every other report (disk, MQTT, chat). The evidence, the rules and
the baseline go in `details` (the Markdown's details table); the last journaled decisions show
the candidate's latencies.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from edge_agent.reports.build import utc as utc_wall
from edge_agent.reports.record import Origin, Report, ReportKind, Scope, new_report_id


def utc(wall: Any) -> str | None:
    return utc_wall(float(wall)) if isinstance(wall, int | float) else None


def _model(m: Mapping[str, Any] | None) -> str:
    if not m:
        return "none"
    return f"{m.get('name')} {m.get('version')} (sha256 {str(m.get('sha256'))[:12]})"


def build_rollback_report(trial: Mapping[str, Any], origin: Origin,
                          decisions: Sequence[Mapping[str, Any]], *, wall: float,
                          mono: float) -> Report:
    """The report of the rolled-back `trial` (its record, verdict included)."""
    verdict: Mapping[str, Any] = trial.get("verdict") or {}
    reasons = [str(r) for r in verdict.get("reasons") or ()] or ["(no reason recorded)"]
    cand = {k: trial.get(k) for k in ("name", "version", "sha256")}
    prev: Mapping[str, Any] | None = trial.get("previous")
    at_start = bool(trial.get("rolled_back_at_start"))
    title = (f"Model {cand['name']} {cand['version']} rolled back on trial: {reasons[0]}")
    error = trial.get("rollback_error")
    first = (f"The rollback FAILED ({error}): the candidate still decides — install a good "
             "model with model.update" if error else f"Rolled back to {_model(prev)}")
    measures = (
        first
        + ("" if error else " at start-up, before the candidate decided again" if at_start
           else " at once, between two decisions (the policy only proposes discrete actions; "
                "no setpoint changed with the swap)") + ".",
        f"Marked {_model(cand)} bad: the daemon never installs it by itself, and model.update "
        "refuses it unless the command says \"allow_bad\": true.",
        "The candidate's files were dropped from the model cache; the restored model is its "
        "own last-known-good fallback.")
    ev: Mapping[str, Any] = trial.get("evidence") or {}
    details = {"candidate": cand, "previous": dict(prev) if prev else None,
               "restored": trial.get("restored"), "rollback_error": trial.get("rollback_error"),
               "reasons": reasons, "started": utc(trial.get("started_wall")),
               "ended": utc(trial.get("ended_wall")),
               "tasks": f"{ev.get('tasks', 0)}/{(trial.get('rules') or {}).get('tasks')}",
               "evidence": dict(ev), "rules": dict(trial.get("rules") or {}),
               "baseline": trial.get("baseline"), "success_test": verdict.get("success"),
               "note": verdict.get("note"),
               "first_slow_to_rollback_s": trial.get("first_slow_to_rollback_s"),
               "verdict_to_rollback_ms": trial.get("verdict_to_rollback_ms"),
               "rolled_back_at_start": at_start}
    return Report(
        id=new_report_id(wall), kind=ReportKind.MODEL_ROLLBACK,
        fault=f"model_rollback:{str(cand['sha256'])[:12]}", title=title, wall=wall, mono=mono,
        origin=origin, scope=Scope(()), measures=measures,  # the policy runs on
        recovery=("The previous model decides from now; nothing moved by itself. The "
                  "candidate stays marked bad until a person installs it again with "
                  "\"allow_bad\": true (a new trial)."),
        checks=(*(f"Why the candidate failed: {r}" for r in reasons[:4]),
                "Replay the trial's episodes (`edge-agent journal episodes`) and gate the "
                "candidate against the restored model again (docs/MODELS.md) before another "
                "trial."),
        details=details, window=None, decisions=tuple(dict(d) for d in decisions))

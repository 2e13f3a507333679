"""The shadow report: how a candidate model, run beside the acting policy, would have decided.

Pure: `build_shadow_report(summary, why, origin, mono=...)` turns a shadow's summary
(inference/shadow.py `ShadowRunner.summary()`) into the Report the outbox files (disk, MQTT,
chat); `shadow_markdown` is its own Markdown section: agreement overall and per executor state,
the confusion of acting against shadow actions, latency of both on the same decisions, and the
first decisions where they differ (task id and step: `edge-agent journal episodes` finds the
task, the shadow journal the candidate's decision).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from edge_agent.reports.drift import plural
from edge_agent.reports.md_table import table as _table
from edge_agent.reports.record import Origin, Report, ReportKind, Scope, new_report_id

WHY_TEXT = {"after": "after its first {n} decisions (inference.shadow_report_after)",
            "stopped": "when it was stopped (model.shadow stop)"}


def _pct(v: Any) -> str:
    return "—" if v is None else f"{100 * float(v):.1f} %"


def _ms(v: Any) -> str:
    return "—" if v is None else f"{float(v):.3f} ms"


def build_shadow_report(summary: Mapping[str, Any], why: str, origin: Origin, *, wall: float,
                        mono: float, report_id: str | None = None) -> Report:
    """The report of one shadow (`why`: `after` N decisions, or `stopped`)."""
    c = summary.get("candidate") or {}
    name = f"{c.get('name')} {c.get('version')}"
    n = int(summary.get("decisions") or 0)
    lat = summary.get("latency") or {}
    title = (f"Shadow {name}: agreement {_pct(summary.get('agreement'))} with the acting "
             f"policy over {plural(n, 'decision')}")
    when = WHY_TEXT.get(why, why).format(n=summary.get("report_after"))
    measures = (
        f"Candidate {name} (sha256 {str(c.get('sha256'))[:12]}) ran beside the acting policy "
        f"on the same observations, {when}; it never acted.",
        f"Latency P99: candidate {_ms(lat.get('shadow_p99_ms'))} (on its own thread), acting "
        f"{_ms(lat.get('acting_p99_ms'))}; {plural(summary.get('dropped', 0), 'decision')} "
        "dropped by the shadow's queue, "
        f"{plural(summary.get('errors', 0), 'candidate error')}.")
    recovery = ("Nothing changed on the robot. Where they differ, look at the tasks and steps "
                "listed (`edge-agent journal episodes`); install the candidate with "
                "model.update only if its decisions there are the better ones.")
    checks = ("The states with the lowest agreement, and the confusion: which actions the "
              "candidate would have taken instead.",
              "The decisions listed where they differ: the task and step in `edge-agent journal "
              "episodes`; the candidate's own decisions are in the shadow journal beside the "
              "decisions (`<state_dir>/journal/shadow.*.jnl`).")
    details = {"why": why, **{k: summary.get(k) for k in (
        "candidate", "since", "decisions", "agreement", "differ", "per_state", "latency",
        "confusion", "examples", "dropped", "skipped", "errors", "report_after")}}
    return Report(
        id=report_id or new_report_id(wall), kind=ReportKind.SHADOW,
        fault=f"shadow:{str(c.get('sha256'))[:12]}", title=title, wall=wall, mono=mono,
        origin=origin, scope=Scope(()), measures=measures, recovery=recovery, checks=checks,
        details=details, window=None, decisions=())


def shadow_cause(r: Report) -> str:
    """One line for chat: the agreement and where it is lowest."""
    d = r.details
    per = d.get("per_state") or {}
    rates = [(float(v["agreement"]), s) for s, v in per.items()
             if isinstance(v, Mapping) and v.get("agreement") is not None]
    least = min(rates, default=None)
    worst = (least[1], least[0]) if least is not None else None
    low = f"; lowest in {worst[0]} ({_pct(worst[1])})" if worst else ""
    return f"agreement {_pct(d.get('agreement'))} of {d.get('decisions')} decisions{low}"


def shadow_markdown(r: Report) -> list[str]:
    """The shadow report's own sections."""
    d = r.details
    lat = d.get("latency") or {}
    lines = ["## Agreement", "",
             f"**{_pct(d.get('agreement'))}** of {plural(d.get('decisions'), 'decision')} "
             f"({d.get('differ', 0)} differ). Dropped {d.get('dropped', 0)}, candidate errors "
             f"{d.get('errors', 0)}, acting no-decisions skipped {d.get('skipped', 0)}.", "",
             "## Per executor state", ""]
    rows: list[Sequence[Any]] = []
    for s, v in (d.get("per_state") or {}).items():
        rows.append((s, v.get("decisions"), _pct(v.get("agreement")),
                     _ms(v.get("acting_p50_ms")), _ms(v.get("acting_p99_ms")),
                     _ms(v.get("shadow_p50_ms")), _ms(v.get("shadow_p99_ms"))))
    rows.append(("all", d.get("decisions"), _pct(d.get("agreement")),
                 _ms(lat.get("acting_p50_ms")), _ms(lat.get("acting_p99_ms")),
                 _ms(lat.get("shadow_p50_ms")), _ms(lat.get("shadow_p99_ms"))))
    lines += _table(("state", "decisions", "agreement", "acting P50", "acting P99",
                     "shadow P50", "shadow P99"), rows)
    conf = d.get("confusion") or {}
    shadow_actions = sorted({a for row in conf.values() for a in row})
    lines += ["", "## Confusion (rows: acting action, columns: shadow action)", ""]
    if conf:
        lines += _table(("acting \\ shadow", *shadow_actions),
                        [(a, *(row.get(b, 0) for b in shadow_actions))
                         for a, row in conf.items()])
    else:
        lines.append("No decisions were compared.")
    ex = d.get("examples") or []
    lines += ["", "## Where they differ (the first ones)", ""]
    if ex:
        lines += _table(("task_id", "step", "state", "acting", "shadow", "acting backend"),
                        [(e.get("task_id") or "—", "—" if e.get("step") is None else e["step"],
                          e.get("state"), e.get("acting"), e.get("shadow"),
                          e.get("acting_backend") or "—") for e in ex])
    else:
        lines.append("Nowhere: every compared decision agreed.")
    return lines

"""The drift report: this period's policy behaviour against the last period's, as a Report.

Pure: `period_summary(counts, start, end, labels)` turns a period's counters
(store/drift_tally.py) into its summary; `compare(this, last, threshold)` gives the KL
divergence of the action distribution overall and per executor state; `build_drift_report`
makes the Report the outbox files (disk, MQTT, chat) and `drift_markdown` its Markdown.

KL(this ‖ last) in nats over the actions seen in either period plus the policy's own four, with
add-½ (Jeffreys) smoothing as in `edge-agent journal drift`, so an action unseen in one period
gives a finite figure. A state's KL counts for the verdict only when both periods hold at least
`MIN_DECISIONS` of its decisions (a handful of decisions says nothing); the verdict is `drift`
when the overall KL or one such state's is above the threshold.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from edge_agent.reports.build import utc
from edge_agent.reports.md_table import table as _table
from edge_agent.reports.record import Origin, Report, ReportKind, Scope, new_report_id

ACTIONS = ("continue", "advance", "retry_alternative", "abort", "none")
MIN_DECISIONS = 20
LABEL_VERDICTS = ("correct", "wrong", "needs_work")
DRIFT, NO_DRIFT, TOO_FEW = "drift", "no drift", "too few decisions"


def period_summary(counts: Mapping[str, Any], start: float, end: float,
                   labels: Mapping[str, int] | None) -> dict[str, Any]:
    """One period as the report carries it (`labels` None: they could not be counted)."""
    actions = {str(s): {str(a): int(n) for a, n in row.items()}
               for s, row in (counts.get("actions") or {}).items()}
    episodes = int(counts.get("episodes") or 0)
    outcomes = {str(k): int(v) for k, v in (counts.get("outcomes") or {}).items()}
    return {"start": round(start, 3), "end": round(end, 3),
            "decisions": sum(sum(row.values()) for row in actions.values()),
            "actions": actions, "episodes": episodes, "outcomes": outcomes,
            "success_rate": (round(outcomes.get("success", 0) / episodes, 4)
                             if episodes else None),
            "l3": int(counts.get("l3") or 0), "l1": int(counts.get("l1") or 0),
            "labels": dict(labels) if labels is not None else None}


def _kl(p_counts: Mapping[str, int], q_counts: Mapping[str, int]) -> float:
    keys = sorted({*ACTIONS, *p_counts, *q_counts})
    np_, nq = sum(p_counts.values()), sum(q_counts.values())
    total_p, total_q = np_ + 0.5 * len(keys), nq + 0.5 * len(keys)
    out = 0.0
    for k in keys:
        p = (p_counts.get(k, 0) + 0.5) / total_p
        q = (q_counts.get(k, 0) + 0.5) / total_q
        out += p * math.log(p / q)
    return out


def overall(actions: Mapping[str, Mapping[str, int]]) -> dict[str, int]:
    """Action counts over every state."""
    out: dict[str, int] = {}
    for row in actions.values():
        for a, n in row.items():
            out[a] = out.get(a, 0) + n
    return out


def compare(this: Mapping[str, Any], last: Mapping[str, Any] | None,
            threshold: float) -> dict[str, Any]:
    """KL overall and per state (None where a period has no decisions there) and the verdict."""
    if last is None or this["decisions"] < MIN_DECISIONS or last["decisions"] < MIN_DECISIONS:
        per: dict[str, float | None] = {s: None for s in sorted(this["actions"])}
        return {"verdict": TOO_FEW, "kl": None, "kl_per_state": per, "threshold": threshold,
                "drifted_states": []}
    a, b = this["actions"], last["actions"]
    per = {}
    drifted = []
    for s in sorted({*a, *b}):
        pa, pb = a.get(s, {}), b.get(s, {})
        if not pa or not pb:
            per[s] = None  # a state only one period visited: no distribution to compare
            continue
        per[s] = round(_kl(pa, pb), 6)
        if (sum(pa.values()) >= MIN_DECISIONS and sum(pb.values()) >= MIN_DECISIONS
                and per[s] > threshold):  # type: ignore[operator]
            drifted.append(s)
    kl = round(_kl(overall(a), overall(b)), 6)
    verdict = DRIFT if kl > threshold or drifted else NO_DRIFT
    return {"verdict": verdict, "kl": kl, "kl_per_state": per, "threshold": threshold,
            "drifted_states": drifted}


def build_drift_report(this: Mapping[str, Any], last: Mapping[str, Any] | None,
                       threshold: float, period_s: float, origin: Origin, *, mono: float,
                       report_id: str | None = None) -> Report:
    """The report of one period (`this`) against the one before (`last`, None: the first)."""
    cmp = compare(this, last, threshold)
    verdict, kl = cmp["verdict"], cmp["kl"]
    span = f"{utc(this['start'], seconds=True)} to {utc(this['end'], seconds=True)}"
    if verdict == DRIFT:
        where = ", ".join(cmp["drifted_states"]) or "overall"
        title = (f"Policy drift: KL {kl:.3g} nats (threshold {threshold:g}; "
                 f"states: {where})")
    elif verdict == NO_DRIFT:
        title = f"Policy drift report: no drift (KL {kl:.3g} nats, threshold {threshold:g})"
    else:
        title = (f"Policy drift report: too few decisions to compare ({this['decisions']} "
                 f"this period, {last['decisions'] if last else 'no'} last)")
    measures = (f"Period {span}: {plural(this['decisions'], 'decision')}, "
                f"{plural(this['episodes'], 'episode')}.",
                "Nothing was changed on the robot: a drift report informs, the policy keeps "
                "running.",
                "This period's counts are kept as the reference for the next report.")
    if verdict == DRIFT:
        recovery = ("Needs a person, not a stop: review this period's episodes (`edge-agent "
                    "journal episodes`), label the decisions that went wrong (`edge-agent "
                    "journal label`), export the journal and fine-tune a candidate policy.")
        checks: tuple[str, ...] = (
            f"The decisions in {where}: the action distribution and the KL per state in the "
            "full report.",
            "The success rate and the L3 count against the last period.",
            "What changed in the cell: parts, fixtures, lighting, a worn gripper, a new model.")
    else:
        recovery = "Nothing to do: the next report follows in one period."
        checks = ()
    details = {"verdict": verdict, "kl": kl, "threshold": threshold, "period_s": period_s,
               "kl_per_state": cmp["kl_per_state"], "drifted_states": cmp["drifted_states"],
               "this": dict(this), "last": dict(last) if last is not None else None}
    return Report(
        id=report_id or new_report_id(this["end"]), kind=ReportKind.DRIFT, fault="drift",
        title=title, wall=float(this["end"]), mono=mono, origin=origin, scope=Scope(()),
        measures=measures, recovery=recovery, checks=checks, details=details, window=None,
        decisions=())


def plural(n: Any, word: str) -> str:
    return f"{n} {word}" + ("" if n == 1 else "s")


def _pct(v: Any) -> str:
    return "—" if v is None else f"{100 * float(v):.1f} %"


def _labels(p: Mapping[str, Any] | None) -> str:
    if p is None:
        return "—"
    lab = p.get("labels")
    if lab is None:
        return "not counted"
    return ", ".join(f"{k} {int(lab.get(k, 0))}" for k in LABEL_VERDICTS)


def drift_markdown(r: Report, plot_name: str | None) -> list[str]:
    """The drift report's own sections (after the headline table, measures and checks)."""
    d = r.details
    this: Mapping[str, Any] = d.get("this") or {}
    last: Mapping[str, Any] | None = d.get("last")

    def _f(v: Any) -> str:
        return "—" if v is None else f"{float(v):.4g}"

    lines = ["## Verdict", "",
             f"**{d.get('verdict')}**: KL(this ‖ last) overall {_f(d.get('kl'))} nats, "
             f"threshold {d.get('threshold')} (a state counts with at least {MIN_DECISIONS} "
             "decisions in both periods).", "", "## This period against the last", ""]
    rows: list[Sequence[Any]] = [
        ("period", _span(this), _span(last)),
        ("decisions", this.get("decisions"), last.get("decisions") if last else "—"),
        ("episodes", this.get("episodes"), last.get("episodes") if last else "—"),
        ("success rate", _pct(this.get("success_rate")),
         _pct(last.get("success_rate")) if last else "—"),
        ("L3 (episodes ended in diagnostic)", this.get("l3"), last.get("l3") if last else "—"),
        ("labels", _labels(this), _labels(last))]
    lines += _table(("", "this period", "last period"), rows)
    lines += ["", "## Action distribution per executor state", ""]
    if plot_name:
        lines += [f"![action distribution]({plot_name})", ""]
    a, b = this.get("actions") or {}, (last or {}).get("actions") or {}
    per = d.get("kl_per_state") or {}
    acts = sorted({*ACTIONS, *(x for row in (*a.values(), *b.values()) for x in row)},
                  key=lambda x: (x not in ACTIONS, ACTIONS.index(x) if x in ACTIONS else 0, x))
    table: list[Sequence[Any]] = []
    for s in sorted({*a, *b}):
        table.append((s, _f(per.get(s)), *(f"{a.get(s, {}).get(x, 0)} / {b.get(s, {}).get(x, 0)}"
                                          for x in acts)))
    if table:
        lines += ["Counts as this period / last period.", ""]
        lines += _table(("state", "KL nats", *acts), table)
    else:
        lines.append("No decisions were journaled in either period.")
    return lines


def _span(p: Mapping[str, Any] | None) -> str:
    if not p:
        return "— (the first period)"
    return f"{utc(float(p['start']), seconds=True)} to {utc(float(p['end']), seconds=True)}"

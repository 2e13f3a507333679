"""The chat message of a report: a phone-sized summary in WeCom's classic `markdown`.

Classic `markdown` renders headings, bold, links, inline code, quotes and `<font color>` (info,
comment, warning) — nothing else: a table or a list arrives as raw `|` and `-`. So the summary
has neither: one bold label a line, the measures (`· `) and the checks (`(1) `) as quoted lines.
`markdown_v2` would render tables and lists, but it is a later addition to the group robot's API
(2025) without colours, and a summary needs no table; the full report (its tables, the sensor
window, the decisions) stays on disk and on MQTT `report`, and the summary says where. Every
value is one line (whitespace collapsed), so no field can start a list, a table row or a
heading; the text is redacted (the webhook's own URL, the MQTT password) and at most
`WECOM_MARKDOWN_MAX` bytes (cut at a line, the pointer to the full report kept).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from edge_agent.reports.build import utc
from edge_agent.reports.drift import plural
from edge_agent.reports.markdown import cut_markdown, redact
from edge_agent.reports.record import Report, ReportKind

WECOM_MARKDOWN_MAX = 4096
MERGED_IDS_SHOWN = 5
_MAX_FIELD = 400  # characters of one value (a reason, a title): a phone screen, not a log

_WARNING, _INFO = "warning", "info"


def chat_summary(report: Report, merged: Sequence[Report] = (), *, report_topic: str,
                 plot: bool = False, secrets: Iterable[str] = ()) -> str:
    """The summary of `report` (and the repeats merged into its message) as sent to the chat.

    `report_topic`: the MQTT topic the full report went to; `plot`: an image message follows."""
    r = report
    where = (f"**Report:** `{r.id}` · full text: `edge-agent reports show {r.id}` on "
             f"{_one(r.origin.device)}, or MQTT `{report_topic}`")
    lines = [f"## {_one(r.title)}"]
    if merged:
        lines += ["", _merged_line(r, merged)]
    lines += ["", f"**Cause:** {_cause(r)}",
              f"**Device:** {_one(r.origin.device)} (boot {r.origin.boot_id[:8]}, config "
              f"{_one(r.origin.config_hash)})",
              f"**Time:** {utc(r.wall)}"]
    affected = _affected(r)
    if affected:
        lines.append(f"**Affected:** {affected}")
    if r.kind in (ReportKind.MODE_ENTERED, ReportKind.MODE_LEFT):  # a few numbers: the check
        figures = {k: v for k, v in r.details.items()
                   if k not in ("mode", "reason") and v not in ("", None)}
        lines.append(f"**Figures:** {_one(', '.join(f'{k}={v}' for k, v in figures.items()))}")
    if r.kind is ReportKind.DRIFT:  # this period against the last, in one line
        lines.append(f"**Figures:** {_drift_figures(r)}")
    lines += ["", "**Done:**", *(f"> · {_one(m)}" for m in r.measures)]
    lines += ["", "**Check:**"]
    lines += ([f"> ({i}) {_one(c)}" for i, c in enumerate(r.checks, 1)] if r.checks
              else ["> Nothing to check."])
    lines += ["", f"**Recover:** {_one(r.recovery)}", "", where]
    if r.recording:
        lines.append(f"**Recording:** `{_one(r.recording)}` (MCAP: open it in Foxglove)")
    if plot:
        what = ("The action distribution per state" if r.kind is ReportKind.DRIFT
                else "The sensor window")
        lines.append(f'<font color="comment">{what} follows as an image.</font>')
    text = redact("\n".join(lines) + "\n", secrets)
    return cut_markdown(text, WECOM_MARKDOWN_MAX, redact(where, secrets))


def _cause(r: Report) -> str:
    d = r.details
    if r.kind in (ReportKind.ESTOP, ReportKind.PROTECTIVE_STOP):
        cause = str(d.get("cause", r.fault.partition(":")[2]))
        others = [str(c) for c in d.get("causes") or () if str(c) != cause]
        return (f'<font color="{_WARNING}">{_one(cause)}</font>'
                + (f" (also: {_one(', '.join(others))})" if others else ""))
    if r.kind is ReportKind.DIAGNOSIS:
        what = r.fault.partition(":")[2] or "unknown"
        return (f'<font color="{_WARNING}">{_one(what)}</font>: {d.get("l3_count", "?")} failed '
                "attempts in a row")
    if r.kind is ReportKind.DRIFT:
        verdict = str(d.get("verdict", "?"))
        kl = d.get("kl")
        return (f'<font color="{_WARNING if verdict == "drift" else _INFO}">{_one(verdict)}'
                f"</font>: KL {'—' if kl is None else f'{kl:.3g}'} nats, threshold "
                f"{d.get('threshold')}")
    if r.kind is ReportKind.MODEL_ROLLBACK:
        reasons = d.get("reasons") or ["?"]
        return (f'<font color="{_WARNING}">model rolled back</font>: '
                f"{_one(str(reasons[0]))}")
    if r.kind is ReportKind.SHADOW:
        from edge_agent.reports.shadow import shadow_cause

        return f'<font color="{_INFO}">shadow</font>: {_one(shadow_cause(r))}'
    colour, verb = (_WARNING, "entered") if r.kind is ReportKind.MODE_ENTERED else (_INFO, "left")
    return (f'<font color="{colour}">{_one(str(d.get("mode", "?")))} {verb}</font>: '
            f"{_one(str(d.get('reason', '')))}")


def _affected(r: Report) -> str:
    s = r.scope
    back = " back in service" if r.kind is ReportKind.MODE_LEFT else " out of service"
    out = ", ".join(s.capabilities) + back if s.capabilities else ""
    task = (f"task {s.task_id}" + (f" in {s.state}" if s.state else "")) if s.task_id else ""
    return _one("; ".join(x for x in (out, task) if x))


def _drift_figures(r: Report) -> str:
    def part(p: Any) -> str:
        if not isinstance(p, Mapping):
            return "none (the first period)"
        rate = p.get("success_rate")
        lab = p.get("labels")
        labels = ("labels not counted" if not isinstance(lab, Mapping) else "labels "
                  + "/".join(str(lab.get(k, 0)) for k in ("correct", "wrong", "needs_work")))
        return (f"{plural(p.get('decisions'), 'decision')}, "
                f"{plural(p.get('episodes'), 'episode')}, success "
                f"{'—' if rate is None else f'{100 * rate:.0f} %'}, L3 {p.get('l3')}, {labels}")

    return _one(f"this period {part(r.details.get('this'))}; last {part(r.details.get('last'))}"
                " (labels correct/wrong/needs_work)")


def _merged_line(r: Report, merged: Sequence[Report]) -> str:
    ids = [r.id, *(m.id for m in merged)]
    shown = ", ".join(f"`{i}`" for i in ids[:MERGED_IDS_SHOWN])
    more = len(ids) - MERGED_IDS_SHOWN
    last = max(m.wall for m in merged)
    return (f"**{len(ids)}× this fault** between {utc(r.wall)} and {utc(last)}: reports "
            f"{shown}" + (f" and {more} more (`edge-agent reports list`)" if more > 0 else ""))


def _one(text: str) -> str:
    """One line, at most _MAX_FIELD characters: a value never starts a block of its own."""
    line = " ".join(str(text).split())
    return line if len(line) <= _MAX_FIELD else line[:_MAX_FIELD - 1] + "…"

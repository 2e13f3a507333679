"""A report as Markdown: headline facts, scope, measures, recovery, checks, window and decisions.

Tables are GitHub-flavoured (pipes); the sensor window is downsampled to `max_rows` evenly
spaced rows (first and last kept) — the full window is in the report's JSON and its plot.
`redact` removes secrets from any text; `cut_markdown` shortens a text at a line boundary to
fit a byte budget and says where the full report is.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from edge_agent.reports.build import utc
from edge_agent.reports.md_table import cell as _cell
from edge_agent.reports.md_table import one_line as _line
from edge_agent.reports.md_table import table as _table
from edge_agent.reports.record import Report, ReportKind

REDACTED = "***"


def render_markdown(report: Report, *, max_rows: int = 20, plot_name: str | None = None,
                    secrets: Iterable[str] = ()) -> str:
    """The whole report as Markdown (`plot_name`: the PNG's file name beside the .md)."""
    r = report
    lines = [f"# {_cell(r.title)}", ""]
    lines += _table(("", ""), [
        ("report", f"`{r.id}` ({r.kind.value})"),
        ("time", f"{utc(r.wall)} (monotonic {r.mono:.3f} s)"),
        ("device", r.origin.device), ("boot", r.origin.boot_id),
        ("config hash", r.origin.config_hash),
        ("model sha256", r.origin.model_sha or "none loaded"),
        *([("recording", f"`{r.recording}` (MCAP, docs/OBSERVE.md)")] if r.recording else [])])
    lines += ["", "## Affected", ""]
    scope = [("capabilities out of service", ", ".join(r.scope.capabilities) or "none")]
    scope += [(k, v) for k, v in (("mode", r.scope.mode), ("state", r.scope.state),
                                  ("task", r.scope.task_id)) if v]
    lines += _table(("", ""), scope)
    lines += ["", "## Measures taken", ""] + [f"- {_line(m)}" for m in r.measures]
    lines += ["", "## Expected recovery", "", _line(r.recovery)]
    if r.checks:
        lines += ["", "## What to check", ""] + [f"{i}. {_line(c)}"
                                                 for i, c in enumerate(r.checks, 1)]
    if r.kind is ReportKind.DRIFT:  # its own figures; no sensor window, no decisions
        from edge_agent.reports.drift import drift_markdown

        lines += ["", *drift_markdown(r, plot_name)]
        return redact("\n".join(lines) + "\n", secrets)
    if r.kind is ReportKind.SHADOW:  # agreement, confusion, latency, where they differ
        from edge_agent.reports.shadow import shadow_markdown

        lines += ["", *shadow_markdown(r)]
        return redact("\n".join(lines) + "\n", secrets)
    if r.details:
        lines += ["", "## Details", "", *_table(("key", "value"), [
            (k, _value(v)) for k, v in r.details.items()])]
    lines += ["", "## Sensor window", "", *_window(r.window, max_rows, plot_name)]
    lines += ["", "## Last decisions", "", *_decisions(r.decisions)]
    text = "\n".join(lines) + "\n"
    return redact(text, secrets)


def redact(text: str, secrets: Iterable[str]) -> str:
    """`text` with every secret (and each long piece of one: a URL's token) replaced."""
    for s in secrets:
        for piece in secret_pieces(s):
            text = text.replace(piece, REDACTED)
    return text


def secret_pieces(secret: str) -> list[str]:
    """The secret itself, then its parts long enough to be a token (longest first)."""
    if not secret:
        return []
    pieces = {secret}
    for sep in ("?", "&", "=", "/", "@", ":"):
        pieces.update(p for chunk in list(pieces) for p in chunk.split(sep))
    return sorted((p for p in pieces if len(p) >= 8 and p not in _COMMON), key=len, reverse=True)


_COMMON = frozenset({"https", "http", "webhook", "localhost", "127.0.0.1"})


def cut_markdown(text: str, max_bytes: int, pointer: str) -> str:
    """`text` if it fits in `max_bytes` UTF-8 bytes, else its first whole lines + `pointer`."""
    data = text.encode()
    if len(data) <= max_bytes:
        return text
    tail = "\n" + pointer.strip("\n") + "\n"
    budget = max_bytes - len(tail.encode())
    if budget <= 0:
        return tail.encode()[:max_bytes].decode("utf-8", "ignore")
    out, used = [], 0
    for line in text.splitlines(keepends=True):
        n = len(line.encode())
        if used + n > budget:
            break
        out.append(line)
        used += n
    if not out:  # one huge first line: cut inside it on a character boundary
        out = [data[:budget].decode("utf-8", "ignore") + "\n"]
    return "".join(out).rstrip("\n") + "\n" + tail


def downsample(rows: Sequence[Sequence[Any]], max_rows: int) -> list[Sequence[Any]]:
    """At most `max_rows` rows, evenly spaced, the first and the last kept."""
    n = len(rows)
    if n <= max_rows or max_rows < 2:
        return list(rows[:max(max_rows, 0)] if max_rows < 2 else rows)
    idx = sorted({round(i * (n - 1) / (max_rows - 1)) for i in range(max_rows)})
    return [rows[i] for i in idx]


def _window(window: Mapping[str, Any] | None, max_rows: int, plot_name: str | None) -> list[str]:
    if not window or not window.get("rows"):
        return ["No sensor samples were captured."]
    cols = [str(c) for c in window.get("columns", ())]
    rows = list(window["rows"])
    shown = downsample(rows, max_rows)
    out = [f"{len(rows)} samples at {window.get('sample_hz', '?')} Hz, "
           f"{rows[0][0]:.3f} s to {rows[-1][0]:.3f} s (monotonic); "
           f"{len(shown)} rows shown, evenly spaced.", ""]
    if plot_name:
        out += [f"![sensor window]({plot_name})", ""]
    return out + _table(cols, [[f"{row[0]:.3f}", *(_num(v) for v in row[1:])] for row in shown])


def _decisions(decisions: Sequence[Mapping[str, Any]]) -> list[str]:
    if not decisions:
        return ["No policy decisions were journaled before this report."]
    # task_id and step name a decision for `journal.label` / `edge-agent journal label`
    cols = ("t_s", "task_id", "step", "state", "action", "backend", "latency_ms", "outcome",
            "accepted")
    return _table(cols, [[_t(d.get(c)) if c == "t_s" else _num(d.get(c)) if c == "latency_ms"
                          else _value(d.get(c))
                          for c in cols] for d in decisions])


def _num(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.4g}" if abs(v) < 1e4 else f"{v:.1f}"
    return "" if v is None else str(v)


def _value(v: Any) -> str:
    if v is None:
        return "—"
    if isinstance(v, float):
        return _num(v)
    if isinstance(v, Mapping):
        return ", ".join(f"{k}={_value(x)}" for k, x in v.items())
    if isinstance(v, list | tuple):
        return "; ".join(_value(x) for x in v) or "—"
    return str(v)


def _t(v: Any) -> str:
    return f"{v:.3f}" if isinstance(v, int | float) else _value(v)

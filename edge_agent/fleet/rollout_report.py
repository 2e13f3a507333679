"""The rollout report: JSON (every wave, every robot) and Markdown (the same, for a person)."""

from __future__ import annotations

import datetime as dt
import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

from edge_agent.fleet.rollout import Rollout


def _utc(t: float | None) -> str:
    if not t:
        return "-"
    return dt.datetime.fromtimestamp(t, dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def as_dict(ro: Rollout) -> dict[str, Any]:
    p = ro.plan
    return {
        "model": asdict(p.model), "previous": asdict(p.previous) if p.previous else None,
        "canary": p.canary, "wave_pct": p.wave_pct, "abort_at_pct": p.abort_at_pct,
        "trial_timeout_s": p.trial_timeout_s, "rollback_scope": p.rollback_scope,
        "drive_task": p.drive_task, "result": ro.result, "aborted_at_wave": ro.aborted_at_wave,
        "started": ro.started, "ended": ro.ended, "wall_s": round(ro.ended - ro.started, 3),
        "skipped_offline": ro.skipped,
        "waves": [{"index": w.index, "name": w.name, "started": w.started, "ended": w.ended,
                   "failed_pct": round(w.failed_pct, 1), "aborted": w.aborted,
                   "robots": [asdict(r) for r in w.robots]} for w in ro.waves],
    }


def markdown(ro: Rollout) -> str:
    p = ro.plan
    out = [f"# Rollout of {Path(p.model.uri).name} ({p.model.sha256[:12]}): {ro.result}", "",
           f"- model: `{p.model.uri}` sha256 `{p.model.sha256}`",
           "- previous (the way back): " + (f"`{p.previous.uri}` sha256 `{p.previous.sha256}`"
                                             if p.previous else "none given"),
           f"- canary {p.canary}, waves of {p.wave_pct:g} % of the rest, abort at "
           f"{p.abort_at_pct:g} % failed in a wave, rollback scope `{p.rollback_scope}`, "
           f"trial timeout {p.trial_timeout_s:g} s"
           + (f", tasks driven: `{p.drive_task}`" if p.drive_task else ""),
           f"- {_utc(ro.started)} → {_utc(ro.ended)} ({ro.ended - ro.started:.1f} s)"]
    if ro.skipped:
        out.append(f"- offline at the start, not updated: {', '.join(ro.skipped)}")
    if ro.aborted_at_wave is not None:
        later = len(ro.waves) - 1 - ro.aborted_at_wave
        out.append(f"- **aborted** at {ro.waves[ro.aborted_at_wave].name}"
                   + (f"; {later} later wave(s) never started" if later else ""))
    out.append("")
    for w in ro.waves:
        state = ("ABORTED" if w.aborted else "not started" if w.started is None
                 else f"{w.failed_pct:.0f} % failed")
        took = f", {w.ended - w.started:.1f} s" if w.started and w.ended else ""
        out += [f"## {w.name}: {state}{took}", "",
                "| robot | before | outcome | after update | reason | rollback |",
                "|---|---|---|---:|---|---|"]
        for r in w.robots:
            before = (r.before or {}).get("sha256")
            took_r = (f"{r.ended_at - r.updated_at:.1f} s" if r.ended_at and r.updated_at
                      else "-")
            reason = (r.reason or "-").replace("|", "\\|")
            out.append(f"| {r.device} | {str(before)[:12] if before else '-'} | {r.outcome} | "
                       f"{took_r} | {reason} | {r.rollback or '-'} |")
        out.append("")
    return "\n".join(out)


def write(ro: Rollout, path: Path) -> tuple[Path, Path]:
    """`path`.md and `path`.json (the suffix of `path` is replaced); both paths."""
    md, js = path.with_suffix(".md"), path.with_suffix(".json")
    md.parent.mkdir(parents=True, exist_ok=True)
    md.write_text(markdown(ro), encoding="utf-8")
    js.write_text(json.dumps(as_dict(ro), indent=2, default=str), encoding="utf-8")
    return md, js

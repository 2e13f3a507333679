"""`edge-agent fleet status`: one row per robot from its retained status/state (and, unless
`--no-query`, its `status` command's `model` and `reports`), as text lines or JSON. Pure."""

from __future__ import annotations

import datetime as dt
from typing import Any

from edge_agent.fleet.bus import Robot

COLUMNS = ("robot", "online", "mode", "stop", "degraded", "task", "model", "trial", "report",
           "seen")


def _age(t: float | None, now: float) -> str:
    if t is None:
        return "-"
    s = max(0.0, now - t)
    return f"{s:.0f}s" if s < 120 else f"{s / 60:.0f}m" if s < 7200 else f"{s / 3600:.0f}h"


def _short(sha: Any) -> str:
    return str(sha)[:8] if sha else "-"


def model_fields(details: dict[str, Any] | None) -> dict[str, Any]:
    """current (name version sha), previous sha, trial (state, sha, tasks) from `status.model`."""
    model = (details or {}).get("model")
    if not isinstance(model, dict):
        return {"current": None, "previous": None, "trial": None}
    cur, prev, trial = model.get("current"), model.get("previous"), model.get("trial")
    out_trial = None
    if isinstance(trial, dict):
        out_trial = {k: trial.get(k) for k in ("state", "sha256", "tasks_done",
                                               "tasks_required", "deadline_wall", "ended_wall")}
        verdict = trial.get("verdict")
        if isinstance(verdict, dict) and verdict.get("reasons"):
            out_trial["reasons"] = verdict.get("reasons")
    return {"current": cur if isinstance(cur, dict) else None,
            "previous": prev if isinstance(prev, dict) else None, "trial": out_trial}


def row(robot: Robot, now: float) -> dict[str, Any]:
    """One robot as a JSON-able dict (the `--json` output's element)."""
    st, status = robot.state or {}, robot.status or {}
    stop = st.get("stop") if isinstance(st.get("stop"), dict) else None
    task = st.get("task") if isinstance(st.get("task"), dict) else None
    details = robot.details or {}
    reports = details.get("reports") if isinstance(details.get("reports"), dict) else None
    return {
        "robot": robot.device, "prefix": robot.prefix,
        "online": robot.online, "presence": status.get("state"),
        "version": status.get("version"), "boot_id": status.get("boot_id"),
        "mode": st.get("mode"), "state": st.get("state"),
        "stop": ({"kind": stop.get("kind"), "cause": stop.get("cause"),
                  "causes": stop.get("causes")} if stop else None),
        "degraded": list(st.get("degraded") or []),
        "task": task.get("task_id") if task else None,
        "link_up": st.get("link_up"), "policy": st.get("policy"),
        "model": model_fields(robot.details) if robot.details is not None else None,
        "last_report": robot.last_report,
        "reports_built": reports.get("built") if reports else None,
        "last_seen": robot.last_seen, "queried": robot.details_at,
    }


def _model_text(m: dict[str, Any] | None) -> tuple[str, str]:
    if m is None:
        return "?", "?"
    cur = m.get("current") or {}
    model = (f"{cur.get('name') or '?'}@{cur.get('version') or '?'}:{_short(cur.get('sha256'))}"
             if cur else "-")
    t = m.get("trial")
    if not t:
        return model, "-"
    trial = f"{t.get('state')}:{_short(t.get('sha256'))}"
    if t.get("state") == "on_trial":
        trial += f" {t.get('tasks_done')}/{t.get('tasks_required')}"
    return model, trial


def lines(rows: list[dict[str, Any]], now: float) -> list[str]:
    """The readable table: a header and one line per robot."""
    table = [list(COLUMNS)]
    for r in rows:
        stop = r["stop"]
        model, trial = _model_text(r["model"])
        rep = r["last_report"]
        report = (f"{rep.get('kind')} {_age(rep.get('ts'), now)}" if rep
                  else f"built={r['reports_built']}" if r["reports_built"] is not None else "-")
        table.append([
            r["robot"], "yes" if r["online"] else (r["presence"] or "?"),
            f"{r['mode'] or '?'}/{r['state'] or '?'}",
            f"{stop['kind']}:{stop['cause']}" if stop else "-",
            ",".join(r["degraded"]) or "-", r["task"] or "-", model, trial, report,
            _age(r["last_seen"], now)])
    widths = [max(len(str(line[i])) for line in table) for i in range(len(COLUMNS))]
    return ["  ".join(str(c).ljust(w) for c, w in zip(line, widths, strict=True)).rstrip()
            for line in table]


def summary(rows: list[dict[str, Any]]) -> str:
    """`N robots: a online, s stopped, d degraded, t on trial` and the time."""
    on = sum(r["online"] for r in rows)
    stopped = sum(r["stop"] is not None for r in rows)
    degraded = sum(bool(r["degraded"]) for r in rows)
    trial = sum(bool(r["model"] and (r["model"].get("trial") or {}).get("state") == "on_trial")
                for r in rows)
    clock = dt.datetime.now().strftime("%H:%M:%S")
    return (f"{clock}  {len(rows)} robots: {on} online, {stopped} stopped, {degraded} degraded, "
            f"{trial} on trial")

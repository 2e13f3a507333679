"""`edge-agent model status`: the running daemon's models — current, previous, trial, shadow, bad.

Finds the daemon as `edge-agent status` does (edge_agent/comms/cmd_cli.py: `--config`, then
`--device`, `$EDGE_AGENT_CONFIG`, the one daemon running here), asks `status` and prints its
`model` part (docs/MODELS.md): for a person on a terminal, as JSON otherwise or with `--json`.
Exit codes: 0 answered, 1 refused or no `model` in the reply (an older daemon), 2 usage, 3 no
reply.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Mapping
from typing import Any


def add_status_parser(msub: Any) -> None:
    st = msub.add_parser("status", help="the running daemon's models: current, previous, the "
                                        "trial, the shadow, those marked bad")
    st.add_argument("--config", metavar="PATH", default=None,
                    help="the daemon's config (default: as `edge-agent status`)")
    st.add_argument("--device", metavar="ID", default=None,
                    help="which daemon, when several run on this machine")
    st.add_argument("--timeout", type=float, default=5.0, metavar="S",
                    help="seconds to wait for the reply (default: %(default)s)")
    st.add_argument("--json", action="store_true", help="print status.model as JSON")


def run_status(a: argparse.Namespace) -> int:
    from edge_agent.comms.client import send_command
    from edge_agent.comms.cmd_cli import resolve
    from edge_agent.errors import EdgeAgentError

    try:
        target = resolve(a.config, a.device)
    except Exception as exc:  # cmd_cli's usage / config errors: said as they are
        print(f"error: {exc}", file=sys.stderr)
        return 2
    try:
        reply = send_command("status", {}, socket_path=target.socket_path, mqtt=target.mqtt,
                             timeout=a.timeout)
    except (EdgeAgentError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 3
    model = (reply.get("result") or {}).get("model") if reply.get("ok") else None
    if not isinstance(model, Mapping):
        why = (reply.get("error") or {}).get("message") if not reply.get("ok") else \
            "the reply has no `model` (a daemon older than the model trial)"
        print(f"error: status: {why}", file=sys.stderr)
        return 1
    if a.json or not sys.stdout.isatty():
        print(json.dumps(model, indent=2 if sys.stdout.isatty() else None))
    else:
        print("\n".join(format_models(model)))
    return 0


def _ref(m: Any) -> str:
    if not isinstance(m, Mapping):
        return "none"
    return f"{m.get('name')} {m.get('version')} (sha256 {str(m.get('sha256'))[:12]})"


def _utc(wall: Any) -> str:
    if not isinstance(wall, int | float):
        return "?"
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(wall))


def format_models(m: Mapping[str, Any]) -> list[str]:
    """status.model as lines for a person."""
    lines = [f"current   {_ref(m.get('current'))}", f"previous  {_ref(m.get('previous'))}"]
    t = m.get("trial")
    if not isinstance(t, Mapping):
        lines.append("trial     none")
    else:
        ev: Mapping[str, Any] = t.get("evidence") or {}
        v: Mapping[str, Any] = t.get("verdict") or {}
        rules: Mapping[str, Any] = t.get("rules") or {}
        lines.append(f"trial     {t.get('state')}: {_ref(t)}, {t.get('tasks_done')}/"
                     f"{t.get('tasks_required')} tasks, started {_utc(t.get('started_wall'))}, "
                     + (f"ended {_utc(t.get('ended_wall'))}" if t.get("ended_wall")
                        else f"until {_utc(t.get('deadline_wall'))} at the latest"))
        lines.append(f"  evidence: {ev.get('successes', 0)} successes, {ev.get('aborted', 0)} "
                     f"aborted, L3 {ev.get('l3', 0)}; {ev.get('attempts', 0)} decisions, "
                     f"{ev.get('errors', 0)} errors, {ev.get('slow', 0)} over "
                     f"{rules.get('latency_ms', '?')} ms (worst {ev.get('worst_ms', 0)} ms), "
                     f"load failures {ev.get('load_failures', 0)}, unclean restarts "
                     f"{ev.get('unclean_restarts', 0)}")
        s = v.get("success")
        if isinstance(s, Mapping):
            lines.append(f"  success: {s.get('k')}/{s.get('n')} against p_ref "
                         f"{s.get('p_ref')} (previous {s.get('p0')} over {s.get('baseline')} "
                         f"episodes): P = {s.get('p_value')}, level {s.get('level')}")
        elif v.get("note"):
            lines.append(f"  {v.get('note')}")
        for r in v.get("reasons") or ():
            lines.append(f"  regression: {r}")
        if t.get("restored"):
            lines.append(f"  restored: {_ref(t.get('restored'))}")
    sh = m.get("shadow")
    lines.append(f"shadow    {json.dumps(sh) if sh is not None else 'none'}")
    bad = m.get("bad") or []
    lines.append(f"bad       {'none' if not bad else ''}".rstrip())
    for b in bad:
        why = (b.get("reasons") or ["?"])[0]
        lines.append(f"  {_ref(b)} rolled back {_utc(b.get('wall'))}: {why}")
    return lines

"""Command replies for a person: `systemctl status`-like lines, colour only on a terminal.

    print(format_reply("status", reply, color=use_color(sys.stdout)))

`status` gets a few lines — mode and state, the stop and its cause, degraded modes, link, policy
backend and model, loop figures against their targets, uptime; every other reply one line that
says what happened plainly (`task.start` names the task id), then its other result fields.
Colour follows the convention of https://no-color.org: none when NO_COLOR is set (any value),
when TERM is `dumb`, or when the stream is not a terminal. Scripts use `--json` instead.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any, TextIO

# The loop's targets (README "Real-time figures"): a tick starts at most 0.5 ms late at P99,
# and at most 1 period in 10,000 is missed.
LATE_P99_TARGET_MS = 0.5
MISSED_TARGET = 1e-4

_RESET, _BOLD, _DIM = "\x1b[0m", "\x1b[1m", "\x1b[2m"
_RED, _GREEN, _YELLOW = "\x1b[31m", "\x1b[32m", "\x1b[33m"


def use_color(stream: TextIO) -> bool:
    """Colour on a terminal unless NO_COLOR is set or TERM is dumb."""
    if os.environ.get("NO_COLOR") is not None or os.environ.get("TERM") == "dumb":
        return False
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


class _Paint:
    def __init__(self, on: bool) -> None:
        self.on = on

    def __call__(self, text: str, code: str) -> str:
        return f"{code}{text}{_RESET}" if self.on else text


def format_reply(name: str, reply: Mapping[str, Any], *, color: bool = False) -> str:
    """The reply to command `name` as lines for a person."""
    paint = _Paint(color)
    if not reply.get("ok"):
        err = reply.get("error") or {}
        if isinstance(err, Mapping):
            code, msg = err.get("code", "error"), err.get("message", "")
        else:
            code, msg = "error", str(err)
        return f"{paint('refused', _RED)}: {name}: {code}: {msg}".rstrip(": ")
    result = reply.get("result")
    result = result if isinstance(result, Mapping) else {}
    if name == "status":
        return format_status(result, color=color)
    return _format_accepted(name, result, paint)


def _format_accepted(name: str, result: Mapping[str, Any], paint: _Paint) -> str:
    task = result.get("task_id")
    head = {
        "task.start": f"task {task} started" if task else "task started",
        "task.cancel": f"task {task} cancelled" if task else "nothing to cancel",
        "resume": f"task {task} resumed" + (f" in {result['state']}" if result.get("state")
                                             else ""),
        "estop": "e-stop latched",
        "reset": "reset: nothing moves until the next command",
        "manual.enter": "manual mode",
        "manual.exit": "left manual mode",
    }.get(name, f"{name}: ok")
    lines = [paint(head, _GREEN)]
    shown = {"task_id", "state"} if name == "resume" else {"task_id"}
    for k, v in result.items():
        if k not in shown:
            lines.append(f"  {k}: {_value(v)}")
    return "\n".join(lines)


def _value(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:g}"
    if isinstance(v, list | tuple):
        return ", ".join(_value(x) for x in v) if v else "none"
    if isinstance(v, Mapping):
        return ", ".join(f"{k}={_value(x)}" for k, x in v.items())
    return "none" if v is None else str(v)


def _duration(s: float) -> str:
    s = int(s)
    d, rem = divmod(s, 86400)
    h, rem = divmod(rem, 3600)
    m, sec = divmod(rem, 60)
    parts = [f"{d}d" if d else "", f"{h}h" if h else "", f"{m}min" if m else "", f"{sec}s"]
    return " ".join(p for p in parts if p) if s else "0s"


def format_status(r: Mapping[str, Any], *, color: bool = False) -> str:
    """The `status` result as `systemctl status`-like lines."""
    paint = _Paint(color)
    stop = r.get("stop") if isinstance(r.get("stop"), Mapping) else None
    degraded = list(r.get("degraded") or [])
    bad = stop is not None or not r.get("link_up")
    dot = paint("●", _RED if bad else _YELLOW if degraded else _GREEN)
    sim = " (simulated robot)" if r.get("sim") else ""
    rows: list[tuple[str, str]] = []

    mode, state = str(r.get("mode", "?")), str(r.get("state", "?"))
    mode_text = paint(mode, _BOLD) + (f" ({state})" if state != mode else "")
    task = r.get("task")
    if isinstance(task, Mapping) and task.get("task_id"):
        mode_text += f", task {task['task_id']}"
    rows.append(("Mode", mode_text))

    if stop is not None:
        kind = {"estop": "e-stop"}.get(str(stop.get("kind")), str(stop.get("kind", "?")))
        kind = kind.replace("_", " ")
        causes = [c for c in stop.get("causes") or [] if c != stop.get("cause")]
        text = f"{kind}, cause {stop.get('cause')}"
        if causes:
            text += f" (also {', '.join(causes)})"
        if stop.get("hardware_input"):
            text += "; hardware e-stop input ACTIVE (release it before reset)"
        else:
            text += "; `reset` to leave it"
        rows.append(("Stop", paint(text, _RED)))
    else:
        rows.append(("Stop", "none"))
    rows.append(("Degraded", paint(", ".join(degraded), _YELLOW) if degraded else "none"))
    rows.append(("Link", _link(r, paint)))
    rows.append(("Policy", _policy(r)))
    loop = r.get("loop")
    if isinstance(loop, Mapping):
        rows.append(("Loop", _loop(loop, paint)))
    mq = r.get("mqtt_connected")
    rows.append(("MQTT", paint("connected", _GREEN) if mq else paint("not connected", _YELLOW)))
    up = r.get("uptime_s")
    uptime = _duration(float(up)) if isinstance(up, int | float) else "?"
    if r.get("startup_ms") is not None:
        uptime += f" (ready in {r['startup_ms']:g} ms)"
    rows.append(("Uptime", uptime))
    rows.append(("Version", f"{r.get('version', '?')}, config {r.get('config_hash', '?')}, "
                            f"boot {str(r.get('boot_id', '?'))[:12]}"))
    width = max(len(k) for k, _ in rows)
    head = f"{dot} {r.get('device', '?')} - edge-agent{sim}"
    return "\n".join([head, *(f"  {k:>{width}}: {v}" for k, v in rows)])


def _link(r: Mapping[str, Any], paint: _Paint) -> str:
    raw = r.get("link")
    link: Mapping[str, Any] = raw if isinstance(raw, Mapping) else {}
    if not r.get("link_up"):
        return paint("down", _RED)
    parts = [paint("up", _GREEN)]
    fw = link.get("firmware")
    if isinstance(fw, Mapping):
        parts.append(f"firmware {fw.get('version')} (protocol {fw.get('protocol')})")
    g = link.get("guardian")
    if isinstance(g, Mapping):
        parts.append("guardian latched" if g.get("latched") else "guardian clear")
    return ", ".join(parts)


def _policy(r: Mapping[str, Any]) -> str:
    inf = r.get("inference")
    if not isinstance(inf, Mapping):
        return f"{r.get('policy') or 'rule'} (model loading)"
    backend = inf.get("backend_in_use") or inf.get("preferred_ready") or r.get("policy") or "?"
    text = str(backend)
    for b in inf.get("backends") or []:
        if isinstance(b, Mapping) and b.get("name") == backend:
            prov = b.get("providers")
            if isinstance(prov, Mapping) and prov.get("device"):
                text += f" on {prov['device']}"
                if prov.get("gpu_unavailable"):
                    text += " (GPU unavailable)"
    model = inf.get("model")
    if isinstance(model, Mapping):
        text += f", model {model.get('name')} {model.get('version')}"
    trial = (r.get("model") or {}).get("trial") if isinstance(r.get("model"), Mapping) else None
    if isinstance(trial, Mapping) and trial.get("state") == "on_trial":
        text += (f", on trial {trial.get('tasks_done')}/{trial.get('tasks_required')} tasks "
                 "(`edge-agent model status`)")
    return text


def _loop(loop: Mapping[str, Any], paint: _Paint) -> str:
    rate = loop.get("rate_hz")
    ticks = int(loop.get("ticks") or 0)
    missed = int(loop.get("missed_periods") or 0)
    p99 = loop.get("late_p99_ms")
    parts = [f"{rate:g} Hz" if isinstance(rate, int | float) else "?"]
    if isinstance(p99, int | float):
        ok = p99 <= LATE_P99_TARGET_MS
        parts.append(paint(f"late P99 {p99:g} ms", _GREEN if ok else _YELLOW)
                     + f" (target ≤ {LATE_P99_TARGET_MS:g} ms)")
    if ticks:
        frac = missed / ticks
        ok = frac <= MISSED_TARGET
        parts.append(paint(f"missed {missed}/{ticks} = {frac:.1e}", _GREEN if ok else _YELLOW)
                     + f" (target ≤ {MISSED_TARGET:.0e})")
    sched = str(loop.get("scheduling") or "?")
    parts.append(paint(sched, _YELLOW) if "refused" in sched or "OTHER" in sched else sched)
    return ", ".join(parts)

"""One log line in the daemon's formats without structlog, for the link guardian process.

The guardian is the e-stop path: it imports only the stdlib, pyserial and its own modules, and
starts beside the daemon's imports, so it cannot pay for structlog (~60-110 ms). It writes the
lines the daemon's structlog chain (edge_agent.logsetup) writes: JSON with `ts`, `level`,
`logger`, `event` first, or `ts [level   ] event   key=value` on a terminal.
"""

from __future__ import annotations

import json
import time
from typing import Any

_COLORS = {"debug": "\x1b[2m", "info": "\x1b[32m", "warning": "\x1b[33m", "error": "\x1b[31m",
           "critical": "\x1b[1;31m"}


def iso_utc(t: float) -> str:
    """`2026-12-03T10:17:24.123456Z`, as structlog's TimeStamper(fmt="iso", utc=True)."""
    secs = int(t)
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(secs)) + f".{int((t - secs) * 1e6):06d}Z"


def render_json(rec: dict[str, Any]) -> str:
    """`ts`, `level`, `logger`, `event` first, then the key-values; unknown types as str()."""
    head: dict[str, Any] = {k: rec.pop(k) for k in ("ts", "level", "logger", "event") if k in rec}
    head.update(rec)
    return json.dumps(head, default=str)


def _console_value(v: object) -> str:
    if isinstance(v, str) and v and not any(c.isspace() or c in "='\"" for c in v):
        return v
    return repr(v)


def render_console(rec: dict[str, Any], colors: bool = False) -> str:
    """`2026-12-03T10:17:24.123456Z [warning  ] event_name    key=value ...`."""
    ts = str(rec.pop("ts", ""))
    level = str(rec.pop("level", ""))
    event = str(rec.pop("event", ""))
    rec.pop("logger", None)
    kv = " ".join(f"{k}={_console_value(v)}" for k, v in rec.items())
    lvl = f"[{level:<9}]"
    if colors:
        lvl = f"{_COLORS.get(level, '')}{lvl}\x1b[0m"
    return f"{ts} {lvl} {event:<30} {kv}".rstrip()

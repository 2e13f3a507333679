"""How long ago this process was exec'd, for the `ready` event's `startup_ms`."""

from __future__ import annotations

import os
import time


def _boot_relative_start_s() -> float | None:
    """Process start in seconds since boot, from /proc/self/stat (field 22, clock ticks)."""
    try:
        with open("/proc/self/stat", "rb") as f:
            stat = f.read().decode()
        fields = stat[stat.rindex(")") + 2 :].split()
        return int(fields[19]) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


def _uptime_s() -> float | None:
    try:
        with open("/proc/uptime", "rb") as f:
            return float(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None


_START_MONO: float | None = None


def process_start_monotonic() -> float:
    """The monotonic time at which this process started (10 ms resolution: clock ticks).

    Falls back to the first call's time when /proc is unavailable.
    """
    global _START_MONO
    if _START_MONO is None:
        now = time.monotonic()
        started, up = _boot_relative_start_s(), _uptime_s()
        _START_MONO = now if started is None or up is None else now - max(0.0, up - started)
    return _START_MONO


def ms_since_start(now: float | None = None) -> float:
    return ((now if now is not None else time.monotonic()) - process_start_monotonic()) * 1e3


_PHASES: dict[str, float] = {}


def mark(phase: str) -> None:
    """Note that start-up `phase` ended now (ms since exec); the `ready` event carries them."""
    _PHASES.setdefault(phase, round(ms_since_start(), 1))


def phases() -> dict[str, float]:
    """The start-up phases marked so far, in order: name → ms since exec at its end."""
    return dict(_PHASES)

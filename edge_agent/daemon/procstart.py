"""How long ago this process was exec'd, for the `ready` event's `startup_ms`; the collector's
pause from exec to READY."""

from __future__ import annotations

import gc
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


_GC_PAUSED = False


def pause_gc() -> None:
    """No automatic garbage collection until `resume_gc()`: `edge-agent run` from its start to
    READY, where imports and set-up create long-lived objects only, and the ~60 generation-0 and
    6 generation-1 collections they would trigger cost 5-15 ms of CPU here. READY collects once
    (daemon/heap.py HeapKeeper.ready) and resumes. A collector someone else disabled is left."""
    global _GC_PAUSED
    if gc.isenabled():
        gc.disable()
        _GC_PAUSED = True


def resume_gc() -> None:
    """Automatic collection back on if `pause_gc()` turned it off (idempotent)."""
    global _GC_PAUSED
    if _GC_PAUSED:
        _GC_PAUSED = False
        gc.enable()

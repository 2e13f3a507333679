"""How much CPU time the hypervisor took from this VM ("steal", /proc/stat) while a benchmark ran.

On a shared VM a vCPU the host does not run stalls every process on it — a SCHED_FIFO loop as
much as anything else — so a latency figure means little without this beside it. Linux only;
elsewhere (or without the field) `None`.
"""

from __future__ import annotations

import os
import time


def _read() -> tuple[int, float] | None:
    """(steal ticks summed over all CPUs, monotonic time)."""
    try:
        with open("/proc/stat") as f:
            fields = f.readline().split()
    except OSError:
        return None
    if len(fields) < 9 or fields[0] != "cpu":
        return None
    return int(fields[8]), time.monotonic()


class StealMeter:
    """Sum the steal over several windows: `start()` … `stop()`, repeatedly; `fraction`."""

    def __init__(self) -> None:
        self._hz = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
        self._cpus = os.cpu_count() or 1
        self._at: tuple[int, float] | None = None
        self.stolen_s = 0.0
        self.wall_s = 0.0
        self.ok = True

    def start(self) -> None:
        self._at = _read()
        self.ok = self.ok and self._at is not None

    def stop(self) -> None:
        now = _read()
        if self._at is None or now is None:
            self.ok = False
            return
        self.stolen_s += (now[0] - self._at[0]) / self._hz
        self.wall_s += now[1] - self._at[1]
        self._at = None

    @property
    def fraction(self) -> float | None:
        """Stolen CPU time / (wall time × CPUs) over the windows, or None if unknown."""
        if not self.ok or self.wall_s <= 0:
            return None
        return self.stolen_s / (self.wall_s * self._cpus)

    def describe(self) -> str:
        f = self.fraction
        if f is None:
            return "host steal: unknown (no /proc/stat)"
        return (f"host steal {100 * f:.1f} % of this VM's CPU time "
                f"({self.stolen_s:.2f} s over {self.wall_s:.1f} s × {self._cpus} CPUs)")

"""The probe seam: what one health check reports and the protocol every probe implements.

Levels follow ROS `diagnostic_msgs/DiagnosticStatus` (OK, WARN, ERROR, STALE); STALE is not a
probe's own answer but the monitor's verdict on a probe that did not report within its budget.
A probe is cheap and never blocks: it reads counters and snapshots that other parts keep (the
inference router, the sensor hub, the link mirror, the loop stats) and does no CPU-heavy work in
the daemon process. Only ERROR counts as a failure toward `health.fail_after`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import IntEnum
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from edge_agent.vocab import DegradationMode

if TYPE_CHECKING:
    from edge_agent.contract.events import Event

Figure = float | int | str | bool | None


class Level(IntEnum):
    """Severity, ordered so that `max()` of several levels is the worst."""

    OK = 0
    WARN = 1
    ERROR = 2
    STALE = 3

    @property
    def label(self) -> str:
        return self.name.lower()


@dataclass(frozen=True, slots=True)
class ProbeResult:
    """One probe's answer: a level, a line an operator understands, and its figures."""

    level: Level
    message: str = ""
    figures: Mapping[str, Figure] = field(default_factory=dict)

    @classmethod
    def ok(cls, message: str = "", **figures: Figure) -> ProbeResult:
        return cls(Level.OK, message, figures)

    @classmethod
    def warn(cls, message: str, **figures: Figure) -> ProbeResult:
        return cls(Level.WARN, message, figures)

    @classmethod
    def error(cls, message: str, **figures: Figure) -> ProbeResult:
        return cls(Level.ERROR, message, figures)

    @property
    def failed(self) -> bool:
        return self.level is Level.ERROR


class Probe(Protocol):
    """One health check. `mode` is what `health.fail_after` consecutive failures enter (None: the
    probe only reports); `period_s` None means `health.period_s`; `subject` names what is degraded
    within the mode (a sensor channel for `sensor_predicted`, `sensor_filtered`; else "")."""

    @property
    def name(self) -> str: ...

    @property
    def mode(self) -> DegradationMode | None: ...

    @property
    def subject(self) -> str: ...

    @property
    def period_s(self) -> float | None: ...

    def check(self, now: float) -> ProbeResult:
        """Run the check at monotonic time `now`; must return quickly and never raise."""
        ...


class GuardedProbe:
    """A base for probes: name, mode, subject and period as plain attributes (the protocol's
    properties), and a `check` that never raises — a subclass writes `_check`, and whatever it
    raises is this probe's ERROR, with why."""

    subject = ""

    def __init__(self, name: str, mode: DegradationMode | None,
                 period_s: float | None = None) -> None:
        self.name, self.mode, self.period_s = name, mode, period_s

    def check(self, now: float) -> ProbeResult:
        try:
            return self._check(now)
        except Exception as e:  # a probe never raises: its own failure is a failed check
            return ProbeResult.error(f"{self.name} probe raised {type(e).__name__}: {e}")

    def _check(self, now: float) -> ProbeResult:
        raise NotImplementedError


def fail_after_of(probe: Probe) -> int | None:
    """A probe's own `fail_after` (optional attribute; None: `health.fail_after`)."""
    value = getattr(probe, "fail_after", None)
    return value if isinstance(value, int) and value >= 1 else None


@runtime_checkable
class EventAware(Protocol):
    """Optional, beside Probe: the event fast path. The monitor hands every event the daemon
    publishes to `fails_on` (on the publishing thread: cheap, never blocking, never raising);
    a message back counts as a failed run of this probe at once and runs it again now."""

    def fails_on(self, event: Event) -> str | None: ...

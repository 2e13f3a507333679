"""Degradation-mode rules: strikes per probe, N failures enter a mode, M successes leave it.

Pure logic (no threads, no clock of its own: every call takes `now`), like
edge_agent/link/guardian_rules.py. The monitor (health/monitor.py) feeds it every probe result and
publishes the transitions it returns. A probe's ERROR is a strike; OK and WARN count as good
runs; STALE (the probe did not report in time) counts as neither and leaves both counts as they
were. `fail_after` consecutive strikes put the probe's (mode, subject) in the active set;
`recover_after` consecutive good runs take it out. Modes combine: several may be active at once,
and one mode held by several probes (or a sensor mode held for several channels) is entered when
the first one holds it and left when the last one lets go.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from edge_agent.health.probe import Figure, Level, ProbeResult
from edge_agent.vocab import DegradationMode


@dataclass(frozen=True, slots=True)
class Transition:
    """A mode entered or left: which probe decided it, why (its message), its figures."""

    entered: bool
    mode: DegradationMode
    subject: str  # a sensor channel for sensor_predicted and sensor_filtered, else ""
    probe: str
    cause: str
    figures: Mapping[str, Figure]
    at: float  # monotonic time of the deciding result


@dataclass(slots=True)
class Strikes:
    """One probe's counts (what `status.health` shows)."""

    failures: int = 0  # consecutive ERRORs
    goods: int = 0  # consecutive OK / WARN
    holding: bool = False  # this probe holds its mode now


@dataclass(slots=True)
class ModeRules:
    """See the module doc; `observe()` per probe result, `active()` for `state.degraded`."""

    fail_after: int = 3
    recover_after: int = 3
    _counts: dict[str, Strikes] = field(default_factory=dict)
    # (mode, subject) -> the probes holding it now
    _holders: dict[tuple[DegradationMode, str], set[str]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.fail_after < 1 or self.recover_after < 1:
            raise ValueError("fail_after and recover_after must be at least 1")

    def observe(self, probe: str, mode: DegradationMode | None, subject: str,
                result: ProbeResult, now: float, fail_after: int | None = None,
                ) -> Transition | None:
        """Count one result of `probe`; the mode transition it causes, if any. `fail_after`
        overrides the rule's for a probe whose single failure is already certain (a sensor
        channel the firmware stopped sending is predicted from that very tick on)."""
        c = self._counts.setdefault(probe, Strikes())
        if result.level is Level.STALE:
            return None
        if result.failed:
            c.failures += 1
            c.goods = 0
            if mode is not None and not c.holding and c.failures >= (fail_after or self.fail_after):
                c.holding = True
                return self._hold(probe, mode, subject, result, now)
            return None
        c.goods += 1
        c.failures = 0
        if mode is not None and c.holding and c.goods >= self.recover_after:
            c.holding = False
            return self._release(probe, mode, subject, result, now)
        return None

    def counts(self, probe: str) -> Strikes:
        return self._counts.get(probe) or Strikes()

    def active(self) -> list[tuple[DegradationMode, str]]:
        """Every (mode, subject) held now, sorted."""
        return sorted(self._holders)

    def modes(self) -> list[str]:
        """The distinct modes held now (`state.degraded`), sorted."""
        return sorted({m.value for m, _ in self._holders})

    # -- internals -------------------------------------------------------------------------
    def _hold(self, probe: str, mode: DegradationMode, subject: str, result: ProbeResult,
              now: float) -> Transition | None:
        holders = self._holders.setdefault((mode, subject), set())
        first = not holders
        holders.add(probe)
        if not first:
            return None
        return Transition(True, mode, subject, probe, result.message, dict(result.figures), now)

    def _release(self, probe: str, mode: DegradationMode, subject: str, result: ProbeResult,
                 now: float) -> Transition | None:
        holders = self._holders.get((mode, subject))
        if holders is None:
            return None
        holders.discard(probe)
        if holders:
            return None
        del self._holders[(mode, subject)]
        return Transition(False, mode, subject, probe, result.message or "probe good again",
                          dict(result.figures), now)

"""The rig's fault engine: injected and scheduled faults, active windows, what each one does now.

Pure and clocked by firmware time in seconds (`now_s`, 0 at the firmware's start), so a schedule's
`at_s` means the same in the lock-step runner and on the pty. The firmware reads the engine's
plain attributes every tick (`estop_pressed`, `sensor_faults`, `gripper_weak`, `gripper_slip`,
`collision`, `link_mode`). Targets and modes (DESIGN.md `failure.inject`):

    sensor:<channel>  dropout | stuck | noise | spikes     (severity scales noise and spikes)
    gripper           weak_close | slip                    (weak_close severity: a number, or
                                                            "recoverable" / "unrecoverable")
    collision         impact                               (severity scales the current)
    link              corrupt | unplug
    estop             press | release                      (the physical button; a press
                                                            edge is latched until a tick
                                                            samples it: `estop_taps`)

A fault without `duration_s` lasts until cleared (or, for the e-stop, released).
"""

from __future__ import annotations

import json
import math
import random
import tomllib
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from edge_agent.robot import RobotDescription
from hil.sim.config import RigConfig
from hil.sim.sensors import SENSOR_FAULT_MODES

MODES: dict[str, tuple[str, ...]] = {
    "sensor": SENSOR_FAULT_MODES,
    "gripper": ("weak_close", "slip"),
    "collision": ("impact",),
    "link": ("corrupt", "unplug"),
    "estop": ("press", "release"),
}
DAEMON_TARGETS = ("gpu", "triton")


class FaultError(ValueError):
    """A fault request names an unknown target or mode, or a bad duration or severity."""


@dataclass(frozen=True, slots=True)
class FaultSpec:
    """One fault request; `at_s` (firmware seconds) only in schedules, `robot` only in fleets."""

    target: str
    mode: str
    duration_s: float | None = None
    severity: float | str | None = None
    at_s: float | None = None
    robot: int | None = None

    @classmethod
    def from_mapping(cls, d: Mapping[str, Any]) -> FaultSpec:
        unknown = set(d) - {"target", "mode", "duration_s", "severity", "at_s", "robot"}
        if unknown:
            raise FaultError(f"unknown fault field(s): {sorted(unknown)}")
        if not isinstance(d.get("target"), str) or not isinstance(d.get("mode"), str):
            raise FaultError("a fault needs a string 'target' and 'mode'")
        return cls(target=d["target"], mode=d["mode"],
                   duration_s=_opt_num(d, "duration_s"), severity=d.get("severity"),
                   at_s=_opt_num(d, "at_s"), robot=d.get("robot"))


def _opt_num(d: Mapping[str, Any], k: str) -> float | None:
    v = d.get(k)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v) or v < 0:
        raise FaultError(f"{k} must be a number >= 0, got {v!r}")
    return float(v)


def load_schedule(path: str | Path) -> list[FaultSpec]:
    """Read a schedule: JSON (a list, or {"faults": [...]}) or TOML ([[faults]] tables)."""
    p = Path(path)
    text = p.read_text(encoding="utf-8")
    data: Any = json.loads(text) if p.suffix == ".json" else tomllib.loads(text)
    items = data.get("faults", []) if isinstance(data, dict) else data
    if not isinstance(items, list):
        raise FaultError(f"{p}: expected a list of faults")
    specs = [FaultSpec.from_mapping(x) for x in items]
    for s in specs:
        if s.at_s is None:
            raise FaultError(f"{p}: every scheduled fault needs at_s ({s.target} {s.mode})")
    return sorted(specs, key=lambda s: s.at_s or 0.0)


@dataclass(slots=True)
class ActiveFault:
    target: str
    mode: str
    severity: float
    start_s: float
    end_s: float | None


class FaultEngine:
    """Active faults of one simulated robot and the effect each has right now."""

    def __init__(self, robot: RobotDescription, rig: RigConfig, rng: random.Random) -> None:
        self.channels = {s.name for s in robot.sensors} - {"estop_input"}
        self.rig = rig
        self.rng = rng
        self.active: dict[str, ActiveFault] = {}
        self.pending: list[FaultSpec] = []
        self.history: list[dict[str, Any]] = []
        self.estop_pressed = False
        # Press edges not yet sampled by the firmware's tick: the button's input latches an edge
        # (an interrupt, a safety relay), so a tap shorter than a tick is still a press.
        self.estop_taps = 0
        self.sensor_faults: dict[str, tuple[str, float]] = {}
        self.gripper_weak = 0.0
        self.gripper_slip = False
        self.collision = 0.0
        self.link_mode: str | None = None
        self.link_severity = 0.0
        self._next_end = math.inf

    # ------------------------------------------------------------------ requests

    def validate(self, spec: FaultSpec) -> float:
        """Check a request; returns its numeric severity."""
        kind, _, channel = spec.target.partition(":")
        if kind in DAEMON_TARGETS:
            raise FaultError(f"target {spec.target!r} is a daemon-side fault, not the rig's")
        if kind not in MODES or (kind == "sensor") != bool(channel):
            raise FaultError(f"unknown target {spec.target!r}; targets: sensor:<channel>, "
                             f"{', '.join(k for k in MODES if k != 'sensor')}")
        if kind == "sensor" and channel not in self.channels:
            raise FaultError(f"unknown sensor channel {channel!r}; channels: "
                             f"{', '.join(sorted(self.channels))}")
        if spec.mode not in MODES[kind]:
            raise FaultError(f"unknown mode {spec.mode!r} for {kind}; modes: "
                             f"{', '.join(MODES[kind])}")
        sev = spec.severity
        if spec.mode == "weak_close" and (sev is None or isinstance(sev, str)):
            ranges = {None: self.rig.faults_weak_close_recoverable,
                      "recoverable": self.rig.faults_weak_close_recoverable,
                      "unrecoverable": self.rig.faults_weak_close_unrecoverable}
            if sev not in ranges:
                raise FaultError("weak_close severity: a number or recoverable/unrecoverable")
            lo, hi = ranges[sev]
            return self.rng.uniform(lo, hi)
        if sev is None:
            return 1.0
        if isinstance(sev, bool) or not isinstance(sev, int | float) or not 0 <= sev <= 10:
            raise FaultError(f"severity must be a number in [0, 10], got {sev!r}")
        if spec.mode == "weak_close" and sev > 1:
            raise FaultError("weak_close severity must be in [0, 1]")
        return float(sev)

    def inject(self, spec: FaultSpec, now_s: float) -> dict[str, Any]:
        """Start a fault now (replacing any other on the same target); returns what was done."""
        severity = self.validate(spec)
        if spec.target == "estop" and spec.mode == "release":
            self.active.pop("estop", None)
            self._refresh()
            return self._log("estop", "release", 0.0, now_s, None)
        if spec.target == "estop" and "estop" not in self.active:
            self.estop_taps += 1  # a press edge: the firmware samples it even if released first
        end = now_s + spec.duration_s if spec.duration_s is not None else None
        self.active[spec.target] = ActiveFault(spec.target, spec.mode, severity, now_s, end)
        self._refresh()
        return self._log(spec.target, spec.mode, severity, now_s, end)

    def clear(self, target: str | None, now_s: float) -> list[str]:
        """End one fault (or all); returns the targets cleared."""
        gone = [t for t in self.active if target is None or t == target]
        for t in gone:
            del self.active[t]
            self._log(t, "cleared", 0.0, now_s, None)
        self._refresh()
        return gone

    def schedule(self, specs: Iterable[FaultSpec]) -> None:
        """Queue faults to start at their `at_s` (validated now, so a bad file fails early)."""
        for s in specs:
            if s.at_s is None:
                raise FaultError(f"scheduled fault {s.target} {s.mode} needs at_s")
            self.validate(s)
            self.pending.append(s)
        self.pending.sort(key=lambda s: s.at_s or 0.0)

    # ------------------------------------------------------------------ clock

    def update(self, now_s: float) -> bool:
        """Start due scheduled faults and end expired ones; True when anything changed."""
        changed = False
        while self.pending and (self.pending[0].at_s or 0.0) <= now_s:
            self.inject(self.pending.pop(0), now_s)
            changed = True
        if now_s >= self._next_end:
            for t, f in list(self.active.items()):
                if f.end_s is not None and f.end_s <= now_s:
                    del self.active[t]
                    self._log(t, "expired", 0.0, now_s, None)
            self._refresh()
            changed = True
        return changed

    @property
    def next_start_s(self) -> float:
        return (self.pending[0].at_s or 0.0) if self.pending else math.inf

    def describe(self) -> list[dict[str, Any]]:
        return [asdict(f) for f in self.active.values()]

    def _log(self, target: str, mode: str, severity: float, now_s: float,
             end_s: float | None) -> dict[str, Any]:
        entry = {"t_s": now_s, "target": target, "mode": mode, "severity": severity,
                 "end_s": end_s}
        self.history.append(entry)
        del self.history[:-1000]
        return entry

    def _refresh(self) -> None:
        a = self.active
        self.estop_pressed = "estop" in a
        self.sensor_faults = {t[7:]: (f.mode, f.severity) for t, f in a.items()
                              if t.startswith("sensor:")}
        g = a.get("gripper")
        self.gripper_weak = g.severity if g is not None and g.mode == "weak_close" else 0.0
        self.gripper_slip = g is not None and g.mode == "slip"
        c = a.get("collision")
        self.collision = (c.severity * self.rig.collision_fault_current_fraction
                          if c is not None else 0.0)
        link = a.get("link")
        self.link_mode = link.mode if link is not None else None
        self.link_severity = link.severity if link is not None else 0.0
        ends = [f.end_s for f in a.values() if f.end_s is not None]
        self._next_end = min(ends) if ends else math.inf

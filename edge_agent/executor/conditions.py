"""Protective-stop conditions read from each tick's snapshot: a sensor lost past its bound, an
overcurrent after a collision.

Each is a condition of the stop latch (`StopLatch.set_condition`): while it is present a reset is
refused with `cause_present`; once it is gone a reset may clear the stop, and the frozen task
waits for `resume` or a new command — it never continues by itself when the sensor returns.

- `sensor_bound` trips when any channel is in `Snapshot.lost` (a `stop` channel without a valid
  sample for a few of its periods, a predicted one past `predict_max_s` / `predict_max_std`,
  counted in the firmware's time: see `SensorHub.snapshot`) and is present as long as one is.
- `collision` is tripped by the executor's current monitor; the overcurrent that follows it (the
  firmware's FAULT flag, or a joint current at its limit) keeps it present, so a reset is not
  accepted only to trip again a few ticks later.

Pure and cheap: called by the executor's tick with `now` and the snapshot it already has; only
changes reach the latch (its lock is not taken on a quiet tick).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from edge_agent.executor.latch import StopLatch
from edge_agent.link.codec import StatusFlag
from edge_agent.robot import RobotDescription
from edge_agent.sensors.readings import Snapshot
from edge_agent.vocab import EventType, StopCause

_FAULT = int(StatusFlag.FAULT)
AT_LIMIT_FRACTION = 0.98  # a joint current this close to current_max_a is an overcurrent


class StopConditions:
    """Evaluates the snapshot-borne latch conditions once per tick (see the module doc)."""

    def __init__(self, robot: RobotDescription, latch: StopLatch,
                 emit: Callable[..., None]) -> None:
        self._latch = latch
        self._emit = emit
        self._limit = tuple(AT_LIMIT_FRACTION * j.current_max_a for j in robot.joints)
        self.lost: tuple[str, ...] = ()  # the channels lost now
        self._overcurrent_held = False

    def update(self, now: float, snap: Snapshot) -> None:
        lost = snap.lost
        if lost != self.lost:
            was = self.lost
            self.lost = lost
            if lost:
                self._emit({"type": EventType.SENSOR_LOST, "channels": list(lost),
                            "age_s": {c: _age(snap, c) for c in lost}})
            else:
                self._emit({"type": EventType.SENSOR_BACK, "channels": list(was)})
            if bool(lost) != bool(was):
                self._latch.set_condition(StopCause.SENSOR_BOUND, bool(lost), now)
        held = (StopCause.COLLISION in self._latch.state.causes
                and self.overcurrent(snap))
        if held != self._overcurrent_held:
            self._overcurrent_held = held
            self._latch.set_condition(StopCause.COLLISION, held, now)

    def overcurrent(self, snap: Snapshot) -> bool:
        """The firmware reports an overcurrent, or a joint current is at its limit."""
        if snap.flags & _FAULT:
            return True
        return any(abs(c) >= lim for c, lim in zip(snap.currents, self._limit, strict=False))


def _age(snap: Snapshot, name: str) -> Any:
    age = snap.channels[name].age_s
    return round(age, 4) if age != float("inf") else None

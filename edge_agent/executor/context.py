"""What one tick shares between the executor and its task driver: time, measurement, events.

The `Executor` writes a `TickInputs` at the start of every tick (and catches its clock up in
every command); the `TaskDriver` only reads it. Both append to the one `EventLog`, stamped with
the tick's time; the daemon drains it (`Executor.drain_events`) and publishes every event.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from edge_agent.executor.controllers import Measured
from edge_agent.executor.monitor import ObjectEstimate, SensorRing

if TYPE_CHECKING:  # the contract's union of TypedDicts (edge_agent/contract/events.py) ...
    from edge_agent.contract.events import Event as Event
else:  # ... plain dicts at run time: the records are not imported on the control path
    Event = dict
DecisionRecord = dict[str, Any]  # a policy decision as the decision journal records it


@dataclass(slots=True)
class TickInputs:
    """The executor's view of the robot as of its latest tick or command."""

    ring: SensorRing  # the last seconds of measurements (the diagnostic window)
    now: float = 0.0
    measured: Measured | None = None  # the last usable measurement (None before the first)
    predicted: bool = False  # joint positions are Kalman-predicted (set per tick)
    object: ObjectEstimate = field(default_factory=ObjectEstimate)  # fed from the camera


class EventLog:
    """Events since the last drain, oldest first, each stamped with `inputs.now`."""

    __slots__ = ("_events", "_inputs")

    def __init__(self, inputs: TickInputs) -> None:
        self._inputs = inputs
        self._events: list[Event] = []

    def emit(self, ev: Event) -> None:
        """Append `ev`, stamped with the tick's time `t`."""
        ev["t"] = round(self._inputs.now, 6)
        self._events.append(ev)

    def drain(self) -> list[Event]:
        out, self._events = self._events, []
        return out

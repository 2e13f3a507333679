"""`state` is built from one read of the stop latch: its mode and its `stop` always agree."""

from __future__ import annotations

from executor_fake import ROBOT_PATH

from edge_agent.daemon.linkmirror import LinkMirror
from edge_agent.daemon.state import state_fields
from edge_agent.executor.executor import Executor
from edge_agent.executor.latch import LatchState, StopCause, StopLatch
from edge_agent.robot import load_robot
from edge_agent.sensors.hub import SensorHub


class TripsBetweenReads(StopLatch):
    """A latch that another thread trips right after the next read of its state (the race
    of 12-07 CI: `mode` protective_stop with no `stop` in `state`)."""

    armed = False

    @property
    def state(self) -> LatchState:
        seen = super().state
        if self.armed:
            self.armed = False
            self.trip(StopCause.SENSOR_BOUND, now=1.0)
        return seen


def test_a_trip_between_reads_never_gives_a_stop_mode_without_its_stop() -> None:
    robot = load_robot(ROBOT_PATH)
    latch = TripsBetweenReads()
    ex = Executor(robot, latch, None, None)
    mirror = LinkMirror(SensorHub(robot), latch, lambda _e: None)
    latch.armed = True
    before = state_fields(ex, latch, mirror, "expert", [])
    assert before["mode"] == "idle" and "stop" not in before, before  # the read before the trip
    after = state_fields(ex, latch, mirror, "expert", [])
    assert after["mode"] == "protective_stop", after
    assert after["stop"]["causes"] == ["sensor_bound"], after

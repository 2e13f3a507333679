"""The daemon's link reader: frames from the guardian → SensorHub, stop latch, link state.

Runs on the GuardianClient's reader thread for every frame (1 kHz STATUS): the common path is a
SensorHub update and one comparison. The hardware e-stop input and the guardian's latch are
mirrored into the daemon's StopLatch at once; the guardian already stopped the drives. A guardian
latched by a deadman trip (the daemon silent, or the firmware's own deadman: docs/PROTOCOL.md §4)
trips `deadman` — except once the daemon is closing (`closing`), when its silence is expected.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, cast

from edge_agent.executor.latch import StopLatch
from edge_agent.link.codec import (
    EstopEdge,
    Event,
    Frame,
    GState,
    HelloAck,
    Pong,
    Sensor,
    Status,
    StatusFlag,
    StopReason,
)
from edge_agent.log import get_logger
from edge_agent.observe import channels as obs
from edge_agent.observe.tap import TAP
from edge_agent.sensors.hub import SensorHub
from edge_agent.vocab import EventType, StopCause

if TYPE_CHECKING:
    from edge_agent.contract.events import Event as EventMsg
    from edge_agent.contract.events import FirmwareEventCode
    from edge_agent.contract.status import LinkStatus

_log = get_logger(__name__)
EventSink = Callable[["EventMsg"], None]
_ESTOP_BIT = int(StatusFlag.ESTOP_INPUT)


class LinkMirror:
    """Consumes guardian frames; keeps what the rest of the daemon asks about the link."""

    def __init__(self, hub: SensorHub, latch: StopLatch, emit: EventSink, *,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._hub = hub
        # stamps frames: host monotonic time, or a virtual one (lock-step host, benchmark);
        # the waits below are real (deadlines on time.monotonic)
        self._clock = clock
        self._latch = latch
        self._emit = emit
        self._hw_input = False
        self.closing = False  # set at shutdown: the stream stops on purpose
        self._cond = threading.Condition()
        self.gstate: GState | None = None
        self.gstate_at: float = 0.0
        self.last_frame_at: float = 0.0
        self.last_status: Status | None = None
        self.hello: HelloAck | None = None
        self.link_up = False
        self.ever_up = False
        self.frames = 0
        self.fw_events = 0
        self._pongs: list[tuple[Pong, float]] = []

    # -- reader thread ---------------------------------------------------------------------
    def on_frame(self, frame: Frame) -> None:
        msg = frame.msg
        now = self._clock()
        self.last_frame_at = now
        self.frames += 1
        TAP.publish(obs.LINK_STATUS if type(msg) is Status else obs.LINK_RX, msg)  # an append
        if isinstance(msg, Status):
            self.last_status = msg
            self._hub.update(msg, now)
            pressed = bool(int(msg.flags) & _ESTOP_BIT)  # msg.estop_input, without enum ops
            if pressed != self._hw_input:
                self._set_input(pressed, now)
        elif isinstance(msg, Sensor):
            self._hub.update(msg, now)
        elif isinstance(msg, EstopEdge):
            self._set_input(msg.pressed, now)
        elif isinstance(msg, GState):
            self._on_gstate(msg, now)
        elif isinstance(msg, HelloAck):
            self.hello = msg
            if not msg.accepted:
                self._emit({"type": EventType.LINK_FAULT, "cause": "version_mismatch",
                            "firmware_version": msg.proto_version})
        elif isinstance(msg, Event):
            self.fw_events += 1
            self._emit({"type": EventType.FIRMWARE_EVENT,
                        "code": cast("FirmwareEventCode", msg.code.name.lower()),
                        "detail": msg.detail})
        elif isinstance(msg, Pong):
            with self._cond:
                self._pongs.append((msg, now))
                del self._pongs[:-64]
                self._cond.notify_all()

    def _set_input(self, pressed: bool, now: float) -> None:
        self._hw_input = pressed
        self._latch.set_hardware_input(pressed, now)
        self._emit({"type": EventType.ESTOP_INPUT, "pressed": pressed})

    def _on_gstate(self, g: GState, now: float) -> None:
        prev = self.gstate
        with self._cond:
            self.gstate, self.gstate_at = g, now
            self._cond.notify_all()
        if g.estop_input != self._hw_input:
            self._set_input(g.estop_input, now)
        if g.link_up != self.link_up:
            self.link_up = g.link_up
            if g.link_up:
                self.ever_up = True
            # Before the first frame ever arrived, "down" only means "not yet": start-up decides
            # (after a bounded wait) whether that is a fault.
            if g.link_up or self.ever_up:
                self._latch.set_condition(StopCause.LINK_FAULT, not g.link_up, now)
                self._emit({"type": EventType.LINK_UP, "cause": None} if g.link_up else
                           {"type": EventType.LINK_FAULT, "cause": "serial_link"})
        if g.latched and g.cause == StopReason.ESTOP_INPUT and not self._latch.latched:
            self._latch.trip(StopCause.ESTOP_INPUT, now)
        elif g.latched and g.cause == StopReason.DEADMAN and not self.closing:
            self._latch.trip(StopCause.DEADMAN, now)  # no-op (False) once latched
        if (prev is None or (g.deadman_hold and not prev.deadman_hold)) and g.deadman_hold:
            self._emit({"type": EventType.DEADMAN_HOLD, "source": "guardian"})

    # -- other threads -----------------------------------------------------------------------
    def wait_gstate(self, after: float, timeout: float,
                    pred: Callable[[GState], bool] = lambda g: True) -> GState | None:
        """Wait for a G_STATE received after `after` that satisfies `pred`."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                g = self.gstate
                if g is not None and self.gstate_at > after and pred(g):
                    return g
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                self._cond.wait(left)

    def wait_pong(self, host_time_us: int, timeout: float) -> tuple[Pong, float] | None:
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                for p, t in self._pongs:
                    if p.host_time_us == host_time_us:
                        return p, t
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                self._cond.wait(left)

    def reader_on_time(self, now: float, slack_s: float = 3.0) -> bool:
        """The guardian sends G_STATE at least every second: silence means a hung reader."""
        return self.last_frame_at > 0 and now - self.last_frame_at <= slack_s

    def summary(self) -> LinkStatus:
        g = self.gstate
        return {
            "link_up": self.link_up,
            "frames": self.frames,
            "guardian": None if g is None else {
                "latched": g.latched, "estop_input": g.estop_input,
                "deadman_hold": g.deadman_hold, "cause": g.cause.name.lower(),
                "flags": g.flags,
            },
            "firmware": None if self.hello is None else {
                "protocol": self.hello.proto_version, "accepted": self.hello.accepted,
                "version": self.hello.fw_version, "joints": self.hello.n_joints,
            },
        }

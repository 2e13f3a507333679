"""The wire protocol's vocabulary (docs/PROTOCOL.md §2): frame types, enums and message values.

Plain frozen dataclasses, no I/O; `edge_agent.link.codec` turns them into bytes and back (and
re-exports every name here, so callers import from the codec).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import IntEnum, IntFlag
from typing import ClassVar

PROTO_VERSION = 1


class FrameType(IntEnum):
    HELLO = 0x01
    ENABLE = 0x02
    COMMAND = 0x03
    STOP = 0x04
    PING = 0x05
    G_RESET = 0x41
    G_STATE = 0x42
    G_AT = 0x43
    HELLO_ACK = 0x81
    STATUS = 0x82
    ESTOP_EDGE = 0x83
    SENSOR = 0x84
    PONG = 0x85
    EVENT = 0x86


class Mode(IntEnum):
    HOLD = 0
    POSITION = 1


class GripperMode(IntEnum):
    HOLD = 0
    POSITION = 1
    FORCE = 2


class StopCategory(IntEnum):
    CAT0 = 0  # drives off (e-stop)
    CAT2 = 2  # hold with power on (protective stop)


class StopReason(IntEnum):
    NONE = 0
    ESTOP_INPUT = 1
    ESTOP_REMOTE = 2
    DEADMAN = 3
    LINK_FAULT = 4
    COLLISION = 5
    PROTECTIVE = 6
    SHUTDOWN = 7
    RESET_REFUSED = 8


class StatusFlag(IntFlag):
    ESTOP_INPUT = 1 << 0
    DRIVES_ENABLED = 1 << 1
    DEADMAN_TRIPPED = 1 << 2
    HOLDING = 1 << 3
    ESTOP_LATCHED = 1 << 4
    FAULT = 1 << 5
    SESSION_OPEN = 1 << 6


class EventCode(IntEnum):
    DEADMAN_TRIP = 1
    CMD_REJECTED = 2
    BAD_FRAME = 3
    VERSION_MISMATCH = 4
    LIMIT_CLAMPED = 5
    OVERCURRENT = 6


# --------------------------------------------------------------------------- messages


@dataclass(frozen=True, slots=True)
class Hello:
    TYPE: ClassVar[FrameType] = FrameType.HELLO
    proto_version: int = PROTO_VERSION
    deadman_ms: int = 50
    status_period_us: int = 1000


@dataclass(frozen=True, slots=True)
class Enable:
    TYPE: ClassVar[FrameType] = FrameType.ENABLE
    enable: bool


@dataclass(frozen=True, slots=True)
class Command:
    TYPE: ClassVar[FrameType] = FrameType.COMMAND
    mode: Mode
    q: tuple[float, ...]
    gripper_mode: GripperMode = GripperMode.HOLD
    gripper_setpoint: float = 0.0
    gripper_current_limit: float = 0.0
    ttl_ms: int = 0

    @property
    def moves(self) -> bool:
        """True when this command asks for motion (anything but a full hold)."""
        return self.mode != Mode.HOLD or self.gripper_mode != GripperMode.HOLD


@dataclass(frozen=True, slots=True)
class Stop:
    TYPE: ClassVar[FrameType] = FrameType.STOP
    category: StopCategory
    reason: StopReason


@dataclass(frozen=True, slots=True)
class Ping:
    TYPE: ClassVar[FrameType] = FrameType.PING
    host_time_us: int


@dataclass(frozen=True, slots=True)
class GReset:
    TYPE: ClassVar[FrameType] = FrameType.G_RESET


@dataclass(frozen=True, slots=True)
class GState:
    TYPE: ClassVar[FrameType] = FrameType.G_STATE
    latched: bool
    estop_input: bool
    deadman_hold: bool
    link_up: bool
    cause: StopReason
    flags: int = 0


@dataclass(frozen=True, slots=True)
class GAt:
    """A COMMAND the guardian writes to the tty at `at_us` (CLOCK_MONOTONIC, µs): the control
    loop's frames leave on its deadlines from the real-time process, whatever the daemon's
    own wake-up jitter (docs/PROTOCOL.md §5.2)."""

    TYPE: ClassVar[FrameType] = FrameType.G_AT
    at_us: int
    cmd: Command


@dataclass(frozen=True, slots=True)
class HelloAck:
    TYPE: ClassVar[FrameType] = FrameType.HELLO_ACK
    proto_version: int
    accepted: bool
    n_joints: int
    fw_version: str = ""


@dataclass(frozen=True, slots=True)
class Status:
    TYPE: ClassVar[FrameType] = FrameType.STATUS
    fw_time_us: int
    flags: StatusFlag
    last_cmd_seq: int
    q: tuple[float, ...]
    dq: tuple[float, ...]
    current: tuple[float, ...]
    gripper_pos: float
    gripper_current: float
    gripper_force: float

    @property
    def estop_input(self) -> bool:
        return bool(self.flags & StatusFlag.ESTOP_INPUT)


@dataclass(frozen=True, slots=True)
class EstopEdge:
    TYPE: ClassVar[FrameType] = FrameType.ESTOP_EDGE
    fw_time_us: int
    pressed: bool


@dataclass(frozen=True, slots=True)
class Sensor:
    TYPE: ClassVar[FrameType] = FrameType.SENSOR
    fw_time_us: int
    channel: int
    valid: bool
    values: tuple[float, ...] = field(default=())


@dataclass(frozen=True, slots=True)
class Pong:
    TYPE: ClassVar[FrameType] = FrameType.PONG
    host_time_us: int
    fw_time_us: int


@dataclass(frozen=True, slots=True)
class Event:
    TYPE: ClassVar[FrameType] = FrameType.EVENT
    fw_time_us: int
    code: EventCode
    detail: int = 0


Message = (
    Hello | Enable | Command | Stop | Ping | GReset | GState | GAt | HelloAck | Status | EstopEdge
    | Sensor | Pong | Event
)


@dataclass(frozen=True, slots=True)
class Frame:
    """One decoded frame: the sender's sequence number and the message."""

    seq: int
    msg: Message

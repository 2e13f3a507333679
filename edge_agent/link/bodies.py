"""Message bodies of docs/PROTOCOL.md §3: each message type's byte layout, packed and parsed.

Sans-IO like the codec that frames them (codec.py adds the header, CRC and COBS): values in,
bytes out, and back. A body that does not match its type's layout raises `BadBody`.
"""

from __future__ import annotations

import struct

from edge_agent.link.messages import (
    Command,
    Enable,
    EstopEdge,
    Event,
    EventCode,
    FrameType,
    GAt,
    GReset,
    GripperMode,
    GState,
    Hello,
    HelloAck,
    Message,
    Mode,
    Ping,
    Pong,
    Sensor,
    Status,
    StatusFlag,
    Stop,
    StopCategory,
    StopReason,
)

__all__ = ["BadBody", "pack_body", "parse_body"]

_U8 = struct.Struct("<B")
_U16 = struct.Struct("<H")
_HELLO = struct.Struct("<HHI")
_CMD_HEAD = struct.Struct("<BBHB")
_STOP = struct.Struct("<BB")
_U64 = struct.Struct("<Q")
_GSTATE = struct.Struct("<BBBBBB")
_ACK_HEAD = struct.Struct("<HBB")
_STATUS_HEAD = struct.Struct("<QHHB")
_EDGE = struct.Struct("<QB")
_SENSOR_HEAD = struct.Struct("<QBBB")
_PONG = struct.Struct("<QQ")
_EVENT = struct.Struct("<QBH")
_F32_CACHE: dict[int, struct.Struct] = {}


def _f32s(n: int) -> struct.Struct:
    s = _F32_CACHE.get(n)
    if s is None:
        s = _F32_CACHE[n] = struct.Struct(f"<{n}f")
    return s


def pack_body(msg: Message) -> bytes:
    """The body of `msg` (no header, no CRC); TypeError if it is not a protocol message."""
    if isinstance(msg, Command):
        n = len(msg.q)
        return _CMD_HEAD.pack(msg.mode, msg.gripper_mode, msg.ttl_ms, n) + _f32s(n + 2).pack(
            *msg.q, msg.gripper_setpoint, msg.gripper_current_limit
        )
    if isinstance(msg, Status):
        n = len(msg.q)
        if len(msg.dq) != n or len(msg.current) != n:
            raise ValueError("status q, dq and current must have the same length")
        return _STATUS_HEAD.pack(msg.fw_time_us, msg.flags, msg.last_cmd_seq, n) + _f32s(
            3 * n + 3
        ).pack(*msg.q, *msg.dq, *msg.current, msg.gripper_pos, msg.gripper_current,
               msg.gripper_force)
    if isinstance(msg, Stop):
        return _STOP.pack(msg.category, msg.reason)
    if isinstance(msg, EstopEdge):
        return _EDGE.pack(msg.fw_time_us, msg.pressed)
    if isinstance(msg, Hello):
        return _HELLO.pack(msg.proto_version, msg.deadman_ms, msg.status_period_us)
    if isinstance(msg, Enable):
        return _U8.pack(1 if msg.enable else 0)
    if isinstance(msg, Ping):
        return _U64.pack(msg.host_time_us)
    if isinstance(msg, GReset):
        return b""
    if isinstance(msg, GAt):
        return _U64.pack(msg.at_us) + pack_body(msg.cmd)
    if isinstance(msg, GState):
        return _GSTATE.pack(msg.latched, msg.estop_input, msg.deadman_hold, msg.link_up,
                            msg.cause, msg.flags)
    if isinstance(msg, HelloAck):
        v = msg.fw_version.encode("ascii", "replace")[:16]
        return _ACK_HEAD.pack(msg.proto_version, msg.accepted, msg.n_joints) + v
    if isinstance(msg, Sensor):
        n = len(msg.values)
        return _SENSOR_HEAD.pack(msg.fw_time_us, msg.channel, msg.valid, n) + _f32s(n).pack(
            *msg.values
        )
    if isinstance(msg, Pong):
        return _PONG.pack(msg.host_time_us, msg.fw_time_us)
    if isinstance(msg, Event):
        return _EVENT.pack(msg.fw_time_us, msg.code, msg.detail)
    raise TypeError(f"not a protocol message: {msg!r}")


class BadBody(Exception):
    """The body does not match its type's layout."""


def parse_body(ftype: int, b: bytes) -> Message:
    """The message of type `ftype` in body `b`; BadBody if malformed, KeyError if no such type."""
    try:
        if ftype == FrameType.STATUS:
            t, flags, last, n = _STATUS_HEAD.unpack_from(b)
            vals = _f32s(3 * n + 3).unpack_from(b, _STATUS_HEAD.size)
            if len(b) != _STATUS_HEAD.size + 4 * (3 * n + 3):
                raise BadBody
            return Status(t, StatusFlag(flags), last, vals[:n], vals[n : 2 * n],
                          vals[2 * n : 3 * n], vals[3 * n], vals[3 * n + 1], vals[3 * n + 2])
        if ftype == FrameType.COMMAND:
            mode, gmode, ttl, n = _CMD_HEAD.unpack_from(b)
            if len(b) != _CMD_HEAD.size + 4 * (n + 2):
                raise BadBody
            vals = _f32s(n + 2).unpack_from(b, _CMD_HEAD.size)
            return Command(Mode(mode), vals[:n], GripperMode(gmode), vals[n], vals[n + 1], ttl)
        if ftype == FrameType.ESTOP_EDGE:
            _exact(b, _EDGE)
            t, p = _EDGE.unpack(b)
            return EstopEdge(t, bool(p))
        if ftype == FrameType.STOP:
            _exact(b, _STOP)
            c, r = _STOP.unpack(b)
            return Stop(StopCategory(c), StopReason(r))
        if ftype == FrameType.ENABLE:
            _exact(b, _U8)
            return Enable(bool(b[0]))
        if ftype == FrameType.HELLO:
            _exact(b, _HELLO)
            return Hello(*_HELLO.unpack(b))
        if ftype == FrameType.PING:
            _exact(b, _U64)
            return Ping(_U64.unpack(b)[0])
        if ftype == FrameType.G_RESET:
            if b:
                raise BadBody
            return GReset()
        if ftype == FrameType.G_AT:
            cmd = parse_body(FrameType.COMMAND, b[_U64.size :])
            if not isinstance(cmd, Command):  # a short body already raised BadBody
                raise BadBody
            return GAt(_U64.unpack_from(b)[0], cmd)
        if ftype == FrameType.G_STATE:
            _exact(b, _GSTATE)
            la, ei, dh, lu, cause, flags = _GSTATE.unpack(b)
            return GState(bool(la), bool(ei), bool(dh), bool(lu), StopReason(cause), flags)
        if ftype == FrameType.HELLO_ACK:
            if not _ACK_HEAD.size <= len(b) <= _ACK_HEAD.size + 16:
                raise BadBody
            v, acc, nj = _ACK_HEAD.unpack_from(b)
            return HelloAck(v, bool(acc), nj, b[_ACK_HEAD.size :].decode("ascii", "replace"))
        if ftype == FrameType.SENSOR:
            t, ch, valid, n = _SENSOR_HEAD.unpack_from(b)
            if len(b) != _SENSOR_HEAD.size + 4 * n:
                raise BadBody
            return Sensor(t, ch, bool(valid), _f32s(n).unpack_from(b, _SENSOR_HEAD.size))
        if ftype == FrameType.PONG:
            _exact(b, _PONG)
            return Pong(*_PONG.unpack(b))
        if ftype == FrameType.EVENT:
            _exact(b, _EVENT)
            t, code, detail = _EVENT.unpack(b)
            return Event(t, EventCode(code), detail)
    except (struct.error, ValueError) as exc:  # short body, enum value out of range
        raise BadBody from exc
    raise KeyError(ftype)


def _exact(b: bytes, s: struct.Struct) -> None:
    if len(b) != s.size:
        raise BadBody

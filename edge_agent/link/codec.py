"""Sans-IO codec for docs/PROTOCOL.md: COBS framing, CRC-32, typed messages, a resyncing decoder.

No I/O, no threads, no globals that change: bytes in, messages out. The same module serves the
link guardian, the daemon's socketpair reader and the simulated firmware. Each message type's
body layout lives in bodies.py; the message types in messages.py (both re-exported here, so
callers import the protocol from one place).
"""

from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass
from enum import IntEnum

from edge_agent.link.bodies import BadBody, pack_body, parse_body
from edge_agent.link.messages import (
    PROTO_VERSION,
    Command,
    Enable,
    EstopEdge,
    Event,
    EventCode,
    Frame,
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

__all__ = [
    "MAX_FRAME_LEN",
    "MAX_WIRE_LEN",
    "PROTO_VERSION",
    "BadBody",
    "Command",
    "DecodeError",
    "DecoderCounters",
    "Enable",
    "EstopEdge",
    "Event",
    "EventCode",
    "Frame",
    "FrameDecoder",
    "FrameType",
    "GAt",
    "GReset",
    "GState",
    "GripperMode",
    "Hello",
    "HelloAck",
    "Message",
    "Mode",
    "Ping",
    "Pong",
    "Sensor",
    "SeqCounter",
    "Status",
    "StatusFlag",
    "Stop",
    "StopCategory",
    "StopReason",
    "cobs_decode",
    "cobs_encode",
    "decode_frame",
    "encode",
]

MAX_FRAME_LEN = 255  # decoded: type + seq + body + crc
MAX_WIRE_LEN = MAX_FRAME_LEN + MAX_FRAME_LEN // 254 + 1  # COBS-encoded, delimiters excluded
_HEADER = struct.Struct("<BH")
_CRC = struct.Struct("<I")
_MIN_FRAME_LEN = _HEADER.size + _CRC.size


# --------------------------------------------------------------------------- COBS


def cobs_encode(data: bytes) -> bytes:
    """COBS-encode `data` (no delimiter appended)."""
    out = bytearray()
    for part in data.split(b"\x00"):
        while len(part) >= 254:
            out.append(255)
            out += part[:254]
            part = part[254:]
        out.append(len(part) + 1)
        out += part
    return bytes(out)


def cobs_decode(data: bytes) -> bytes | None:
    """Decode one COBS block (delimiter removed); None if malformed."""
    out = bytearray()
    i = 0
    n = len(data)
    while i < n:
        code = data[i]
        if code == 0:
            return None
        end = i + code
        if end > n:
            return None
        out += data[i + 1 : end]
        i = end
        if code < 255 and i < n:
            out.append(0)
    return bytes(out)


def encode(msg: Message, seq: int) -> bytes:
    """Encode `msg` as one wire frame: 0x00, COBS(frame), 0x00."""
    try:
        raw = _HEADER.pack(msg.TYPE, seq & 0xFFFF) + pack_body(msg)
    except (struct.error, OverflowError) as exc:  # OverflowError: a float past the f32 range
        raise ValueError(f"cannot encode {type(msg).__name__}: {exc}") from exc
    if len(raw) + _CRC.size > MAX_FRAME_LEN:
        raise ValueError(f"{type(msg).__name__} frame is {len(raw) + 4} bytes > {MAX_FRAME_LEN}")
    raw += _CRC.pack(zlib.crc32(raw))
    # A delimiter on both sides: a frame that follows line noise is still found intact.
    return b"\x00" + cobs_encode(raw) + b"\x00"


class DecodeError(IntEnum):
    """Why one frame was rejected (the decoder counts these; it never raises)."""

    COBS = 1
    CRC = 2
    OVERSIZE = 3
    SHORT = 4
    UNKNOWN_TYPE = 5
    BAD_BODY = 6


def decode_frame(wire: bytes) -> Frame | DecodeError:
    """Decode one frame given without its 0x00 delimiter."""
    if len(wire) > MAX_WIRE_LEN:
        return DecodeError.OVERSIZE
    raw = cobs_decode(wire)
    if raw is None:
        return DecodeError.COBS
    if len(raw) > MAX_FRAME_LEN:
        return DecodeError.OVERSIZE
    if len(raw) < _MIN_FRAME_LEN:
        return DecodeError.SHORT
    if zlib.crc32(raw[:-4]) != _CRC.unpack_from(raw, len(raw) - 4)[0]:
        return DecodeError.CRC
    ftype, seq = _HEADER.unpack_from(raw)
    try:
        msg = parse_body(ftype, raw[_HEADER.size : -4])
    except KeyError:
        return DecodeError.UNKNOWN_TYPE
    except BadBody:
        return DecodeError.BAD_BODY
    return Frame(seq, msg)


@dataclass
class DecoderCounters:
    frames_ok: int = 0
    crc_errors: int = 0
    cobs_errors: int = 0
    oversize: int = 0
    short: int = 0
    unknown_type: int = 0
    bad_body: int = 0
    bytes_discarded: int = 0
    seq_gaps: int = 0
    duplicates: int = 0

    @property
    def bad_frames(self) -> int:
        return (self.crc_errors + self.cobs_errors + self.oversize + self.short
                + self.unknown_type + self.bad_body)

    def as_dict(self) -> dict[str, int]:
        return {k: getattr(self, k) for k in self.__dataclass_fields__} | {
            "bad_frames": self.bad_frames
        }


_ERR_FIELD = {
    DecodeError.COBS: "cobs_errors",
    DecodeError.CRC: "crc_errors",
    DecodeError.OVERSIZE: "oversize",
    DecodeError.SHORT: "short",
    DecodeError.UNKNOWN_TYPE: "unknown_type",
    DecodeError.BAD_BODY: "bad_body",
}


class FrameDecoder:
    """Streaming decoder: feed it bytes as they arrive, get the valid frames back.

    Bad frames are counted and skipped; input without a delimiter is bounded by MAX_WIRE_LEN
    (longer runs are discarded until the next 0x00), so garbage can neither raise nor grow memory.
    """

    def __init__(self) -> None:
        self.counters = DecoderCounters()
        self._buf = bytearray()
        self._overflowing = False
        self._last_seq: int | None = None
        self.last_error: DecodeError | None = None

    def feed(self, data: bytes) -> list[Frame]:
        frames: list[Frame] = []
        c = self.counters
        start = 0
        n = len(data)
        while start < n:
            idx = data.find(0, start)
            if idx < 0:
                chunk = data[start:]
                if self._overflowing:
                    c.bytes_discarded += len(chunk)
                elif len(self._buf) + len(chunk) > MAX_WIRE_LEN:
                    c.bytes_discarded += len(self._buf) + len(chunk)
                    self._buf.clear()
                    self._overflowing = True
                    c.oversize += 1
                    self.last_error = DecodeError.OVERSIZE
                else:
                    self._buf += chunk
                break
            if self._overflowing:
                c.bytes_discarded += idx - start
                self._overflowing = False
            else:
                self._buf += data[start:idx]
                if self._buf:
                    self._handle(bytes(self._buf), frames)
            self._buf.clear()
            start = idx + 1
        return frames

    def _handle(self, wire: bytes, frames: list[Frame]) -> None:
        c = self.counters
        res = decode_frame(wire)
        if isinstance(res, DecodeError):
            setattr(c, _ERR_FIELD[res], getattr(c, _ERR_FIELD[res]) + 1)
            c.bytes_discarded += len(wire) + 1
            self.last_error = res
            return
        c.frames_ok += 1
        self.last_error = None
        if self._last_seq is not None:
            expected = (self._last_seq + 1) & 0xFFFF
            if res.seq == self._last_seq:
                c.duplicates += 1
            elif res.seq != expected:
                c.seq_gaps += 1
        self._last_seq = res.seq
        frames.append(res)

    def reset(self) -> None:
        """Forget partial input and the sequence history (after a reopen), keep the counters."""
        self._buf.clear()
        self._overflowing = False
        self._last_seq = None


class SeqCounter:
    """Per-direction sequence numbers: 0..65535, wrapping."""

    __slots__ = ("_next",)

    def __init__(self, start: int = 0) -> None:
        self._next = start & 0xFFFF

    def next(self) -> int:
        s = self._next
        self._next = (s + 1) & 0xFFFF
        return s

    def peek(self) -> int:
        """The number `next()` returns next, not taken (a frame encoded before it is sent)."""
        return self._next

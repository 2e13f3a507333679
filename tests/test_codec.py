"""The serial codec against docs/PROTOCOL.md: golden bytes, COBS, fuzzing, decoder counters.

The default run feeds FUZZ_CASES (default 100,000; EDGE_FUZZ_CASES overrides) seeded random and
mutated inputs into the decoder, plus Hypothesis properties at moderate example counts.
"""

from __future__ import annotations

import os
import random
import struct
import zlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from edge_agent.link.codec import (
    MAX_FRAME_LEN,
    MAX_WIRE_LEN,
    Command,
    DecodeError,
    Enable,
    EstopEdge,
    Event,
    EventCode,
    Frame,
    FrameDecoder,
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
    SeqCounter,
    Status,
    StatusFlag,
    Stop,
    StopCategory,
    StopReason,
    cobs_decode,
    cobs_encode,
    decode_frame,
    encode,
)

FUZZ_CASES = int(os.environ.get("EDGE_FUZZ_CASES", "100000"))

_STATUS = Status(1_000_000, StatusFlag.ESTOP_INPUT | StatusFlag.SESSION_OPEN, 258, (0.0, 0.5),
                 (0.0, -0.25), (1.0, 2.0), 0.0625, 0.125, 5.0)
_COMMAND = Command(Mode.POSITION, (0.0, 0.5, -1.0, 1.5), GripperMode.FORCE, 10.0, 0.5, ttl_ms=20)

# (message, seq, wire hex, the frame's layout per PROTOCOL.md §2 as (struct format, values))
GOLDEN: list[tuple[Message, int, str, str, tuple[object, ...]]] = [
    (Stop(StopCategory.CAT0, StopReason.ESTOP_INPUT), 7,
     "00030407010601f25972d900", "<BB", (0, 1)),
    (Stop(StopCategory.CAT2, StopReason.DEADMAN), 0x1234,
     "000a04341202030d7a76f800", "<BB", (2, 3)),
    (Hello(proto_version=1, deadman_ms=50, status_period_us=1000), 0,
     "000201010201023203e80301059a1f9c3e00", "<HHI", (1, 50, 1000)),
    (Enable(True), 1, "000302010601364d88fd00", "<B", (1,)),
    (_COMMAND, 258,
     "00070302010102140204010101010101023f010380bf0103c03f010320410101063fa0f450f400",
     "<BBHB6f", (1, 2, 20, 4, 0.0, 0.5, -1.0, 1.5, 10.0, 0.5)),
    (Ping(0x0102030405060708), 3, "000305030d0807060504030201e194093100",
     "<Q", (0x0102030405060708,)),
    (GReset(), 4, "0003410405e1fb75ea00", "<", ()),
    (GAt(123456789012, _COMMAND), 13,
     "0003430d06141a99be1c0101040102140204010101010101023f010380bf0103c03f010320410101063fc4842c"
     "f300",
     "<QBBHB6f", (123456789012, 1, 2, 20, 4, 0.0, 0.5, -1.0, 1.5, 10.0, 0.5)),
    (GState(True, True, False, True, StopReason.ESTOP_INPUT, 0), 5,
     "0003420503010103010105289068b000", "<6B", (1, 1, 0, 1, 1, 0)),
    (HelloAck(1, True, 4, "sim-1.0"), 0, "0002810102010e010473696d2d312e3036548e5400",
     "<HBB7s", (1, 1, 4, b"sim-1.0")),
    (_STATUS, 65535,
     "000782ffff40420f01010101024104020102010101010101023f01010101010380be0103803f010102400103"
     "803d0101023e0105a0407eb002c200",
     "<QHHB9f", (1_000_000, 0x41, 258, 2, 0.0, 0.5, 0.0, -0.25, 1.0, 2.0, 0.0625, 0.125, 5.0)),
    (EstopEdge(123456789, True), 9, "000383090515cd5b07010101060141ade55b00",
     "<QB", (123456789, 1)),
    (Sensor(5_000, 1, True, (0.25, -0.5, 1.0)), 10,
     "0003840a0388130101010101040101030103803e010102bf0107803fe4adc87600",
     "<QBBB3f", (5000, 1, 1, 3, 0.25, -0.5, 1.0)),
    (Pong(1, 2), 11, "0003850b02010101010101010202010101010101050779096f00", "<QQ", (1, 2)),
    (Event(42, EventCode.DEADMAN_TRIP, 51), 12, "0003860c022a010101010101030133053cbc2aa100",
     "<QBH", (42, 1, 51)),
]


def _ref_cobs(data: bytes) -> bytes:
    """COBS straight from its definition (Cheshire & Baker), independent of the codec's."""
    out, block = bytearray(), bytearray()
    for b in data:
        if b == 0:
            out += bytes([len(block) + 1]) + block
            block.clear()
        else:
            block.append(b)
            if len(block) == 254:
                out += b"\xff" + block
                block.clear()
    out += bytes([len(block) + 1]) + block
    return bytes(out)


@pytest.mark.parametrize(("msg", "seq", "wire_hex", "fmt", "values"), GOLDEN,
                         ids=[type(g[0]).__name__ + str(g[1]) for g in GOLDEN])
def test_golden_bytes(msg: Message, seq: int, wire_hex: str, fmt: str,
                      values: tuple[object, ...]) -> None:
    wire = bytes.fromhex(wire_hex)
    assert encode(msg, seq) == wire
    # The pinned bytes follow the spec: type:u8 seq:u16 body crc32:u32, COBS, 0x00 on both sides.
    raw = struct.pack("<BH", msg.TYPE, seq) + struct.pack(fmt, *values)
    raw += struct.pack("<I", zlib.crc32(raw))
    assert wire == b"\x00" + _ref_cobs(raw) + b"\x00"
    assert decode_frame(wire[1:-1]) == Frame(seq, msg)
    assert FrameDecoder().feed(wire) == [Frame(seq, msg)]


def test_golden_types_cover_every_frame_type() -> None:
    from edge_agent.link.codec import FrameType

    assert {g[0].TYPE for g in GOLDEN} == set(FrameType)


# --------------------------------------------------------------------------- COBS

_zero_heavy = st.lists(st.sampled_from([0, 0, 0, 1, 0xFF]), max_size=600).map(bytes)
_runs = st.builds(lambda n, z, tail: b"\x07" * n + b"\x00" * z + tail,
                  st.sampled_from([0, 1, 253, 254, 255, 508, 509]), st.integers(0, 3),
                  st.binary(max_size=3))


@settings(deadline=None, max_examples=400)
@given(st.one_of(st.binary(max_size=700), _zero_heavy, _runs))
def test_cobs_round_trip(data: bytes) -> None:
    enc = cobs_encode(data)
    assert 0 not in enc
    assert enc == _ref_cobs(data)
    assert len(enc) <= len(data) + len(data) // 254 + 1
    assert cobs_decode(enc) == data


@pytest.mark.parametrize("n", [0, 1, 253, 254, 255, 508, 509, 600])
def test_cobs_runs_around_block_boundaries(n: int) -> None:
    for data in (b"\x11" * n, b"\x00" * n, b"\x11" * n + b"\x00", b"\x00" + b"\x11" * n):
        assert cobs_decode(cobs_encode(data)) == data


def test_max_length_frame_fits_the_wire_bound() -> None:
    # A 255-byte frame with no zero byte anywhere is the worst case for COBS.
    n = (MAX_FRAME_LEN - 3 - 11 - 4) // 4  # a Sensor frame of 254 bytes
    (nonzero,) = struct.unpack("<f", b"\x83\x82\x81\x3f")  # no zero byte in its f32
    msg = Sensor(0x0101010101010101, 1, True, tuple([nonzero] * n))
    wire = encode(msg, 0x0101)
    assert len(cobs_decode(wire[1:-1]) or b"") == 254
    assert 0 not in wire[1:-1] and len(wire) - 2 <= MAX_WIRE_LEN
    assert FrameDecoder().feed(wire) == [Frame(0x0101, msg)]


# --------------------------------------------------------------------------- fuzzing


def _sample_frames(rng: random.Random) -> list[bytes]:
    f = [rng.uniform(-10, 10) for _ in range(8)]
    msgs: list[Message] = [g[0] for g in GOLDEN] + [
        Command(Mode.HOLD, tuple(f[:4]), GripperMode.POSITION, f[4], f[5], 100),
        Status(2**63, StatusFlag(0x7F), 65535, tuple(f[:6]), tuple(f[:6]), tuple(f[:6]), *f[:3]),
        Sensor(7, 0, False, ()),
        HelloAck(1, False, 0, "x" * 16),
    ]
    return [encode(m, rng.randrange(65536)) for m in msgs]


def _mutate(rng: random.Random, b: bytes) -> bytes:
    out = bytearray(b)
    for _ in range(rng.randint(1, 3)):
        op = rng.randrange(5)
        i = rng.randrange(len(out) + 1)
        if op == 0 and out:
            out[min(i, len(out) - 1)] ^= 1 << rng.randrange(8)
        elif op == 1:
            del out[i: i + rng.randint(1, 8)]
        elif op == 2:
            out[i:i] = rng.randbytes(rng.randint(1, 8))
        elif op == 3:
            del out[i:]
        else:
            out[i:i] = out[: rng.randint(0, len(out))]  # a repeated piece
    return bytes(out)


def test_fuzz_decoder_never_raises_and_finds_embedded_frames() -> None:
    rng = random.Random(0xC0B5)
    frames = _sample_frames(rng)
    dec = FrameDecoder()
    found = 0
    for case in range(FUZZ_CASES):
        kind = case % 4
        if kind == 0:
            data = rng.randbytes(rng.randint(0, 400))
        elif kind == 1:
            data = bytes(rng.choice((0, 0, 1, 0xFF, rng.randrange(256)))
                         for _ in range(rng.randint(0, 64)))
        elif kind == 2:
            data = _mutate(rng, rng.choice(frames))
        else:  # a valid frame between two pieces of garbage, fed in random chunks
            good = rng.choice(frames)
            data = _mutate(rng, rng.choice(frames)) + good + rng.randbytes(rng.randint(0, 300))
        assert isinstance(decode_frame(data), (Frame, DecodeError))
        out: list[Frame] = []
        pos = 0
        while pos < len(data):
            step = rng.randint(1, 512)
            out += dec.feed(data[pos: pos + step])
            pos += step
            assert len(dec._buf) <= MAX_WIRE_LEN  # white box: garbage never grows memory
        if kind == 3:
            want = decode_frame(good[1:-1])
            assert want in out, f"case {case}: the valid frame was lost in garbage"
            found += 1
    c = dec.counters
    assert found == FUZZ_CASES // 4
    assert c.frames_ok >= found and c.bad_frames > FUZZ_CASES // 4


@settings(deadline=None, max_examples=300)
@given(st.binary(max_size=600), st.sampled_from(range(len(GOLDEN))), st.binary(max_size=300),
       st.integers(1, 64))
def test_any_garbage_around_a_frame(before: bytes, which: int, after: bytes, chunk: int) -> None:
    msg, seq = GOLDEN[which][0], GOLDEN[which][1]
    data = before + encode(msg, seq) + after
    dec = FrameDecoder()
    out: list[Frame] = []
    for i in range(0, len(data), chunk):
        out += dec.feed(data[i: i + chunk])
    assert Frame(seq, msg) in out


# --------------------------------------------------------------------------- counters


def _frame_raw(msg: Message, seq: int) -> bytes:
    wire = encode(msg, seq)
    raw = cobs_decode(wire[1:-1])
    assert raw is not None
    return raw


def test_bit_flip_counts_a_crc_error_and_the_next_frame_survives() -> None:
    raw = bytearray(_frame_raw(_STATUS, 1))
    raw[12] ^= 0x04  # inside q[0]
    dec = FrameDecoder()
    assert dec.feed(b"\x00" + cobs_encode(bytes(raw)) + b"\x00" + encode(_STATUS, 2)) == [
        Frame(2, _STATUS)]
    assert (dec.counters.crc_errors, dec.counters.frames_ok) == (1, 1)
    assert dec.last_error is None


def test_truncated_frames_are_counted() -> None:
    wire = encode(_STATUS, 1)
    dec = FrameDecoder()
    dec.feed(wire[:20])  # the rest never arrives; the next frame's delimiter ends it
    assert dec.feed(encode(_STATUS, 2)) == [Frame(2, _STATUS)]
    dec.feed(b"\x00\x03\x82\x01\x00")  # 2 bytes decoded: shorter than any frame
    c = dec.counters
    assert c.short == 1 and c.bad_frames == 2 and c.frames_ok == 1


def test_duplicates_and_gaps_are_counted() -> None:
    dec = FrameDecoder()
    stop = Stop(StopCategory.CAT2, StopReason.PROTECTIVE)
    out = dec.feed(encode(stop, 65534) + encode(stop, 65535) + encode(stop, 65535)
                   + encode(stop, 0) + encode(stop, 5))
    assert [f.seq for f in out] == [65534, 65535, 65535, 0, 5]  # the decoder drops nothing
    assert (dec.counters.duplicates, dec.counters.seq_gaps) == (1, 1)
    dec.reset()
    dec.feed(encode(stop, 100))
    assert dec.counters.seq_gaps == 1  # no gap across a reset


def test_oversize_junk_is_bounded_and_the_decoder_recovers() -> None:
    dec = FrameDecoder()
    for _ in range(100):
        dec.feed(b"\x5a" * 100)
        assert len(dec._buf) <= MAX_WIRE_LEN  # white box: never buffered past the bound
    assert dec.counters.oversize == 1
    assert dec.counters.bytes_discarded == 10_000
    assert dec.last_error is DecodeError.OVERSIZE
    assert dec.feed(encode(_COMMAND, 9)) == [Frame(9, _COMMAND)]
    assert decode_frame(b"\x01" * (MAX_WIRE_LEN + 1)) is DecodeError.OVERSIZE


def test_unknown_type_and_bad_body_are_counted() -> None:
    raw = bytearray(_frame_raw(Enable(True), 1))
    raw[0] = 0x7E
    bad_body = struct.pack("<BH", 0x04, 2) + b"\x00\x09"  # STOP with reason 9: no such reason
    frames = [bytes(raw[:-4]), bad_body]
    wire = b"".join(b"\x00" + cobs_encode(f + struct.pack("<I", zlib.crc32(f))) + b"\x00"
                    for f in frames)
    dec = FrameDecoder()
    assert dec.feed(wire) == []
    assert (dec.counters.unknown_type, dec.counters.bad_body) == (1, 1)


# --------------------------------------------------------------------------- encode


def test_seq_is_masked_to_16_bits() -> None:
    ping = Ping(1)
    assert encode(ping, 65536) == encode(ping, 0)
    assert encode(ping, -1) == encode(ping, 65535)
    counter = SeqCounter(65535)
    assert [counter.next() for _ in range(3)] == [65535, 0, 1]


@pytest.mark.parametrize("msg", [
    Ping(-1), Ping(2**64), Hello(deadman_ms=70_000), Hello(proto_version=-1),
    GState(True, False, False, True, StopReason.NONE, flags=256),
    Event(0, EventCode.OVERCURRENT, detail=65536), Sensor(0, 256, True, ()),
    Command(Mode.POSITION, (1e39,)), Command(Mode.POSITION, (0.0,) * 59),
    Command(Mode.POSITION, (0.0,), ttl_ms=65536),
    Status(0, StatusFlag(0), 70_000, (), (), (), 0.0, 0.0, 0.0),
    Status(0, StatusFlag(0), 0, (0.0,), (), (), 0.0, 0.0, 0.0),
], ids=repr)
def test_encode_rejects_out_of_range_values(msg: Message) -> None:
    with pytest.raises(ValueError):
        encode(msg, 0)


def test_encode_rejects_non_messages() -> None:
    with pytest.raises(TypeError):
        encode(Enable, 0)  # type: ignore[arg-type]

"""The flight recorder's ring (edge_agent/observe/ring.py): blocks of packed frames, order, trims.

Real link frames: STATUS messages built by the codec and packed as the recorder packs them.
"""

from __future__ import annotations

import random

from edge_agent.link.codec import Status, StatusFlag
from edge_agent.observe import channels as ch
from edge_agent.observe.capture import PACKED, pack, unpack
from edge_agent.observe.ring import BLOCK_N, Block, Frames, Ring

_NS = 1_000_000_000


def _status(i: int) -> Status:
    rnd = random.Random(i)

    def f32s(n: int) -> tuple[float, ...]:  # exact in f32, as the wire carries them
        return tuple(rnd.randint(-4096, 4096) / 1024 for _ in range(n))

    return Status(fw_time_us=i * 1000, flags=StatusFlag(0), last_cmd_seq=i & 0xFFFF,
                  q=f32s(4), dq=f32s(4), current=f32s(4), gripper_pos=0.0390625,
                  gripper_current=0.125, gripper_force=0.0)


def _stream(n: int, t0: int = 10 * _NS) -> list[tuple[str, int, object]]:
    """1 kHz STATUS packed as the recorder packs it, an event every 100 ms in between."""
    out: list[tuple[str, int, object]] = []
    for i in range(n):
        t = t0 + i * 1_000_000
        out.append(pack((ch.LINK_STATUS, t, _status(i))))
        if i % 100 == 50:
            out.append((ch.EVENTS, t + 1, {"type": "tick", "i": i}))
    return out


def expanded(ring: Ring, start_ns: int = 0) -> list[tuple[str, int, object]]:
    """Every message of the ring at or after `start_ns`, its blocks unpacked, sorted by time:
    what a capture begun then writes."""
    out: list[tuple[str, int, object]] = []
    for item in ring.backlog(start_ns):
        out.extend(item[2].items() if isinstance(item[2], Frames) else [item])
    return sorted(out, key=lambda x: x[1])


def test_status_frames_round_trip_through_sealed_and_filling_blocks() -> None:
    items = _stream(3 * BLOCK_N + 17)  # three sealed blocks and one still filling
    assert all(type(x[2]) is bytes for x in items if x[0] == ch.LINK_STATUS)
    ring = Ring(PACKED)
    for x in items:
        ring.add(x, 100)
    assert ring.messages == len(items) and ring.bytes == 100 * len(items)
    back = expanded(ring)
    assert back == sorted(items, key=lambda x: x[1])  # every message, byte for byte, in order
    first = next(x for x in back if x[0] == ch.LINK_STATUS)
    assert unpack(first[0], first[2]) == _status(0)  # and the capture parses it back


def test_a_full_block_is_compressed() -> None:
    block = Block(ch.LINK_STATUS)
    raw = 0
    for i in range(BLOCK_N):
        body = pack((ch.LINK_STATUS, i, _status(i)))[2]
        assert isinstance(body, bytes)
        raw += len(body)
        full = block.add(i, body)
        assert full is (i == BLOCK_N - 1)
    assert block.sealed and isinstance(block.data, bytes) and len(block.data) < raw
    assert [x[1] for x in block.items()] == list(range(BLOCK_N))


def test_a_backlog_takes_only_what_is_recent_enough() -> None:
    items = _stream(1000)
    ring = Ring(PACKED)
    for x in items:
        ring.add(x, 1)
    start = items[0][1] + 600 * 1_000_000 + 500  # mid-block
    got = expanded(ring, start)
    assert got == sorted((x for x in items if x[1] >= start), key=lambda x: x[1])


def test_trim_by_time_drops_whole_old_blocks_and_keeps_the_count() -> None:
    items = _stream(2000)
    ring = Ring(PACKED)
    for x in items:
        ring.add(x, 10)
    cut = items[-1][1] - _NS + 1  # keep the last second
    ring.trim(cut, 1 << 40)
    kept = expanded(ring)
    assert ring.messages == len(kept) and ring.bytes == 10 * len(kept)
    # all of the last second is there; older frames only in a block that reaches into it (a
    # block leaves when its newest frame is too old), so at most one block's span older
    keys = {(x[0], x[1]) for x in kept}
    assert all((x[0], x[1]) in keys for x in items if x[1] >= cut)
    assert cut - BLOCK_N * 1_000_000 < min(x[1] for x in kept) < cut
    assert len(kept) < len(items) * 2 // 3  # 2 s in, ~1 s + a block out


def test_trim_by_bytes_and_an_emptied_ring_starts_again() -> None:
    ring = Ring(PACKED)
    for x in _stream(BLOCK_N + 10):
        ring.add(x, 50)
    ring.trim(0, 0)  # over any byte bound: everything goes, the filling block too
    assert ring.messages == 0 and ring.bytes == 0 and expanded(ring) == []
    again = _stream(5, t0=100 * _NS)
    for x in again:
        ring.add(x, 50)
    assert expanded(ring) == again


def test_unpacked_payloads_of_a_packed_topic_are_kept_as_they_are() -> None:
    ring = Ring(PACKED)
    odd = (ch.LINK_STATUS, 5, {"not": "a frame"})  # what pack() leaves when it cannot pack
    ring.add(odd, 1)
    assert expanded(ring) == [odd]


def test_frames_encode_the_same_after_the_ring() -> None:
    # the capture encodes what the backlog unpacks to: the same JSON as straight from the tap
    item = (ch.LINK_STATUS, 7 * _NS, _status(3))
    ring = Ring(PACKED)
    ring.add(pack(item), 1)
    (back,) = expanded(ring)
    assert ch.encode(back[0], unpack(back[0], back[2]), back[1]) == \
        ch.encode(item[0], item[2], item[1])


def test_a_captures_backlog_keeps_blocks_packed_until_written() -> None:
    from edge_agent.observe.ring import Frames

    items = _stream(2 * BLOCK_N + 30)  # two sealed blocks and a filling one
    ring = Ring(PACKED)
    for x in items:
        ring.add(x, 1)
    start = items[BLOCK_N // 2][1]  # mid first block
    backlog = ring.backlog(start)
    packed = [x for x in backlog if type(x[2]) is Frames]
    assert len(packed) == 3 and len(backlog) < len(items) // 4
    later = _stream(5, t0=items[-1][1] + 1_000_000)  # the filling block grows after it
    for x in later:
        ring.add(x, 1)
    expanded: list[tuple[str, int, object]] = []
    for x in backlog:
        expanded.extend(x[2].items() if type(x[2]) is Frames else [x])
    want = [x for x in items if x[1] >= start]  # nothing of `later`: the capture gets them new
    assert sorted(expanded, key=lambda x: x[1]) == sorted(want, key=lambda x: x[1])
    assert [x[1] for x in backlog] == sorted(x[1] for x in backlog)


def test_a_rare_topic_does_not_hold_the_ring_back() -> None:
    """A block is one ring entry at its first frame: one of a topic that sends once a second
    must not stay open for minutes, or trimming stops at it (the ring grew past its seconds)."""
    ring = Ring(PACKED)
    t0 = 10 * _NS
    for i in range(30_000):  # 30 s of 1 kHz STATUS, an RX frame every second
        t = t0 + i * 1_000_000
        ring.add(pack((ch.LINK_STATUS, t, _status(i % 50))), 1)
        if i % 1000 == 0:
            ring.add(pack((ch.LINK_RX, t + 1, _status(i % 50))), 1)
        if i % 50 == 0:
            ring.trim(t - 5 * _NS, 1 << 40)  # as the recorder does: the last 5 s
    assert 5_000 <= ring.messages <= 5_000 + BLOCK_N + 10, ring.messages
    kept = expanded(ring)
    assert min(x[1] for x in kept) >= t0 + 25 * _NS - 300_000_000


def test_a_loop_tick_packs_to_three_numbers_and_back() -> None:
    item = (ch.LOOP, 5 * _NS, (123456, -0.0004, 0.00213))
    packed = pack(item)
    assert type(packed[2]) is bytes and len(packed[2]) == 24
    assert unpack(ch.LOOP, packed[2]) == item[2]  # f64: exact
    assert pack((ch.LOOP, 1, "not a tick")) == (ch.LOOP, 1, "not a tick")  # kept as published

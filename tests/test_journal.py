"""The journal: CRC32C framing, tail repair, bounded segments, garbage never crashes, kill -9 loops.

EDGE_CRASH_LOOPS scales the kill loop (default: 100 kills here).
"""

from __future__ import annotations

import hashlib
import os
import random
import resource
import signal
import struct
import time
from pathlib import Path
from typing import Any

import pytest
from crash_harness import ACK, fork_and_kill
from hypothesis import given, settings
from hypothesis import strategies as st
from tiny_fs import tiny_fs

from edge_agent.errors import StoreError
from edge_agent.store.crc32c import crc32c
from edge_agent.store.journal import MAGIC, Journal, JournalFull

KILLS = int(os.environ.get("EDGE_CRASH_LOOPS", "200")) // 2


def _crc_bitwise(data: bytes) -> int:
    crc = 0xFFFFFFFF
    for b in data:
        crc ^= b
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
    return crc ^ 0xFFFFFFFF


def test_crc32c_golden_vectors() -> None:
    assert crc32c(b"123456789") == 0xE3069283
    # RFC 3720 (iSCSI) appendix B.4
    assert crc32c(bytes(32)) == 0x8A9136AA
    assert crc32c(b"\xff" * 32) == 0x62A8AB43
    assert crc32c(bytes(range(32))) == 0x46DD794E
    assert crc32c(bytes(range(31, -1, -1))) == 0x113FDB5C
    assert crc32c(b"") == 0


@settings(deadline=None, max_examples=200)
@given(st.binary(max_size=100), st.integers(0, 100))
def test_crc32c_matches_bitwise_reference_and_chains(data: bytes, cut: int) -> None:
    assert crc32c(data) == _crc_bitwise(data)
    cut = min(cut, len(data))
    assert crc32c(data[cut:], crc32c(data[:cut])) == crc32c(data)


def _records(n: int, seed: int = 1) -> list[bytes]:
    rng = random.Random(seed)
    return [rng.randbytes(rng.choice([0, 1, 7, 100, 1000])) for _ in range(n)]


def _fill(d: Path, recs: list[bytes], **kw: Any) -> Journal:
    j = Journal(d, "j", **kw)
    j.open()
    for r in recs:
        j.append(r, sync=False)
    j.close()
    return j


def test_round_trip_reopen_and_continue(tmp_path: Path) -> None:
    recs = _records(50)
    _fill(tmp_path, recs)
    with Journal(tmp_path, "j") as j:
        assert list(j.iter_records()) == recs
        j.append(b"more")
    j2 = Journal(tmp_path, "j")
    rep = j2.open()
    assert (rep.truncated_bytes, rep.reason, rep.tail_records) == (0, None, 51)
    assert list(j2.iter_records()) == [*recs, b"more"]
    j2.close()
    j2.close()  # idempotent
    with pytest.raises(StoreError):
        j2.append(b"closed")


def test_rotation_keeps_disk_bounded(tmp_path: Path) -> None:
    j = Journal(tmp_path, "j", segment_bytes=4096, max_segments=3, fsync_each=False)
    j.open()
    recs = [b"%06d" % i + b"x" * (i % 500) for i in range(2000)]
    for r in recs:
        j.append(r)
    segs = j.segments()
    assert len(segs) == 3
    assert all(p.stat().st_size <= 4096 for p in segs)
    got = list(j.iter_records())
    assert got == recs[len(recs) - len(got):]  # the newest records, in order, none missing
    assert len(got) > 10
    with pytest.raises(ValueError):
        j.append(b"y" * 5000)  # larger than a segment
    j.close()
    assert list(Journal(tmp_path, "j", segment_bytes=4096).iter_records()) == got


def test_reopen_with_smaller_segments_keeps_big_records(tmp_path: Path) -> None:
    big = [os.urandom(50_000), os.urandom(3)]
    _fill(tmp_path, big, segment_bytes=1 << 20)
    j = Journal(tmp_path, "j", segment_bytes=4096)
    assert j.open().truncated_bytes == 0
    j.append(b"small")  # rotates: the old segment is full by the new measure
    assert list(j.iter_records()) == [*big, b"small"]
    j.close()


def _last_record_span(path: Path) -> tuple[int, int]:
    raw = path.read_bytes()
    pos, last = len(MAGIC), len(MAGIC)
    while pos < len(raw):
        last = pos
        pos += 8 + struct.unpack_from("<I", raw, pos)[0]
    return last, len(raw)


def test_truncation_at_every_offset_of_the_tail_repairs_to_a_prefix(tmp_path: Path) -> None:
    recs = [b"a" * 10, b"b" * 30, b"c" * 40]
    _fill(tmp_path, recs)
    seg = Journal(tmp_path, "j").segments()[-1]
    pristine = seg.read_bytes()
    start, end = _last_record_span(seg)
    for cut in range(start + 1, end):
        seg.write_bytes(pristine[:cut])
        j = Journal(tmp_path, "j")
        rep = j.open()
        assert rep.truncated_bytes == cut - start and rep.reason is not None
        assert list(j.iter_records()) == recs[:2]
        j.append(b"new")  # appends after a repair land on a clean boundary
        assert list(j.iter_records()) == [*recs[:2], b"new"]
        j.close()


def test_byte_flips_in_the_tail_record_repair_to_a_prefix(tmp_path: Path) -> None:
    recs = [b"first", b"second", b"the last record"]
    _fill(tmp_path, recs)
    seg = Journal(tmp_path, "j").segments()[-1]
    pristine = seg.read_bytes()
    start, end = _last_record_span(seg)
    for off in range(start, end):
        for bit in (0x01, 0x80):
            raw = bytearray(pristine)
            raw[off] ^= bit
            seg.write_bytes(bytes(raw))
            j = Journal(tmp_path, "j")
            rep = j.open()
            assert rep.reason in ("bad crc", "bad length", "short record"), (off, rep)
            assert list(j.iter_records()) == recs[:2]
            j.close()


def test_zero_filled_tail_is_not_read_as_records(tmp_path: Path) -> None:
    _fill(tmp_path, [b"x"])
    seg = Journal(tmp_path, "j").segments()[-1]
    with open(seg, "ab") as f:
        f.write(bytes(4096))
    j = Journal(tmp_path, "j")
    assert j.open().truncated_bytes == 4096
    assert list(j.iter_records()) == [b"x"]
    j.close()


def test_short_and_foreign_segment_headers(tmp_path: Path) -> None:
    _fill(tmp_path, [b"one"])
    (tmp_path / "j.0000000002.jnl").write_bytes(MAGIC[:3])  # killed while creating segment 2
    reader = Journal(tmp_path, "j")  # a reader before the repair: an empty segment, not garbage
    assert list(reader.iter_records()) == [b"one"] and reader.corrupt_skipped == 0
    j = Journal(tmp_path, "j")
    assert j.open().reason == "short segment header"
    j.append(b"two")
    assert list(j.iter_records()) == [b"one", b"two"]
    j.close()
    (tmp_path / "j.0000000003.jnl").write_bytes(b"NOTOURS!" + os.urandom(100))
    j = Journal(tmp_path, "j")
    rep = j.open()
    assert rep.skipped == (str(tmp_path / "j.0000000003.jnl"),)
    j.append(b"three")
    assert list(j.iter_records()) == [b"one", b"two", b"three"]
    assert j.corrupt_skipped == 1
    assert len(j.segments()) == 4
    j.close()


def _mutate(rng: random.Random, raw: bytes) -> bytes:
    b = bytearray(raw)
    for _ in range(rng.randint(1, 4)):
        op = rng.randrange(4)
        if op == 0 and b:
            b[rng.randrange(len(b))] ^= 1 << rng.randrange(8)
        elif op == 1:
            del b[rng.randrange(len(b) + 1):]
        elif op == 2:
            b += rng.randbytes(rng.randint(1, 64))
        elif b:
            i = rng.randrange(len(b))
            b[i:i + 4] = rng.randbytes(4)
    return bytes(b)


def test_mutated_and_random_segments_never_crash_and_replay_a_prefix(tmp_path: Path) -> None:
    recs = _records(20, seed=7)
    _fill(tmp_path / "src", recs)
    pristine = Journal(tmp_path / "src", "j").segments()[0].read_bytes()
    rng = random.Random(99)
    for i in range(300):
        d = tmp_path / f"m{i}"
        d.mkdir()
        raw = rng.randbytes(rng.randint(0, 300)) if i % 5 == 0 else _mutate(rng, pristine)
        (d / "j.0000000001.jnl").write_bytes(raw)
        reader = Journal(d, "j")
        got = list(reader.iter_records())  # a read-only pass over the damage: never raises
        assert got == recs[: len(got)] or i % 5 == 0
        j = Journal(d, "j")
        j.open()
        after = list(j.iter_records())
        assert after == recs[: len(after)] or i % 5 == 0
        j.append(b"ok")
        assert list(j.iter_records())[-1] == b"ok"
        j.close()


@settings(deadline=None, max_examples=100)
@given(st.binary(max_size=2000))
def test_arbitrary_bytes_as_a_segment(tmp_path_factory: pytest.TempPathFactory,
                                      raw: bytes) -> None:
    d = tmp_path_factory.mktemp("g")
    (d / "j.0000000001.jnl").write_bytes(MAGIC + raw)
    list(Journal(d, "j").iter_records())
    with Journal(d, "j") as j:
        list(j.iter_records())


def test_fsync_failure_breaks_the_journal(tmp_path: Path,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    j = Journal(tmp_path, "j")
    j.open()
    j.append(b"durable")

    def failing_fsync(fd: int) -> None:  # fault injection at the syscall boundary
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(os, "fsync", failing_fsync)
    with pytest.raises(StoreError, match="fsync"):
        j.append(b"lost?")
    monkeypatch.undo()
    with pytest.raises(StoreError, match="disabled"):
        j.append(b"never retried")
    j.close()


def test_file_size_limit_is_journal_full_and_truncates_back(tmp_path: Path) -> None:
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # a child with RLIMIT_FSIZE: writes past it fail with EFBIG
        code = 3
        try:
            os.close(r)
            signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
            resource.setrlimit(resource.RLIMIT_FSIZE, (3000, resource.RLIM_INFINITY))
            j = Journal(tmp_path, "j")
            j.open()
            n = 0
            try:
                while True:
                    j.append(b"%04d" % n + b"z" * 296)
                    n += 1
            except JournalFull:
                os.write(w, struct.pack("<I", n))
                code = 0
        finally:
            os._exit(code)
    os.close(w)
    _, status = os.waitpid(pid, 0)
    (n,) = struct.unpack("<I", os.read(r, 4))
    os.close(r)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0
    j = Journal(tmp_path, "j")
    rep = j.open()
    assert rep.truncated_bytes == 0  # the failed append was cut back to a record boundary
    assert [x[:4] for x in j.iter_records()] == [b"%04d" % i for i in range(n)]
    assert 5 <= n < 10
    j.close()


def test_disk_full_is_journal_full(tmp_path: Path) -> None:
    with tiny_fs(tmp_path / "fs", "64k") as fs:
        j = Journal(fs, "j", segment_bytes=1 << 20, fsync_each=False)
        j.open()
        n = 0
        with pytest.raises(JournalFull):
            while True:
                j.append(b"%06d" % n + b"q" * 1000)
                n += 1
        j.close()
        j = Journal(fs, "j", segment_bytes=1 << 20)
        assert j.open().truncated_bytes == 0
        assert sum(1 for _ in j.iter_records()) == n
        j.close()


# --------------------------------------------------------------------------- kill -9 loop

def _rec(i: int) -> bytes:
    return ACK.pack(i) + hashlib.sha256(b"%d" % i).digest() * (i * 7919 % 40)


def _appender(d: Path, ack_fd: int) -> None:
    j = Journal(d, "crash", segment_bytes=16 << 10, max_segments=3, fsync_each=False)
    j.open()
    last = 0
    for rec in j.iter_records():
        last = ACK.unpack_from(rec)[0]
    i = last + 1
    while True:
        j.append(_rec(i), sync=i % 8 == 0)
        os.write(ack_fd, ACK.pack(i))
        i += 1


def test_kill_minus_nine_during_appends_replays_a_valid_prefix(tmp_path: Path) -> None:
    rng = random.Random(4242)
    verified, repairs = 0, 0
    t0 = time.monotonic()
    for k in range(KILLS):
        acks = fork_and_kill(lambda fd: _appender(tmp_path, fd), rng.uniform(0, 0.03),
                              after_first_ack=k % 2 == 0)
        last_ack = acks[-1] if acks else verified
        j = Journal(tmp_path, "crash", segment_bytes=16 << 10, max_segments=3)
        rep = j.open()
        repairs += rep.truncated_bytes > 0
        ids = []
        for rec in j.iter_records():
            (i,) = ACK.unpack_from(rec)
            assert rec == _rec(i), f"kill {k}: record {i} is corrupt"
            ids.append(i)
        j.close()
        assert j.corrupt_skipped == 0
        assert ids == list(range(ids[0], ids[0] + len(ids))), f"kill {k}: gap in the replay"
        assert last_ack <= ids[-1] <= last_ack + 1, f"kill {k}: acked {last_ack}, got {ids[-1]}"
        assert ids[-1] >= verified
        verified = ids[-1]
    print(f"\n{KILLS} kills in {time.monotonic() - t0:.1f} s, {repairs} torn tails repaired,"
          f" {verified} records appended")
    assert verified >= KILLS // 2  # every other child appended at least once


def test_a_long_record_is_checked_in_pieces_and_never_held(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Opening reads lengths only (the CRC in pieces: 64 KiB here); `iter_records` skips a
    record over KEEP_RECORD_BYTES (here 128 KiB) with a warning instead of holding it."""
    from edge_agent.store import journal as jmod

    monkeypatch.setattr(jmod, "_PIECE", 64 << 10)
    monkeypatch.setattr(jmod, "KEEP_RECORD_BYTES", 128 << 10)
    big = os.urandom(1024) * 512  # 512 KiB, valid
    j = Journal(tmp_path)
    j.open()
    for rec in (b"small-1", big, b"small-2"):
        j.append(rec)
    j.close()
    held: list[int] = []  # the size of every buffer the CRC is computed over

    def crc_seen(data: bytes | bytearray | memoryview, crc: int = 0) -> int:
        held.append(len(data))
        return crc32c(data, crc)

    monkeypatch.setattr(jmod, "crc32c", crc_seen)
    j = Journal(tmp_path)
    report = j.open()
    assert report.tail_records == 3 and report.truncated_bytes == 0, report
    assert max(held) == 64 << 10, max(held)  # pieces, never the 512 KiB record
    j.close()
    held.clear()
    j = Journal(tmp_path)
    assert list(j.iter_records()) == [b"small-1", b"small-2"]
    assert j.corrupt_skipped == 1 and max(held) == 64 << 10

"""Append-only journal in bounded segment files: CRC32C-framed records, tail repair on open.

Layout (little-endian), one directory per journal::

    <name>.<index:010d>.jnl  := MAGIC record*
    MAGIC                    := b"EAJRNL\\x00\\x01"            (8 bytes, format 1)
    record                   := len:u32 crc:u32 payload[len]
    crc                      := CRC32C(len:u32 ‖ payload)

The CRC covers the length field too, so a zero-filled tail (what a file system can leave after
a power cut) is not a run of valid empty records. A segment is rotated once it would exceed
`segment_bytes`; at most `max_segments` are kept (the oldest are deleted), so the disk used is
bounded by about `max_segments * (segment_bytes + max_record_bytes)`.

Only the tail of the newest segment is ever written, so a crash can only tear that tail:
`open()` scans the newest segment and truncates it at the first short or bad record. Older
segments are fsynced before a rotation. A reader never raises on garbage: it stops reading a
segment at its first bad record (and logs it), then goes on with the next segment.

Not thread-safe: one thread (the store thread) appends.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import struct
from collections.abc import Iterator
from dataclasses import dataclass, field
from io import BufferedIOBase
from pathlib import Path

from edge_agent.errors import StoreError
from edge_agent.log import get_logger
from edge_agent.store.atomic import fsync_dir
from edge_agent.store.crc32c import crc32c

log = get_logger(__name__)

MAGIC = b"EAJRNL\x00\x01"
_REC = struct.Struct("<II")
_LEN = struct.Struct("<I")
_FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG})

_PIECE = 1 << 20  # bytes of a long record read at once (its CRC checked piece by piece)
KEEP_RECORD_BYTES = 16 << 20  # iter_records: a longer record is skipped, never held


def _record_crc(length: int, payload: bytes | memoryview) -> int:
    return crc32c(payload, crc32c(_LEN.pack(length)))


# --------------------------------------------------------------------------- journal


class JournalFull(StoreError):
    """The disk (or quota, or file-size limit) is full: the caller should turn the journal off."""


@dataclass(frozen=True, slots=True)
class RepairReport:
    """What `Journal.open()` found and fixed."""

    segments: int
    tail_records: int  # valid records in the newest segment
    truncated_bytes: int  # bytes cut off the newest segment's tail
    reason: str | None  # why the tail was cut ("short record", "bad crc", ...), None if clean
    segment: str | None  # the newest segment's path
    skipped: tuple[str, ...] = field(default=())  # segment files with a foreign header


def _segment_name(name: str, index: int) -> str:
    return f"{name}.{index:010d}.jnl"


def _scan(f: BufferedIOBase, keep: int) -> Iterator[tuple[int, bytes | int | str]]:
    """Yield (offset, payload) per valid record after MAGIC, then (offset, why) at a bad one;
    a record longer than `keep` bytes is checked in pieces and yielded as its length (int).

    A length is checked against the file's size, not against today's `max_record_bytes`, so
    a journal reopened with smaller segments keeps its big records (and garbage lengths never
    make us allocate more than the file holds); `keep` bounds what is held at once."""
    size = os.fstat(f.fileno()).st_size
    pos = len(MAGIC)
    while True:
        head = f.read(_REC.size)
        if not head:
            return
        if len(head) < _REC.size:
            yield pos, "short header"
            return
        length, crc = _REC.unpack(head)
        if pos + _REC.size + length > size:
            yield pos, "short record"
            return
        if length > keep:
            got, left = crc32c(_LEN.pack(length)), length
            buf = memoryview(bytearray(min(left, _PIECE)))
            while left and (n := f.readinto(buf[:min(left, _PIECE)])):
                got, left = crc32c(buf[:n], got), left - n
            if left or got != crc:
                yield pos, "short record" if left else "bad crc"
                return
            yield pos, length
            pos += _REC.size + length
            continue
        payload = f.read(length)
        if len(payload) < length:
            yield pos, "short record"
            return
        if _record_crc(length, payload) != crc:
            yield pos, "bad crc"
            return
        yield pos, payload
        pos += _REC.size + length


class Journal:
    """One append-only journal: `open()`, `append()`, `sync()`, `iter_records()`, `close()`."""

    def __init__(self, directory: str | os.PathLike[str], name: str = "journal", *,
                 segment_bytes: int = 4 << 20, max_segments: int = 8,
                 max_record_bytes: int | None = None, fsync_each: bool = True) -> None:
        if not re.fullmatch(r"[A-Za-z0-9_-]+", name):
            raise ValueError(f"journal name {name!r}: use letters, digits, '_' and '-'")
        if segment_bytes < 64 or max_segments < 1:
            raise ValueError("segment_bytes must be >= 64 and max_segments >= 1")
        self.directory = Path(directory)
        self.name = name
        self.segment_bytes = segment_bytes
        self.max_segments = max_segments
        limit = segment_bytes - len(MAGIC) - _REC.size
        self.max_record_bytes = limit if max_record_bytes is None else min(max_record_bytes, limit)
        self.fsync_each = fsync_each
        self._pattern = re.compile(rf"{re.escape(name)}\.(\d{{10}})\.jnl")
        self._fd: int | None = None
        self._index = 0
        self._size = 0
        self._dirty = False
        self.broken: StoreError | None = None
        self.corrupt_skipped = 0

    # ------------------------------------------------------------------ files

    def segments(self) -> list[Path]:
        """The segment files, oldest first."""
        try:
            names = os.listdir(self.directory)
        except FileNotFoundError:
            return []
        found = sorted((int(m.group(1)), n) for n in names if (m := self._pattern.fullmatch(n)))
        return [self.directory / n for _, n in found]

    def _index_of(self, path: Path) -> int:
        m = self._pattern.fullmatch(path.name)
        assert m is not None
        return int(m.group(1))

    # ------------------------------------------------------------------ open / repair

    def open(self) -> RepairReport:
        """Create or reopen the journal; repair the newest segment's tail. Raises StoreError."""
        if self._fd is not None:
            raise StoreError(f"journal {self.name} is already open")
        try:
            self.directory.mkdir(parents=True, exist_ok=True, mode=0o700)
            return self._open()
        except OSError as exc:
            raise self._error("open", exc) from exc

    def _open(self) -> RepairReport:
        segs = self.segments()
        skipped: list[str] = []
        cut, why, records = 0, None, 0
        if segs:
            last = segs[-1]
            self._index = self._index_of(last)
            with open(os.open(last, os.O_RDWR | os.O_NOFOLLOW), "r+b") as f:
                head = f.read(len(MAGIC))
                if head == MAGIC:
                    end = len(MAGIC)
                    for pos, item in _scan(f, 0):  # lengths only: nothing held
                        if isinstance(item, str):
                            why = item
                            break
                        records += 1
                        end = pos + _REC.size + (item if isinstance(item, int) else len(item))
                    size = os.fstat(f.fileno()).st_size
                    if size > end:
                        cut, why = size - end, why or "trailing bytes"
                        f.truncate(end)
                        os.fsync(f.fileno())
                        log.warning("journal_tail_repaired", journal=self.name, segment=str(last),
                                    offset=end, truncated_bytes=cut, reason=why)
                elif MAGIC.startswith(head):  # crashed while the segment was being created
                    cut, why = len(head), "short segment header"
                    f.seek(0)
                    f.truncate(0)
                    f.write(MAGIC)
                    f.flush()
                    os.fsync(f.fileno())
                else:
                    skipped.append(str(last))
                    log.warning("journal_segment_foreign", journal=self.name, segment=str(last))
            if skipped:
                self._create_segment(self._index + 1)
            else:
                self._fd = os.open(last, os.O_WRONLY | os.O_APPEND | os.O_NOFOLLOW)
                self._size = os.fstat(self._fd).st_size
        else:
            self._create_segment(1)
        self._prune()
        segs = self.segments()
        return RepairReport(len(segs), records, cut, why, str(segs[-1]), tuple(skipped))

    def _create_segment(self, index: int) -> None:
        path = self.directory / _segment_name(self.name, index)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND | os.O_NOFOLLOW,
                     0o600)
        try:
            self._write_all(fd, MAGIC)
            os.fsync(fd)
            fsync_dir(self.directory)
        except BaseException:
            os.close(fd)
            raise
        self._fd, self._index, self._size, self._dirty = fd, index, len(MAGIC), False

    def _prune(self) -> None:
        segs = self.segments()
        if len(segs) > self.max_segments:
            for old in segs[: len(segs) - self.max_segments]:
                old.unlink()
            fsync_dir(self.directory)

    # ------------------------------------------------------------------ append

    def append(self, payload: bytes, *, sync: bool | None = None) -> None:
        """Append one record; fsync it if `sync` (default: `fsync_each`). Raises StoreError."""
        fd = self._writable()
        n = len(payload)
        if n > self.max_record_bytes:
            raise ValueError(f"record of {n} bytes > max_record_bytes {self.max_record_bytes}")
        rec = _REC.pack(n, _record_crc(n, payload)) + payload
        if self._size + len(rec) > self.segment_bytes and self._size > len(MAGIC):
            fd = self._rotate()
        try:
            self._write_all(fd, rec)
        except OSError as exc:
            self._truncate_back(fd)
            raise self._error("append", exc) from exc
        self._size += len(rec)
        self._dirty = True
        if self.fsync_each if sync is None else sync:
            self.sync()

    def sync(self) -> None:
        """Make every appended record durable. An fsync error breaks the journal for good."""
        fd = self._writable()
        if not self._dirty:
            return
        try:
            os.fsync(fd)
        except OSError as exc:
            self.broken = self._error("fsync", exc)
            raise self.broken from exc
        self._dirty = False

    def _writable(self) -> int:
        if self.broken is not None:
            raise StoreError(f"journal {self.name} is disabled after: {self.broken}")
        if self._fd is None:
            raise StoreError(f"journal {self.name} is not open")
        return self._fd

    @staticmethod
    def _write_all(fd: int, data: bytes) -> None:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]

    def _truncate_back(self, fd: int) -> None:
        try:
            os.ftruncate(fd, self._size)
        except OSError as exc:
            self.broken = self._error("truncate after a failed append", exc)

    def _rotate(self) -> int:
        old = self._fd
        try:
            self.sync()
            self._fd = None
            if old is not None:
                os.close(old)
            self._create_segment(self._index + 1)
            self._prune()
        except OSError as exc:
            self.broken = self._error("rotate", exc)
            raise self.broken from exc
        assert self._fd is not None
        return self._fd

    def _error(self, what: str, exc: OSError) -> StoreError:
        cls = JournalFull if exc.errno in _FULL_ERRNOS else StoreError
        return cls(f"journal {self.name}: {what} failed: {exc}")

    # ------------------------------------------------------------------ read

    def iter_records(self) -> Iterator[bytes]:
        """Every valid record of every segment, oldest first; garbage is skipped, never raised."""
        for seg in self.segments():
            yield from self.iter_segment(seg)

    def iter_segment(self, seg: Path) -> Iterator[bytes]:
        """The valid records of one segment file (`segments()`), oldest first; never raises."""
        try:
            with open(seg, "rb") as f:
                head = f.read(len(MAGIC))
                if head != MAGIC:
                    if MAGIC.startswith(head):  # torn while being created: holds nothing
                        log.info("journal_segment_empty", journal=self.name,
                                 segment=str(seg), header_bytes=len(head))
                    else:
                        self._skip(seg, len(MAGIC), "foreign header")
                    return
                for pos, item in _scan(f, KEEP_RECORD_BYTES):
                    if isinstance(item, str):
                        self._skip(seg, pos, item)
                        break
                    if isinstance(item, int):  # valid, but longer than anything we write
                        self._skip(seg, pos, f"record of {item} bytes not read")
                        continue
                    yield item
        except OSError as exc:
            self._skip(seg, 0, f"unreadable: {exc}")

    def _skip(self, seg: Path, pos: int, why: str) -> None:
        self.corrupt_skipped += 1
        log.warning("journal_records_skipped", journal=self.name, segment=str(seg), offset=pos,
                    reason=why)

    # ------------------------------------------------------------------ close

    def close(self) -> None:
        """fsync and close; idempotent, never raises (a failure is logged)."""
        fd, self._fd = self._fd, None
        if fd is None:
            return
        try:
            if self._dirty and self.broken is None:
                os.fsync(fd)
        except OSError as exc:
            log.error("journal_close_fsync_failed", journal=self.name, error=str(exc))
        finally:
            with contextlib.suppress(OSError):
                os.close(fd)

    def __enter__(self) -> Journal:
        if self._fd is None:
            self.open()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

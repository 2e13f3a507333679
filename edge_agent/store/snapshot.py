"""Atomic, checksummed JSON snapshots that survive kill -9 at any instant (old or new, never torn).

On disk, in `directory`::

    <name>.snap       the newest generation
    <name>.snap.prev  the generation before it (the fallback when <name>.snap is corrupt/absent)
    <name>.snap.tmp   a save in progress (ignored by load, overwritten by the next save)

Each file is one header line and the payload::

    {"magic":"edge-agent-snapshot","format":1,"name":..,"generation":N,"length":L,"sha256":..}\\n
    <L bytes: the JSON object, newline-terminated>

`save()`: write the tmp file → fsync(tmp) → rename .snap → .snap.prev (only when .snap is known
good, so a corrupt file never displaces a good fallback) → rename tmp → .snap → fsync(dir).
Crash windows: before the first rename .snap is the old version; between the two renames .snap
is missing and .snap.prev holds the old version; after the second .snap is the new one. `load()`
takes the valid file with the highest generation, so it always returns the old or the new
version, and never nothing once a save has completed.

No room (ENOSPC) for the temp file: with a `reserve` (store/reserve.py) the save renames one of
its preallocated chunks onto the temp file and writes into the chunk's blocks, then goes on as
above (`reserve_saves` counts them); without one, or with the reserve gone, it raises.

An fsync failure is fatal for the store (REQUIREMENTS 16): the error is raised and every later
`save()` raises too — the page cache may have dropped the data, a retry could lie. Build a new
`SnapshotStore` to try again. Not thread-safe: one thread (the store thread) saves.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from edge_agent.errors import StoreError
from edge_agent.log import get_logger
from edge_agent.store import json_pieces
from edge_agent.store.atomic import fsync_dir
from edge_agent.store.reserve import SpaceReserve, no_space

log = get_logger(__name__)

MAGIC = "edge-agent-snapshot"
FORMAT_VERSION = 1
DEFAULT_MAX_BYTES = 16 << 20
_MAX_HEADER = 512


@dataclass(frozen=True, slots=True)
class CorruptFile:
    """A snapshot file that exists but cannot be used, and why."""

    path: str
    reason: str


@dataclass(frozen=True, slots=True)
class LoadReport:
    """The outcome of `SnapshotStore.load_report()`: what was used and what was found broken."""

    data: dict[str, Any] | None
    generation: int | None
    source: str | None  # path of the file the data came from
    used_previous: bool  # the fallback (.prev) was used
    corrupt_files: tuple[CorruptFile, ...] = field(default=())


class _Corrupt(Exception):
    def __init__(self, reason: str, generation: int | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.generation = generation


class SnapshotStore:
    """One named snapshot in a directory: `save(obj)` and `load()`. `__init__` does no I/O."""

    def __init__(self, directory: str | os.PathLike[str], name: str, *,
                 max_bytes: int = DEFAULT_MAX_BYTES, reserve: SpaceReserve | None = None
                 ) -> None:
        if not re.fullmatch(r"[A-Za-z0-9_.-]+", name) or name.startswith("."):
            raise ValueError(f"snapshot name {name!r}: use letters, digits, '_', '-' and '.'")
        self.directory = Path(directory)
        self.name = name
        self.path = self.directory / f"{name}.snap"
        self.prev_path = self.directory / f"{name}.snap.prev"
        self.tmp_path = self.directory / f"{name}.snap.tmp"
        self.max_bytes = max_bytes
        self.generation: int | None = None  # the newest generation seen or written
        self.corrupt_files: list[CorruptFile] = []  # from the last load
        self.failed: StoreError | None = None  # set by an fsync failure; saves refused after
        self._current_ok: bool | None = None  # is self.path a valid snapshot? None: unknown
        self.reserve = reserve  # space kept for a save on a full disk
        self.reserve_saves = 0  # saves written into a reserve chunk

    # ------------------------------------------------------------------ load

    def load(self) -> tuple[dict[str, Any], int] | None:
        """The newest valid snapshot as (data, generation), or None. See `corrupt_files`."""
        rep = self.load_report()
        if rep.data is None or rep.generation is None:
            return None
        return rep.data, rep.generation

    def load_report(self) -> LoadReport:
        """Read both files, verify them, pick the newest valid one; never raises on bad content."""
        corrupt: list[CorruptFile] = []
        best: tuple[int, dict[str, Any], Path] | None = None
        newest_seen = self.generation or 0
        self._current_ok = False
        for path in (self.path, self.prev_path):
            try:
                data, gen = self._read(path)
            except FileNotFoundError:
                continue
            except _Corrupt as bad:
                corrupt.append(CorruptFile(str(path), bad.reason))
                newest_seen = max(newest_seen, bad.generation or 0)
                log.warning("snapshot_corrupt", snapshot=self.name, path=str(path),
                            reason=bad.reason)
                continue
            if path == self.path:
                self._current_ok = True
            newest_seen = max(newest_seen, gen)
            if best is None or gen > best[0]:
                best = (gen, data, path)
        self.corrupt_files = corrupt
        self.generation = newest_seen
        if best is None:
            return LoadReport(None, None, None, False, tuple(corrupt))
        gen, data, path = best
        used_prev = path == self.prev_path
        if used_prev and corrupt:
            log.warning("snapshot_fallback_used", snapshot=self.name, generation=gen)
        return LoadReport(data, gen, str(path), used_prev, tuple(corrupt))

    def _read(self, path: Path) -> tuple[dict[str, Any], int]:
        try:
            with open(os.open(path, os.O_RDONLY | os.O_NOFOLLOW), "rb") as f:
                size = os.fstat(f.fileno()).st_size
                if size > self.max_bytes:
                    raise _Corrupt(f"{size} bytes > max_bytes {self.max_bytes}")
                raw = f.read(self.max_bytes + 1)
        except FileNotFoundError:
            raise
        except OSError as exc:
            raise _Corrupt(f"unreadable: {exc}") from exc
        head, sep, payload = raw.partition(b"\n")
        if not sep:
            raise _Corrupt("no header line (truncated?)")
        if len(head) > _MAX_HEADER:
            raise _Corrupt("header line too long")
        try:
            header = json.loads(head)
        except (ValueError, RecursionError) as exc:
            raise _Corrupt("header is not JSON") from exc
        if not isinstance(header, dict) or header.get("magic") != MAGIC:
            raise _Corrupt("not a snapshot header")
        gen = header.get("generation")
        if not isinstance(gen, int) or isinstance(gen, bool) or gen < 0:
            raise _Corrupt(f"bad generation {gen!r}")
        if header.get("format") != FORMAT_VERSION:
            raise _Corrupt(f"unsupported format {header.get('format')!r}", gen)
        if header.get("name") != self.name:
            raise _Corrupt(f"belongs to snapshot {header.get('name')!r}", gen)
        if header.get("length") != len(payload):
            raise _Corrupt(f"length {len(payload)} != header {header.get('length')!r}"
                           " (truncated?)", gen)
        if header.get("sha256") != hashlib.sha256(payload).hexdigest():
            raise _Corrupt("checksum mismatch", gen)
        try:
            data = json.loads(payload)
        except (ValueError, RecursionError) as exc:
            raise _Corrupt("payload is not JSON", gen) from exc
        if not isinstance(data, dict):
            raise _Corrupt("payload is not a JSON object", gen)
        return data, gen

    # ------------------------------------------------------------------ save

    def save(self, obj: Mapping[str, Any]) -> int:
        """Write `obj` durably as the next generation and return it. Raises StoreError."""
        if self.failed is not None:
            raise StoreError(f"snapshot {self.name} is disabled after: {self.failed}")
        try:
            # in pieces: after an L3 diagnosis the executor's part carries the fault record's
            # sensor window (~36 kB) into every save, and one json.dumps held the GIL for ms
            text = json_pieces.dumps(dict(obj), allow_nan=False)
        except (TypeError, ValueError, RecursionError) as exc:
            raise StoreError(f"snapshot {self.name}: not serialisable: {exc}") from exc
        payload = text.encode() + b"\n"
        if self.generation is None or self._current_ok is None:
            self.load_report()  # learn the newest generation and whether .snap may become .prev
        gen = (self.generation or 0) + 1
        header = {"magic": MAGIC, "format": FORMAT_VERSION, "name": self.name, "generation": gen,
                  "length": len(payload), "sha256": hashlib.sha256(payload).hexdigest()}
        blob = json.dumps(header, separators=(",", ":")).encode() + b"\n" + payload
        if len(blob) > self.max_bytes:
            raise StoreError(f"snapshot {self.name}: {len(blob)} bytes > max_bytes")
        try:
            self.directory.mkdir(parents=True, exist_ok=True, mode=0o700)
            try:
                self._write_tmp(blob)
            except OSError as exc:
                with contextlib.suppress(OSError):
                    self.tmp_path.unlink()
                if not no_space(exc) or not self._write_reserved(blob):
                    raise
        except (OSError, StoreError) as exc:
            with contextlib.suppress(OSError):
                self.tmp_path.unlink()
            if isinstance(exc, StoreError):
                raise
            gone = " (the space reserve is gone)" if self.reserve is not None else ""
            raise StoreError(f"snapshot {self.name}: write failed{gone}: {exc}") from exc
        try:
            if self._current_ok:
                with contextlib.suppress(FileNotFoundError):  # removed behind our back
                    os.replace(self.path, self.prev_path)
            self._current_ok = False
            os.replace(self.tmp_path, self.path)
        except OSError as exc:
            self._current_ok = None  # re-verify before the next rotation
            raise StoreError(f"snapshot {self.name}: rename failed: {exc}") from exc
        self._fsync(lambda: fsync_dir(self.directory), "fsync(dir)")
        self._current_ok = True
        self.generation = gen
        return gen

    def _write_tmp(self, blob: bytes) -> None:
        fd = os.open(self.tmp_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
        try:
            view = memoryview(blob)
            while view:
                view = view[os.write(fd, view):]
            self._fsync(lambda: os.fsync(fd), "fsync(file)")
        finally:
            os.close(fd)

    def _write_reserved(self, blob: bytes) -> bool:
        """The temp file in a reserve chunk's blocks (the disk is full); False: none left."""
        if self.reserve is None or not self.reserve.lend(self.tmp_path):
            return False
        fd = os.open(self.tmp_path, os.O_WRONLY | os.O_NOFOLLOW)
        try:
            while True:
                try:
                    view, at = memoryview(blob), 0
                    while at < len(blob):  # over the chunk's allocated blocks, from offset 0
                        at += os.pwrite(fd, view[at:], at)
                    break
                except OSError as exc:  # larger than the chunk: free another chunk's blocks
                    if not no_space(exc) or not self.reserve.release_one():
                        raise
            os.ftruncate(fd, len(blob))  # the chunk's unused tail goes back to the filesystem
            self._fsync(lambda: os.fsync(fd), "fsync(file)")
        finally:
            os.close(fd)
        self.reserve_saves += 1
        log.warning("snapshot_saved_from_reserve", snapshot=self.name, bytes=len(blob),
                    reserve_held=self.reserve.held())
        return True

    def _fsync(self, call: Callable[[], None], what: str) -> None:
        try:
            call()
        except OSError as exc:
            self.failed = StoreError(f"snapshot {self.name}: {what} failed: {exc}")
            log.error("snapshot_fsync_failed", snapshot=self.name, what=what, error=str(exc))
            raise self.failed from exc

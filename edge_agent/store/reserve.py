"""Disk space held for the stop model's snapshots: preallocated chunk files a save takes over.

    reserve = SpaceReserve(state_dir / "reserve", chunks=4)      # 4 x 256 KiB
    reserve.take()              # allocate the missing chunks (posix_fallocate); never raises
    reserve.lend(tmp_path)      # a chunk renamed to the snapshot's temp file: its blocks are ours

Each chunk is one file `chunk-<i>` whose blocks `os.posix_fallocate` allocated, so another
process filling the disk cannot take them. When a snapshot save finds no room (ENOSPC), the
snapshot store (store/snapshot.py) renames a chunk onto its temp file (`lend`; a rename needs no
free blocks) and writes the snapshot into the chunk's blocks, cuts it to length, fsyncs and
renames it over `.snap` as every save does — the atomic chain is unchanged, so a crash at any
instant leaves the old or the new snapshot, never a torn one (a chunk lent and not yet renamed
is only a `.snap.tmp`, which `load()` ignores and the next save overwrites). A snapshot larger
than a chunk gives up a second chunk's blocks to the filesystem (`release_one`) and keeps writing.

Re-taking: `take()` allocates every missing chunk it can, through a temp name and a rename (a
chunk half allocated at a crash is never counted); the store probe calls it on each run
(health/probes.py) and start-up once, so a chunk lent is re-taken as soon as the disk has room
for it, and the blocks a lent save freed (the old `.snap.prev`, the chunk's unused tail) go back
to the filesystem meanwhile. Thread-safe: the store thread lends, the probe thread takes.
"""

from __future__ import annotations

import contextlib
import errno
import os
import threading
from pathlib import Path
from typing import Any

from edge_agent.log import get_logger
from edge_agent.store.atomic import fsync_dir

_log = get_logger(__name__)

CHUNK_BYTES = 256 << 10  # a snapshot is ~2-40 kB (a fault record's sensor window is ~36 kB)
RESERVE_DIR = "reserve"  # under the state dir
NO_SPACE = (errno.ENOSPC, errno.EDQUOT)


def no_space(exc: BaseException) -> bool:
    """The filesystem (or the quota) has no room."""
    return isinstance(exc, OSError) and exc.errno in NO_SPACE


class SpaceReserve:
    """`chunks` preallocated files of `chunk_bytes` in `directory`; `__init__` does no I/O."""

    def __init__(self, directory: str | os.PathLike[str], chunks: int, *,
                 chunk_bytes: int = CHUNK_BYTES) -> None:
        if chunks < 1 or chunk_bytes < 4096:
            raise ValueError("a reserve needs at least one chunk of at least 4 KiB")
        self.dir = Path(directory)
        self.chunks = chunks
        self.chunk_bytes = chunk_bytes
        self._lock = threading.Lock()
        self._held: set[int] | None = None  # None: not looked at yet
        self.lent = 0  # chunks a snapshot save took over (this process)
        self.released = 0  # chunks given back to the filesystem for a snapshot over one chunk
        self.retaken = 0  # chunks allocated again after a lend or a release
        self.last_error: str | None = None  # why the last take() stopped short

    @classmethod
    def for_state_dir(cls, state_dir: str | os.PathLike[str], reserve_bytes: int
                      ) -> SpaceReserve:
        """The daemon's reserve: `reserve_bytes` rounded down to whole chunks (at least one)."""
        return cls(Path(state_dir) / RESERVE_DIR, max(1, reserve_bytes // CHUNK_BYTES))

    def _path(self, i: int) -> Path:
        return self.dir / f"chunk-{i}"

    # -- taking ------------------------------------------------------------------------------
    def take(self) -> int:
        """Allocate every missing chunk there is room for; the chunks held after. Never raises."""
        with self._lock:
            # a few stats each run: a chunk removed behind our back shows
            held = self._held = self._scan()
            new = 0
            for i in range(self.chunks):
                if i in held:
                    continue
                why = self._allocate(i)
                if why is not None:
                    self.last_error = why
                    break
                held.add(i)
                new += 1
            if new:
                with contextlib.suppress(OSError):
                    fsync_dir(self.dir)
                if self.lent or self.released:
                    self.retaken += new
            if len(held) == self.chunks:
                self.last_error = None
            return len(held)

    def _scan(self) -> set[int]:  # lock held: the chunks a previous run left, whole ones only
        held: set[int] = set()
        try:
            self.dir.mkdir(exist_ok=True, mode=0o700)  # the state dir itself must exist
            for p in self.dir.iterdir():
                if p.name.endswith(".tmp"):
                    with contextlib.suppress(OSError):
                        p.unlink()  # a crash inside _allocate
            for i in range(self.chunks):
                with contextlib.suppress(OSError):
                    st = os.stat(self._path(i), follow_symlinks=False)
                    if st.st_size == self.chunk_bytes and st.st_blocks * 512 >= self.chunk_bytes:
                        held.add(i)
        except OSError as exc:
            self.last_error = f"reserve directory: {exc}"
        return held

    def _allocate(self, i: int) -> str | None:  # lock held
        tmp = self.dir / f"chunk-{i}.tmp"
        try:
            self.dir.mkdir(exist_ok=True, mode=0o700)  # the state dir itself must exist
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
            try:
                os.posix_fallocate(fd, 0, self.chunk_bytes)
                os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(tmp, self._path(i))
        except OSError as exc:
            with contextlib.suppress(OSError):
                tmp.unlink()
            return f"chunk {i}: {exc.strerror or exc}"
        return None

    # -- lending -----------------------------------------------------------------------------
    def lend(self, target: Path) -> bool:
        """Rename a held chunk onto `target` (same filesystem); False when none is held."""
        with self._lock:
            held = self._held if self._held is not None else self._scan()
            self._held = held
            while held:
                i = max(held)
                held.discard(i)
                try:
                    os.replace(self._path(i), target)
                except OSError as exc:  # removed behind our back: try the next one
                    _log.warning("reserve_chunk_missing", chunk=i, error=str(exc))
                    continue
                self.lent += 1
                _log.warning("reserve_chunk_lent", chunk=i, held=len(held), target=target.name)
                return True
            return False

    def release_one(self) -> bool:
        """Unlink a held chunk, so its blocks are free for a write; False when none is held."""
        with self._lock:
            held = self._held or set()
            while held:
                i = max(held)
                held.discard(i)
                try:
                    self._path(i).unlink()
                except OSError:
                    continue
                self.released += 1
                return True
            return False

    def held(self) -> int:
        with self._lock:
            return len(self._held) if self._held is not None else 0

    def status(self) -> dict[str, Any]:
        with self._lock:
            held = len(self._held) if self._held is not None else 0
            return {"chunks": self.chunks, "held": held, "chunk_bytes": self.chunk_bytes,
                    "held_bytes": held * self.chunk_bytes, "lent": self.lent,
                    "released": self.released, "retaken": self.retaken,
                    "last_error": self.last_error}

"""Atomic small-file writes: temp file → fsync → rename → fsync(dir), so a crash leaves old or new.

The snapshot store has its own generation scheme; this is for files that are whole on their own
(a report in the outbox, a delivered report on disk).
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path


def fsync_dir(path: str | os.PathLike[str]) -> None:
    """fsync a directory, so a rename or unlink inside it survives a power loss."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(path: str | os.PathLike[str], data: bytes, *, mode: int = 0o600,
                 sync_dir: bool = True) -> None:
    """Replace `path` with `data` durably (OSError on failure; the old file stays intact)."""
    p = Path(path)
    tmp = p.with_name(f".{p.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    try:
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, p)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    if sync_dir:
        fsync_dir(p.parent)


def remove_durably(paths: list[Path]) -> None:
    """Unlink the files (missing ones are fine), then fsync each parent directory once."""
    parents = set()
    for p in paths:
        with contextlib.suppress(FileNotFoundError):
            p.unlink()
            parents.add(p.parent)
    for d in parents:
        with contextlib.suppress(OSError):
            fsync_dir(d)


class FileTooLarge(ValueError):
    """A state file is longer than anything the daemon writes there: refused, not read."""


def read_capped(path: str | os.PathLike[str], max_bytes: int, *,
                nofollow: bool = False) -> bytes:
    """The file's bytes, reading at most `max_bytes` + 1 of them: FileTooLarge past the bound
    (a ValueError, so callers treating a garbled file as corrupt treat this one the same)."""
    flags = os.O_RDONLY | (os.O_NOFOLLOW if nofollow else 0)
    with open(os.open(path, flags), "rb") as f:
        data = f.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise FileTooLarge(f"{os.fspath(path)}: over {max_bytes} bytes, not read")
    return data

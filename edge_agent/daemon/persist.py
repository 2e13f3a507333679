"""The daemon's durable state: the snapshot (latch, executor) and the clean-shutdown marker.

The marker file `running` exists from start-up until a clean shutdown removed it. Finding it at
start means the last run ended uncleanly (kill -9, power loss, crash): the daemon then comes up
in a protective stop with cause `unclean_restart`, on top of whatever latch the snapshot held.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from edge_agent.errors import StoreError
from edge_agent.log import get_logger
from edge_agent.store.reserve import SpaceReserve, no_space
from edge_agent.store.snapshot import SnapshotStore

_log = get_logger(__name__)
MARKER = "running"
SNAPSHOT_NAME = "daemon"


@dataclass
class Restored:
    """What start-up found on disk."""

    data: dict[str, Any] = field(default_factory=dict)
    generation: int = 0
    unclean: bool = False
    corrupt_files: list[str] = field(default_factory=list)
    used_previous: bool = False


def prepare_state_dir(state_dir: Path) -> None:
    state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)


def snapshot_store(state_dir: Path, reserve_bytes: int) -> SnapshotStore:
    """The daemon's snapshot store with its space reserve (store/reserve.py); no I/O."""
    return SnapshotStore(state_dir, SNAPSHOT_NAME,
                         reserve=SpaceReserve.for_state_dir(state_dir, reserve_bytes))


def restore(state_dir: Path, store: SnapshotStore) -> Restored:
    """Load the snapshot, take the snapshot reserve, note (then set) the running marker."""
    out = Restored()
    if store.reserve is not None:
        held = store.reserve.take()
        if held < store.reserve.chunks:  # the store probe says so too, and re-takes it
            _log.warning("snapshot_reserve_short", held=held, chunks=store.reserve.chunks,
                         error=store.reserve.last_error)
    report = store.load_report()
    if report.data is not None:
        out.data = dict(report.data)
        out.generation = report.generation or 0
    out.used_previous = bool(report.used_previous)
    out.corrupt_files = [f"{c.path}: {c.reason}" for c in report.corrupt_files]
    marker = state_dir / MARKER
    out.unclean = os.path.lexists(marker)  # a planted symlink counts as unclean
    if os.path.islink(marker):  # never write through it (unlink removes the link, not its target)
        _log.warning("running_marker_was_a_symlink", path=str(marker))
        marker.unlink()
    _write_marker(marker)
    return out


def _write_marker(path: Path) -> None:
    try:
        # O_NOFOLLOW: a symlink planted as `running` must not redirect the write elsewhere
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
        try:
            try:
                os.write(fd, f"{os.getpid()}\n".encode())
            except OSError as exc:  # a full disk: the marker's existence is what counts
                if not no_space(exc):
                    raise
            os.fsync(fd)
        finally:
            os.close(fd)
        dfd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
    except OSError as exc:
        raise StoreError(f"cannot write the running marker {path}: {exc}") from exc


def mark_clean_shutdown(state_dir: Path) -> None:
    """Remove the running marker (the last step of a clean shutdown); never raises."""
    with contextlib.suppress(OSError):
        (state_dir / MARKER).unlink()
        dfd = os.open(state_dir, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)

"""One daemon per state dir: an exclusive `flock` on `<state_dir>/lock`, taken before anything else.

    lock = StateDirLock.acquire(cfg.state_dir)   # StateDirBusy / StateDirUnsafe, else held
    ...                                          # the whole run; the kernel drops it at exit

A second daemon on the same state dir would rewrite the first one's `running` marker, snapshot
and sockets — and after a crash of the first, the next start would miss the unclean restart and
skip the protective stop. So `edge-agent run` takes this lock right after reading its config, before
it reads or writes anything in the state dir (or spawns the guardian): the second one exits at
once, naming the holder's pid, having touched nothing but the lock file it could not lock.

The state dir is checked first: owned by this user (or root), not writable by group or others (a
world-writable state dir lets anyone plant files or symlinks the daemon would trust). The lock
file is opened with O_NOFOLLOW and O_CLOEXEC (children never inherit it: a guardian that
outlives the daemon must not keep the lock). Stdlib only: this is on the start-up path.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import stat
from pathlib import Path

from edge_agent.errors import EdgeAgentError

LOCK_NAME = "lock"
NOFOLLOW = os.O_NOFOLLOW | os.O_CLOEXEC


class StateDirUnsafe(EdgeAgentError):
    """The state dir is not safe to trust (owner, mode, a symlink where a file belongs)."""


class StateDirBusy(EdgeAgentError):
    """Another process holds the state dir's lock."""

    def __init__(self, state_dir: Path, pid: int | None) -> None:
        self.pid = pid
        who = f"pid {pid}" if pid is not None else "another process (pid unknown)"
        super().__init__(f"state dir {state_dir} is in use by {who}: one daemon per state dir "
                         "(stop that one first, or give this one its own state_dir)")


def check_state_dir(state_dir: Path) -> None:
    """Create the state dir (0700) when missing; refuse one others may write or another user
    owns. Raises StateDirUnsafe."""
    try:
        state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        st = os.stat(state_dir)
    except OSError as exc:
        raise StateDirUnsafe(f"state dir {state_dir}: {exc.strerror}") from None
    if not stat.S_ISDIR(st.st_mode):
        raise StateDirUnsafe(f"state dir {state_dir} is not a directory")
    uid = os.geteuid()
    if st.st_uid not in (uid, 0):
        raise StateDirUnsafe(f"state dir {state_dir} is owned by uid {st.st_uid}, not by this "
                             f"user (uid {uid}): chown it (systemd's StateDirectory= does)")
    mode = stat.S_IMODE(st.st_mode)
    if mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise StateDirUnsafe(f"state dir {state_dir} is writable by group or others (mode "
                             f"{mode:04o}): run chmod 0700 {state_dir}")


class StateDirLock:
    """The held lock (keep the object for the whole run; `release()` is for tests)."""

    def __init__(self, state_dir: Path, fd: int) -> None:
        self.state_dir = state_dir
        self._fd: int | None = fd

    @classmethod
    def acquire(cls, state_dir: Path) -> StateDirLock:
        """Check the dir, lock `<state_dir>/lock` without waiting; StateDirBusy when held."""
        state_dir = Path(state_dir)
        check_state_dir(state_dir)
        path = state_dir / LOCK_NAME
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | NOFOLLOW, 0o600)
        except OSError as exc:
            why = ("is a symbolic link (refused)" if exc.errno == errno.ELOOP
                   else exc.strerror)
            raise StateDirUnsafe(f"lock file {path}: {why}") from None
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise StateDirUnsafe(f"lock file {path} is not a regular file")
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise StateDirBusy(state_dir, _read_pid(fd)) from None
            # Ours now: record our pid for the next one that tries (read only under the lock).
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        except BaseException:
            os.close(fd)
            raise
        return cls(state_dir, fd)

    def release(self) -> None:
        """Unlock and close (idempotent, never raises); process exit does the same."""
        fd, self._fd = self._fd, None
        if fd is not None:
            with contextlib.suppress(OSError):
                os.close(fd)


def _read_pid(fd: int) -> int | None:
    try:
        text = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
        return int(text) if text else None
    except (OSError, ValueError):
        return None

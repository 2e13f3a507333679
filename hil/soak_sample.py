"""hil.soak's sampler: RSS, threads, fds and CPU of each process, disk use of the state dir.

Linux /proc only. A process is named by its role: `daemon` (the `edge-agent run` process),
`guardian` and `rig` (the daemon's descendants, told apart by their command line), `broker`
(the private Mosquitto, whose pid changes at each restart).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

_TICK = os.sysconf("SC_CLK_TCK")


def proc_sample(pid: int) -> dict[str, Any] | None:
    """{pid, rss_bytes (and its anonymous and file-backed parts), threads, fds, cpu_s} of one
    process; None if it is gone."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
        stat = Path(f"/proc/{pid}/stat").read_text()
        fds = len(os.listdir(f"/proc/{pid}/fd"))
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    fields = {k: v.strip() for k, _, v in (ln.partition(":") for ln in status.splitlines())}
    after = stat[stat.rfind(")") + 2:].split()  # fields from the 3rd (state) on
    utime, stime = int(after[11]), int(after[12])
    def kb(key: str) -> int:
        return int(fields.get(key, "0 kB").split()[0]) * 1024

    return {"pid": pid, "rss_bytes": kb("VmRSS"), "rss_anon_bytes": kb("RssAnon"),
            "rss_file_bytes": kb("RssFile"),
            "threads": int(fields.get("Threads", "0")), "fds": fds,
            "cpu_s": round((utime + stime) / _TICK, 2)}


def children(pid: int) -> list[int]:
    """Every descendant of `pid` (/proc/*/stat ppid)."""
    parent: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        parent[int(entry)] = int(stat[stat.rfind(")") + 2:].split()[1])
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        kids = [c for c, pp in parent.items() if pp == p]
        out += kids
        todo += kids
    return out


def pid_with(argument: str) -> int | None:
    """The process whose command line has `argument` as one of its words (the broker's config
    path: its pid changes at each restart)."""
    want = argument.encode()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            if want in Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0"):
                return int(entry)
        except OSError:
            continue
    return None


def role_of(pid: int) -> str | None:
    try:
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(
            errors="replace")
    except OSError:
        return None
    if "guardian" in cmd:
        return "guardian"
    if "rig" in cmd or "hil.sim" in cmd:
        return "rig"
    if "python" in cmd:
        return "helper"  # e.g. a report's plot subprocess: short-lived, not sampled
    return None


def tree_usage(root: Path) -> dict[str, int]:
    """Bytes (allocated size of regular files) and files under `root`."""
    total = files = 0
    for dirpath, _dirs, names in os.walk(root):
        for n in names:
            try:
                st = os.lstat(os.path.join(dirpath, n))
            except OSError:
                continue
            total += st.st_size
            files += 1
    return {"bytes": total, "files": files}


def disk_sample(state_dir: Path) -> dict[str, dict[str, int]]:
    """Each subfolder of the state dir (outbox, journal, reports, recordings, models, ...)."""
    out = {}
    for p in sorted(state_dir.iterdir()):
        if p.is_dir() and not p.is_symlink():
            out[p.name] = tree_usage(p)
    return out


class Sampler(threading.Thread):
    """Every `interval_s` a sample into `samples`; `on_sample` runs after each (report ids)."""

    def __init__(self, daemon_pid: int, broker_pid: Callable[[], int | None], state_dir: Path,
                 interval_s: float, t0: float, on_sample: Callable[[], None]) -> None:
        super().__init__(daemon=True, name="soak-sampler")
        self.daemon_pid, self.broker_pid = daemon_pid, broker_pid
        self.state_dir, self.interval_s, self.t0 = state_dir, interval_s, t0
        self.on_sample = on_sample
        self.samples: list[dict[str, Any]] = []
        self.stopped = threading.Event()

    def sample(self) -> dict[str, Any]:
        procs: dict[str, Any] = {}
        d = proc_sample(self.daemon_pid)
        if d is not None:
            procs["daemon"] = d
        for pid in children(self.daemon_pid):
            role = role_of(pid)
            if role in ("guardian", "rig") and role not in procs:
                s = proc_sample(pid)
                if s is not None:
                    procs[role] = s
        bp = self.broker_pid()
        if bp is not None:
            b = proc_sample(bp)
            if b is not None:
                procs["broker"] = b
        return {"t_s": round(time.monotonic() - self.t0, 1), "wall": round(time.time(), 1),
                "load1": os.getloadavg()[0], "procs": procs,
                "disk": disk_sample(self.state_dir)}

    def run(self) -> None:
        next_at = time.monotonic()
        while not self.stopped.is_set():
            self.samples.append(self.sample())
            self.on_sample()
            next_at += self.interval_s
            self.stopped.wait(max(0.0, next_at - time.monotonic()))

    def stop(self) -> None:
        self.stopped.set()
        self.join(10)

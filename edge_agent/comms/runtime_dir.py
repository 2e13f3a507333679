"""Where `edge-agent cmd` finds a running daemon: one pointer per device in a runtime directory.

The daemon's control socket lives in its state directory (`<state_dir>/control.sock`), which the
CLI cannot guess without the config. So, as `docker` finds `/run/docker.sock` and `systemctl`
finds `/run/systemd/private`, the daemon publishes a symlink `<runtime dir>/<device id>.sock` →
its control socket once the socket listens, and removes it when it stops. `cmd` connects through
the link (a Unix socket path is followed like any other path), so it needs neither the config
nor the state directory's name.

The runtime directory, first that applies (the daemon publishes in the first; `cmd` looks in all):

1. `$EDGE_AGENT_RUNTIME_DIR` — explicit (tests, containers); when set, the only one.
2. `$RUNTIME_DIRECTORY` — what systemd sets for the unit's `RuntimeDirectory=edge-agent`:
   `/run/edge-agent`, removed by systemd when the service stops.
3. `$XDG_RUNTIME_DIR/edge-agent` — a desktop or SSH login session (`/run/user/<uid>/...`).
4. `/run/edge-agent` — root without systemd (a container, `sudo ./scripts/run-sim.sh`).
5. `/tmp/edge-agent-<uid>` — anyone else; created 0700 and used only when it is ours (tmux's
   rule: another user could otherwise plant links there).

A daemon killed with SIGKILL leaves its link behind: `discover()` tries each socket and reports
the dead ones apart, so a stale link never hides or impersonates a running daemon.
"""

from __future__ import annotations

import contextlib
import os
import socket
import stat
from dataclasses import dataclass
from pathlib import Path

POINTER_SUFFIX = ".sock"
ENV_DIR = "EDGE_AGENT_RUNTIME_DIR"


@dataclass(frozen=True)
class Found:
    """A daemon's pointer: its device id, the link, where it points, and whether it answers."""

    device: str
    link: Path
    target: str
    alive: bool


def candidate_dirs() -> list[Path]:
    """The runtime directories in lookup order (see the module docstring)."""
    explicit = os.environ.get(ENV_DIR)
    if explicit:
        return [Path(explicit)]
    out: list[Path] = []
    if os.environ.get("RUNTIME_DIRECTORY"):
        # systemd may list several separated by ':'; the unit names one
        out.append(Path(os.environ["RUNTIME_DIRECTORY"].split(":")[0]))
    if os.environ.get("XDG_RUNTIME_DIR"):
        out.append(Path(os.environ["XDG_RUNTIME_DIR"]) / "edge-agent")
    out.append(Path("/run/edge-agent"))
    out.append(Path(f"/tmp/edge-agent-{os.getuid()}"))
    return list(dict.fromkeys(out))  # in order, without repeats


def _is_private(d: Path) -> bool:
    return d.parent == Path("/tmp")


def _trusted(d: Path) -> bool:
    """A directory in /tmp counts only when it is ours and closed to others: anyone could
    otherwise plant a link there that sends our commands to their socket."""
    try:
        st = os.lstat(d)
    except OSError:
        return False
    if not stat.S_ISDIR(st.st_mode):
        return False
    return not _is_private(d) or (st.st_uid == os.getuid() and not st.st_mode & 0o077)


def _usable(d: Path) -> bool:
    """Create `d` if needed; True when this process may publish there."""
    with contextlib.suppress(OSError):
        d.mkdir(mode=0o700 if _is_private(d) else 0o755, exist_ok=True)
    return _trusted(d) and os.access(d, os.W_OK | os.X_OK)


def publish(device: str, socket_path: Path) -> Path | None:
    """Point `<runtime dir>/<device>.sock` at `socket_path`; the link, or None when no runtime
    directory is writable (then `cmd` needs `--config`)."""
    target = str(Path(socket_path).absolute())
    for d in candidate_dirs():
        if not _usable(d):
            continue
        link = d / f"{device}{POINTER_SUFFIX}"
        tmp = d / f".{device}.{os.getpid()}.tmp"
        try:
            with contextlib.suppress(FileNotFoundError):
                tmp.unlink()
            os.symlink(target, tmp)
            os.replace(tmp, link)  # atomic: a reader sees the old link or the new one
        except OSError:
            with contextlib.suppress(OSError):
                tmp.unlink()
            continue
        return link
    return None


def unpublish(link: Path | None, socket_path: Path) -> None:
    """Remove `link` if it still points at `socket_path` (another daemon may have taken the
    device's name since); never raises."""
    if link is None:
        return
    with contextlib.suppress(OSError):
        if os.readlink(link) == str(Path(socket_path).absolute()):
            link.unlink()


def _answers(path: Path, timeout: float = 0.5) -> bool:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(timeout)
    try:
        s.connect(str(path))
    except PermissionError:
        return True  # it listens; this user may not talk to it (the reply error says so)
    except OSError:
        return False
    finally:
        s.close()
    return True


def discover(device: str | None = None) -> list[Found]:
    """Every published daemon (only `device`'s when given), first directory wins per device."""
    found: dict[str, Found] = {}
    for d in candidate_dirs():
        if not _trusted(d):
            continue
        try:
            names = sorted(os.listdir(d))
        except OSError:
            continue
        for name in names:
            if not name.endswith(POINTER_SUFFIX) or name.startswith("."):
                continue
            dev = name[: -len(POINTER_SUFFIX)]
            if dev in found or (device is not None and dev != device):
                continue
            link = d / name
            try:
                target = os.readlink(link)
            except OSError:
                continue  # not a link: not ours
            found[dev] = Found(dev, link, target, _answers(link))
    return list(found.values())

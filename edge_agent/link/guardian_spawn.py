"""Spawning the link guardian process: one code path for the first start and every restart.

Light on purpose (no codec, no logging): the CLI spawns the guardian right after the config is
loaded, so that the guardian's own start-up (~60–100 ms: an interpreter, its imports, the tty
open and HELLO) runs beside the daemon's imports instead of after them. The daemon's
`GuardianClient` adopts that process (`GuardianClient.start(prespawned=...)`); until then the
guardian's frames wait in the socketpair and it sends nothing to the robot but its HELLO.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import edge_agent
from edge_agent.errors import LinkError

if TYPE_CHECKING:
    from edge_agent.config import Config

_PKG_ROOT = str(Path(edge_agent.__file__).resolve().parents[1])


class GuardianSpec:
    """What a guardian is started with (the tty, the robot's limits, the deadman, ...)."""

    __slots__ = ("deadman_s", "extra_args", "port", "priority", "robot_path")

    def __init__(self, port: str, robot_path: str | Path, deadman_s: float, priority: int,
                 extra_args: Sequence[str] = ()) -> None:
        self.port = port
        self.robot_path = str(robot_path)
        self.deadman_s = deadman_s
        self.priority = priority
        self.extra_args = tuple(extra_args)

    def key(self) -> tuple[object, ...]:
        return (self.port, self.robot_path, self.deadman_s, self.priority, self.extra_args)

    def command(self, fd: int, *, restart: bool) -> list[str]:
        cmd = [sys.executable, "-m", "edge_agent.link.guardian", "--fd", str(fd),
               "--port", self.port, "--robot", self.robot_path,
               "--deadman-ms", f"{self.deadman_s * 1000:g}", "--priority", str(self.priority),
               *self.extra_args]
        if restart:
            cmd.append("--start-latched")  # a restarted guardian holds until the daemon resets
        return cmd


class Spawned:
    """A running guardian process and the daemon's end of its socketpair."""

    __slots__ = ("proc", "sock", "spec", "started_at")

    def __init__(self, spec: GuardianSpec, proc: subprocess.Popen[bytes], sock: socket.socket,
                 started_at: float) -> None:
        self.spec, self.proc, self.sock, self.started_at = spec, proc, sock, started_at

    def abandon(self, timeout_s: float = 2.0) -> None:
        """Not adopted after all (start-up failed): stop it (it holds and exits)."""
        with contextlib.suppress(OSError):
            self.proc.terminate()
        try:
            self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=timeout_s)
        with contextlib.suppress(OSError):
            self.sock.close()


def spawn(spec: GuardianSpec, *, restart: bool = False, stderr: int | None = None) -> Spawned:
    """Start one guardian process; LinkError when it cannot be started."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (_PKG_ROOT, env.get("PYTHONPATH")) if p)
    try:
        proc = subprocess.Popen(spec.command(theirs.fileno(), restart=restart),
                                pass_fds=(theirs.fileno(),), env=env, stdin=subprocess.DEVNULL,
                                stderr=stderr)
    except OSError as exc:
        ours.close()
        raise LinkError(f"cannot start the link guardian: {exc}") from exc
    finally:
        theirs.close()
    return Spawned(spec, proc, ours, time.monotonic())


def spec_from_config(cfg: Config, port: str) -> GuardianSpec:
    """The guardian the daemon runs for `cfg` on tty `port` (the CLI's early start uses it too)."""
    link = cfg.link
    return GuardianSpec(port, cfg.robot_file, link.deadman_ms / 1000.0, link.guardian_priority,
                        ("--status-period-us", str(link.status_period_us),
                         "--baudrate", str(link.baudrate),
                         "--write-timeout-ms", f"{link.write_timeout_ms:g}",
                         "--fault-after", str(link.fault_after),
                         "--reopen-min-s", f"{link.reopen_min_s:g}",
                         "--reopen-max-s", f"{link.reopen_max_s:g}",
                         "--log-format", cfg.log.format))

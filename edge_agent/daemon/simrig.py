"""`--sim`: start the simulated robot (`python -m hil.rig`) as a child process on a pty.

The daemon never imports `hil`; it only runs it as a program and reads the device path it
prints (`PTY /dev/pts/N`). The rig's control socket (fault injection) lives in the state dir.
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from edge_agent.errors import EdgeAgentError
from edge_agent.log import get_logger

_log = get_logger(__name__)


@dataclass
class SimRig:
    """A running rig child process and what it told us."""

    proc: subprocess.Popen[bytes]
    ptys: list[str]
    control_socket: Path

    def stop(self, timeout: float = 2.0) -> None:
        """Terminate the rig; idempotent, never raises."""
        try:
            if self.proc.poll() is None:
                self.proc.send_signal(signal.SIGTERM)
                try:
                    self.proc.wait(timeout)
                except subprocess.TimeoutExpired:
                    self.proc.kill()
                    self.proc.wait(timeout)
        except OSError:
            pass


def start_sim_rig(robot_path: Path, state_dir: Path, *, rig_config: Path | None = None,
                  seed: int = 0, ptys: int = 1, record: Path | None = None,
                  timeout: float = 10.0, priority: int = 0) -> SimRig:
    """Start the rig and wait (bounded) for its `PTY <path>` lines."""
    control = state_dir / "rig.sock"
    cmd = [sys.executable, "-m", "hil.rig", "--robot", str(robot_path), "--seed", str(seed),
           "--control-socket", str(control), "--die-with-parent"]
    if rig_config is not None:
        cmd += ["--rig", str(rig_config)]
    if ptys != 1:
        cmd += ["--ptys", str(ptys)]
    if record is not None:
        cmd += ["--record", str(record)]
    env = dict(os.environ)
    env.setdefault("PYTHONUNBUFFERED", "1")
    try:
        # The rig gets its own process group: a Ctrl-C at the terminal goes to the daemon, which
        # then stops the rig in order (robot first held, then the rig).
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stdin=subprocess.DEVNULL,
                                env=env, start_new_session=True)
    except OSError as exc:
        raise EdgeAgentError(f"cannot start the simulated robot ({' '.join(cmd)}): {exc}") from exc
    assert proc.stdout is not None
    if priority > 0:
        try:
            os.sched_setscheduler(proc.pid, os.SCHED_FIFO, os.sched_param(priority))
        except OSError as exc:  # not permitted: the rig runs, at normal priority
            _log.warning("sim_rig_priority_refused", priority=priority, error=str(exc))
    found: list[str] = []
    deadline = time.monotonic() + timeout
    buf = b""
    fd = proc.stdout.fileno()
    while len(found) < ptys:
        left = deadline - time.monotonic()
        if left <= 0 or proc.poll() is not None:
            rig = SimRig(proc, found, control)
            rig.stop()
            why = "exited" if proc.returncode is not None else f"said nothing in {timeout:.0f} s"
            raise EdgeAgentError(f"the simulated robot {why} before printing its PTY line")
        ready, _, _ = select.select([fd], [], [], min(left, 0.2))
        if not ready:
            continue
        chunk = os.read(fd, 4096)
        if not chunk:
            continue
        buf += chunk
        while b"\n" in buf:
            line, buf = buf.split(b"\n", 1)
            text = line.decode(errors="replace").strip()
            if text.startswith("PTY "):
                found.append(text[4:].strip())
    # Keep draining the rig's stdout so a chatty rig can never block on a full pipe.
    threading.Thread(target=_drain, args=(fd,), name="sim-rig-stdout", daemon=True).start()
    _log.info("sim_rig_started", pid=proc.pid, ptys=found, control_socket=str(control))
    return SimRig(proc, found, control)


def _drain(fd: int) -> None:
    try:
        while os.read(fd, 65536):
            pass
    except OSError:
        pass

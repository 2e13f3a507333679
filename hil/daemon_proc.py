"""Benches' handle on a real daemon process: its start, control-socket requests, waits, its stop.

One copy for every bench that starts `edge-agent run --sim` as a subprocess (each in its own
process group, so the guardian and the rig go with it).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from edge_agent.comms.client import json_line_request
from edge_agent.errors import EdgeAgentError

ROOT = Path(__file__).resolve().parents[1]
SIM_CONFIG = ROOT / "configs" / "sim.toml"
# every bench: a slow VM may take a while to open the pty; the rig above the daemon's threads
BENCH_SETS = ("link.hello_timeout_s=10", "sim.rig_priority=40")


def with_parent(cmd: list[str]) -> list[str]:
    """`cmd` run so that it gets SIGTERM when this process dies (`setpriv --pdeathsig`, the
    PR_SET_PDEATHSIG of util-linux: kept across exec, same pid). A daemon in a session of its
    own does not see the bench's Ctrl-C; a bench stopped or killed while it starts one (before
    its `finally` knows the process) would leave it running, re-parented to init. Without
    setpriv the command is unchanged. Call it from the main thread: the signal follows the
    thread that forked. A bench killed in the microseconds between the fork and setpriv's
    prctl still leaves its child (setpriv does not check that its parent is still there)."""
    setpriv = shutil.which("setpriv")
    return [setpriv, "--pdeathsig", "TERM", "--", *cmd] if setpriv else cmd


def start_sim_daemon(state_dir: Path, sets: Iterable[str]) -> subprocess.Popen[bytes]:
    """`edge-agent run --sim` on configs/sim.toml with `state_dir`, BENCH_SETS and `sets` as
    `--set` overrides, in its own process group; its output in `<state_dir>/daemon.log`."""
    cmd = [sys.executable, "-m", "edge_agent.cli", "run", "--config", str(SIM_CONFIG), "--sim"]
    for s in (f"state_dir={state_dir}", *BENCH_SETS, *sets):
        cmd += ["--set", s]
    with open(state_dir / "daemon.log", "w") as log:  # the child keeps its own descriptor
        return subprocess.Popen(with_parent(cmd), stdout=log, stderr=subprocess.STDOUT,
                                cwd=ROOT, start_new_session=True)


class Control:
    """The daemon's control socket (`<state_dir>/control.sock`)."""

    def __init__(self, state_dir: Path) -> None:
        self.path = state_dir / "control.sock"

    def call(self, name: str, **args: object) -> dict[str, Any]:
        """One command; the whole reply (`ok`, `result` or `error`)."""
        return request(self.path, {"cmd": name, "v": 1, "id": os.urandom(6).hex(), **args})

    def status(self) -> dict[str, Any]:
        return self.call("status")["result"]  # type: ignore[no-any-return]


def request(path: Path, req: dict[str, Any], timeout: float = 10.0) -> dict[str, Any]:
    """One JSON-line request on the control socket at `path`; the daemon's reply. The rig's
    `record` is read whole: a minute of COMMAND frames at 500 Hz is several MB, over the 1 MiB
    that json_line_request reads from a socket it does not trust (#27.1); the bench started
    this rig itself."""
    if req.get("cmd") == "record":
        return _whole_reply(path, req, timeout)
    return json_line_request(path, req, timeout, what=str(req.get("cmd")))


def _whole_reply(path: Path, req: dict[str, Any], timeout: float) -> dict[str, Any]:
    import json
    import socket

    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout)
        sock.connect(str(path))
        sock.sendall(json.dumps(req).encode() + b"\n")
        with sock.makefile("rb") as reader:
            reply: dict[str, Any] = json.loads(reader.readline())
    return reply


def wait_for(pred: Callable[[], Any], timeout: float, what: str, poll_s: float = 0.05) -> None:
    """Poll `pred` until true (a missing socket counts as not yet); SystemExit after `timeout`."""
    end = time.monotonic() + timeout
    while True:
        try:
            if pred():
                return
        except (OSError, EdgeAgentError):  # the socket may not exist yet
            pass
        if time.monotonic() > end:
            raise SystemExit(f"timed out waiting for {what}")
        time.sleep(poll_s)


def stop_group(proc: subprocess.Popen[Any], first: int = signal.SIGINT,
               wait_s: float = 20.0) -> None:
    """`first` to `proc`'s process group, SIGKILL to it if `proc` has not exited `wait_s` later
    (then up to 10 s more); a group already gone is not an error."""
    for sig, wait in ((first, wait_s), (signal.SIGKILL, 10.0)):
        if proc.poll() is not None:
            return
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=wait)


def stop_daemon(proc: subprocess.Popen[Any], timeout: float = 10.0) -> None:
    """SIGTERM (a clean stop), then SIGKILL to its whole process group if it takes too long."""
    if proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)

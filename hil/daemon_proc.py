"""Benches' handle on a real daemon process: control-socket requests, waits, the stop sequence.

One copy for every bench that starts `edge-agent run --sim` as a subprocess (each in its own
process group, so the guardian and the rig go with it).
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from edge_agent.comms.client import json_line_request
from edge_agent.errors import EdgeAgentError


def request(path: Path, req: dict[str, Any], timeout: float = 10.0) -> dict[str, Any]:
    """One JSON-line request on the control socket at `path`; the daemon's reply."""
    return json_line_request(path, req, timeout, what=str(req.get("cmd")))


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

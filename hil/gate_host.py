"""Where the gate runs: its priority, the local daemon (never while it runs a task), its version.

On a robot (`--config` given, or `--priority idle`) the gate lowers itself to idle priority:
`os.nice(19)` and, where the OS has it, `SCHED_IDLE` (Linux: it runs only when nothing else
wants the CPU — the control loop and the daemon's threads always come first). It asks the
daemon's `status` over its control socket (`<state_dir>/control.sock`) before it starts and
between fault classes, and stops when a task runs (`executor.task` set).
"""

from __future__ import annotations

import os
import subprocess
import uuid
from pathlib import Path
from typing import Any

HARNESS_VERSION = "edge-agent gate 1 (hil/gate.py; hil/policy_eval.py episodes)"


class DaemonBusy(Exception):
    """The local daemon runs a task: the gate does not run beside it."""


def lower_priority() -> dict[str, Any]:
    """nice 19 and SCHED_IDLE where available; what was done."""
    done: dict[str, Any] = {"priority": "idle"}
    try:
        done["nice"] = os.nice(19 - os.nice(0))
    except OSError as exc:
        done["nice_error"] = str(exc)
    if hasattr(os, "sched_setscheduler") and hasattr(os, "SCHED_IDLE"):
        try:
            os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
            done["sched"] = "SCHED_IDLE"
        except OSError as exc:
            done["sched_error"] = str(exc)
    else:
        done["sched"] = "unavailable on this OS (nice only)"
    return done


def daemon_task(socket_path: Path | None) -> tuple[str | None, str]:
    """(the running task's id or None, what was found) from the daemon's control socket."""
    if socket_path is None:
        return None, "no --config: no local daemon asked"
    if not socket_path.exists():
        return None, f"no control socket at {socket_path} (no daemon running there)"
    from edge_agent.comms.jsonline import json_line_request

    try:
        reply = json_line_request(socket_path, {"cmd": "status", "v": 1,
                                                "id": uuid.uuid4().hex}, 3.0, what="status")
    except Exception as exc:  # a stale socket file: nobody answers
        return None, f"control socket {socket_path} did not answer ({exc}): taken as no daemon"
    res = reply.get("result") or {}
    ex = res.get("executor") or {}
    task = ex.get("task") if isinstance(ex, dict) else None
    if task:
        return str(task), f"the daemon runs task {task}"
    return None, f"the daemon answered: no task running (state {res.get('state', '?')})"


def check_daemon(socket_path: Path | None) -> str:
    """What was found; raises DaemonBusy when a task runs."""
    task, what = daemon_task(socket_path)
    if task is not None:
        raise DaemonBusy(f"{what}: the gate does not run while a task runs (retry when idle)")
    return what


def git_commit(repo: Path) -> str | None:
    """HEAD of the checkout the harness runs from (+ "-dirty" with local changes); None when
    it is not a git checkout (an installed wheel)."""
    try:
        head = subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True,
                              text=True, timeout=10, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(repo), "status", "--porcelain",
                                "--untracked-files=no"], capture_output=True, text=True,
                               timeout=10, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return head + ("-dirty" if dirty else "")

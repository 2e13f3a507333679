"""Test helper: run a real `edge-agent run --sim` daemon process against a private broker."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any, ClassVar

from mosquitto import Mosquitto, wait_until

from edge_agent.comms.client import json_line_request

REPO = Path(__file__).resolve().parents[1]
SIM_CONFIG = REPO / "configs" / "sim.toml"


class DaemonProc:
    """`edge-agent run --config configs/sim.toml --sim` with test overrides; output captured."""

    # every daemon a test started: a failing test's report ends with their last log lines
    # (conftest.py), so a CI failure can be read without rerunning it
    started: ClassVar[list[DaemonProc]] = []

    def __init__(self, tmp: Path, broker: Mosquitto | None, *, device: str = "dev1",
                 password: str = "dev1-secret-pw", extra: tuple[str, ...] = (),
                 env: dict[str, str] | None = None) -> None:
        self.state_dir = tmp / "state"
        self.device = device
        sets = [f"state_dir={self.state_dir}", f"device.id={device}",
                "mqtt.keepalive_s=2", "mqtt.reconnect_min_s=0.2", "mqtt.reconnect_max_s=1.0",
                # a loaded CI machine may need more than the default 1 s for the first frame
                "link.hello_timeout_s=10",
                # this shared 2-core VM stalls a process for 50-120 ms now and then (measured:
                # status.loop max late 114 ms under the suite's load); with sim.toml's 50 ms a
                # stall mid-motion is a (correct) deadman stop that a test about something else
                # reads as a failure. Tests about the deadman stall for 1 s or more.
                "link.deadman_ms=250"]
        if broker is not None:
            sets += [f"mqtt.port={broker.port}", f'mqtt.password="{password}"']
        else:
            sets += ["mqtt.port=1"]  # nothing listens there: the daemon must come up anyway
        self.cmd = [sys.executable, "-m", "edge_agent.cli", "run", "--config", str(SIM_CONFIG),
                    "--sim"]
        for s in (*sets, *extra):
            self.cmd += ["--set", s]
        self.env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
        self.lines: list[str] = []
        self.proc: subprocess.Popen[str] | None = None
        self._reader: threading.Thread | None = None

    def start(self) -> DaemonProc:
        self.proc = subprocess.Popen(self.cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     text=True, env=self.env, cwd=REPO, start_new_session=True)
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        DaemonProc.started.append(self)
        return self

    def _read(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))

    def events(self, name: str) -> list[dict[str, Any]]:
        out = []
        for line in list(self.lines):
            with contextlib.suppress(ValueError):
                rec = json.loads(line)
                if isinstance(rec, dict) and rec.get("event") == name:
                    out.append(rec)
        return out

    def wait_ready(self, timeout: float = 60.0) -> dict[str, Any]:
        wait_until(lambda: bool(self.events("ready")) or self.exited(), timeout, "daemon ready")
        assert not self.exited(), "daemon exited:\n" + "\n".join(self.lines[-40:])
        return self.events("ready")[0]

    def exited(self) -> bool:
        return self.proc is not None and self.proc.poll() is not None

    def socket_cmd(self, name: str, payload: dict[str, Any] | None = None,
                   timeout: float = 10.0) -> dict[str, Any]:
        """One command over the daemon's local control socket."""
        req = {"cmd": name, "v": 1, "id": os.urandom(6).hex(), **(payload or {})}
        return json_line_request(self.state_dir / "control.sock", req, timeout, what=name)

    def rig(self, req: dict[str, Any], timeout: float = 10.0) -> dict[str, Any]:
        """One request to the simulated robot's own control socket (fault injection, record)."""
        return json_line_request(self.state_dir / "rig.sock", req, timeout, what=str(req["cmd"]))

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 20.0) -> int | None:
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.proc.pid, sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout)
        # whatever the daemon left behind (rig, guardian) goes with its process group
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        if self._reader is not None:
            self._reader.join(5)
        return self.proc.returncode


# Tests about the journal (episodes, labels, export), not about L1 or the deadman: generous L1
# timeouts, and a 1 s deadman (measured: with three such daemons at once on this 2-core VM, a
# 250 ms deadman tripped mid-approach and the task never ended)
JOURNAL_TASK_SETS = (*(f"executor.l1_timeouts_s.{s}=60" for s in (
    "approach", "grasp", "lift", "transfer", "release", "retreat")), "link.deadman_ms=1000")


def wait_ready_for_tasks(d: DaemonProc, timeout: float = 60) -> None:
    """Until the daemon's link, MQTT, decision journal and policy model are all up."""
    def up() -> bool:
        st = d.socket_cmd("status")["result"]
        return bool(st["link_up"] and st["mqtt_connected"] and (st["journal"] or {}).get(
            "enabled") and (st["inference"] or {}).get("model"))

    wait_until(up, timeout, "link, MQTT, the journal and the model up")

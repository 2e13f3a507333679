"""hil.soak's faults: every kind `failure.inject` offers (edge_agent/commands/schema.py
FAILURE_MODES), with the seconds into a task it is injected at, and the operator's part after a
stop (what a person at the robot does: release the button, reset, resume; a reset never moves
the robot, a resume does).

Not drawn: `control_loop hang` (the systemd watchdog's test hook: under systemd the daemon is
killed and restarted on purpose — this soak checks that it is not) and `triton down` (no Triton
server here: the soak's trial and rollback need the local model to decide; hil.bench_degraded
`--triton` measures that fault). `model slow` is drawn as a fault outside a trial, and injected
once on purpose during the second model's trial (the rollback).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from hil.daemon_proc import Control


@dataclass(frozen=True, slots=True)
class SoakFault:
    name: str
    target: str
    mode: str
    duration_s: float
    at_s: float  # seconds after task.start
    severity: float | str | None = None
    latency_ms: float | None = None
    hold_s: float = 0.0  # e-stop: how long the button stays pressed

    def args(self) -> dict[str, Any]:
        a: dict[str, Any] = {"target": self.target, "mode": self.mode}
        if self.target != "estop":
            a["duration_s"] = self.duration_s
        if self.severity is not None:
            a["severity"] = self.severity
        if self.latency_ms is not None:
            a["latency_ms"] = self.latency_ms
        return a


CATALOGUE: tuple[SoakFault, ...] = (
    SoakFault("gpu fail", "gpu", "fail", 3.0, 1.0),
    SoakFault("model slow", "model", "slow", 3.0, 1.0, latency_ms=8.0),
    SoakFault("camera dropout", "sensor:object_pose", "dropout", 0.5, 1.0),
    SoakFault("wrist_force dropout", "sensor:wrist_force", "dropout", 0.3, 1.0),
    SoakFault("encoders stuck", "sensor:joint_encoders", "stuck", 0.5, 1.0),
    SoakFault("wrist_force noise", "sensor:wrist_force", "noise", 6.0, 0.5, severity=0.5),
    SoakFault("wrist_force spikes", "sensor:wrist_force", "spikes", 2.0, 1.0, severity=1.0),
    SoakFault("gripper_position noise", "sensor:gripper_position", "noise", 6.0, 0.5,
              severity=0.5),
    SoakFault("link corrupt", "link", "corrupt", 0.5, 1.5, severity=1.0),
    SoakFault("link unplug", "link", "unplug", 1.0, 1.5),
    SoakFault("collision", "collision", "impact", 0.3, 1.5, severity=1.0),
    SoakFault("e-stop", "estop", "press", 0.0, 1.5, hold_s=1.0),
    SoakFault("weak_close recoverable", "gripper", "weak_close", 8.0, 0.5, severity=0.55),
    SoakFault("weak_close unrecoverable", "gripper", "weak_close", 8.0, 0.5, severity=0.9),
    SoakFault("slip", "gripper", "slip", 0.3, 4.0),
)
BY_NAME = {f.name: f for f in CATALOGUE}
NOT_DRAWN = {
    "control_loop hang": "the systemd watchdog's test hook (the daemon is restarted on purpose)",
    "triton down": "no Triton server in the soak (the trial needs the local model to decide)",
}


class OperatorHands:
    """The operator at the robot, on the control socket (`edge-agent cmd` does the same)."""

    def __init__(self, ctl: Control, counts: dict[str, Any]) -> None:
        self.ctl, self.counts = ctl, counts

    def call(self, name: str, **args: Any) -> dict[str, Any]:
        try:
            return self.ctl.call(name, **args)
        except Exception as exc:  # a busy socket is retried by the caller
            return {"ok": False, "error": {"code": "socket", "message": str(exc)}}

    def clear_stop(self, timeout_s: float = 60.0) -> bool:
        """Release a pressed button, then reset until it is accepted (rate limit, link down)."""
        end = time.monotonic() + timeout_s
        while time.monotonic() < end:
            st = self.call("status").get("result") or {}
            stop = st.get("stop")
            if not stop:
                return True
            if stop.get("hardware_input"):
                self.call("failure.inject", target="estop", mode="release")
                time.sleep(0.2)
                continue
            if self.call("reset").get("ok"):
                self.counts["resets"] += 1
                return True
            time.sleep(0.5)
        return False

    def resume_or_cancel(self, task_id: str) -> None:
        """After the reset: resume the frozen task; if the daemon refuses, cancel it."""
        for _ in range(10):
            r = self.call("resume", task_id=task_id)
            if r.get("ok"):
                self.counts["resumes"] += 1
                return
            code = (r.get("error") or {}).get("code")
            if code in ("rate_limited", "socket", "busy"):
                time.sleep(0.5)
                continue
            break
        self.counts["resume_refused"] += 1
        st = self.call("status").get("result") or {}
        if (st.get("mode") == "running" or st.get("task")) and self.call(
                "task.cancel").get("ok"):
            self.counts["cancels"] += 1

"""What the daemon tells: the retained `state` (mode, task, stop, link; kept on MQTT) and the
`status` reply that starts with it (docs/asyncapi.yaml StateFields, Status).

Built from the daemon's parts through `DaemonParts`, the narrow view these functions read
(app.py's `Daemon` satisfies it); nothing here changes a part.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Protocol

from edge_agent import __version__
from edge_agent.daemon.linkmirror import LinkMirror
from edge_agent.executor.executor import Executor
from edge_agent.executor.latch import StopLatch

if TYPE_CHECKING:
    from edge_agent.config import Config
    from edge_agent.contract.status import StateFields, StatusResult
    from edge_agent.contract.status_observe import ObserveStatus
    from edge_agent.daemon.comms_hub import CommsHub
    from edge_agent.daemon.control import ControlPath
    from edge_agent.daemon.observers import Observers
    from edge_agent.daemon.policy_loader import PolicyLoader
    from edge_agent.daemon.recording import DaemonRecording
    from edge_agent.daemon.reporting import DaemonReports
    from edge_agent.daemon.startup_work import StartupWork
    from edge_agent.daemon.supervisor import Supervisor
    from edge_agent.executor.collector import CollectionStats
    from edge_agent.health.monitor import HealthMonitor
    from edge_agent.store.decisions import DecisionJournal


class DaemonParts(Protocol):
    """The parts `state` and `status` read (attributes of the running daemon)."""

    cfg: Config
    sim: bool
    boot_id: str
    started_mono: float
    startup_ms: float | None
    link_up_ms: float | None
    executor: Executor
    latch: StopLatch
    mirror: LinkMirror
    control: ControlPath
    policy: PolicyLoader
    decisions: DecisionJournal | None
    reports: DaemonReports
    gc_stats: CollectionStats
    startup: StartupWork
    threads: Supervisor
    comms: CommsHub
    health: HealthMonitor | None
    recording: DaemonRecording
    observers: Observers | None


def daemon_state(d: DaemonParts) -> StateFields:
    """The retained `state` (MQTT) and the first fields of `status`."""
    degraded = d.health.degraded() if d.health is not None else []
    return state_fields(d.executor, d.latch, d.mirror, d.policy.in_use(), degraded)


def daemon_status(d: DaemonParts) -> StatusResult:
    """The `status` reply (docs/asyncapi.yaml Status)."""
    now = time.monotonic()
    loop = d.control.loop_status()
    return {
        "device": d.cfg.device.id, "version": __version__, "boot_id": d.boot_id,
        "uptime_s": round(now - d.started_mono, 3), "startup_ms": d.startup_ms,
        "link_up_ms": d.link_up_ms, "config_hash": d.cfg.hash, "sim": d.sim,
        **daemon_state(d), "executor": d.executor.status(),
        "journal": d.decisions.stats() if d.decisions is not None else None,
        "inference": d.policy.status(),
        "model": d.policy.model_status(),  # current, previous, trial, shadow, bad (#29)
        "link": {**d.mirror.summary(), "watch": d.control.watch.summary()},
        "reports": d.reports.status(),
        "loop": {**loop, "gc": d.gc_stats.as_dict()} if loop else None,
        "background": d.startup.results,
        "threads": [h.as_dict() for h in d.threads.health()],
        # subscribed (a command published now is received); why not: `mqtt`'s error
        "mqtt_connected": d.comms.mqtt_ready, "mqtt": d.comms.mqtt_status(),
        "health": d.health.status() if d.health is not None else None,
        "observe": observe_status(d),
    }


def observe_status(d: DaemonParts) -> ObserveStatus:
    """`status.observe`: the recorder, the live view and the metrics endpoint."""
    live, metrics = d.observers.status() if d.observers is not None else (None, None)
    return {"recorder": d.recording.status(), "live": live, "metrics": metrics}


def state_fields(executor: Executor, latch: StopLatch, mirror: LinkMirror,
                 policy_in_use: str, degraded: list[str]) -> StateFields:
    """`state` now (docs/asyncapi.yaml StateFields); `degraded`: the health monitor's modes."""
    st = latch.state
    out: StateFields = {"mode": executor.mode_at(st.kind), "state": executor.state.value,
                        "degraded": degraded, "homed": bool(mirror.last_status is not None),
                        "link_up": mirror.link_up, "policy": policy_in_use}
    task = executor.task
    if task is not None:
        out["task"] = task
    if st.kind is not None:
        out["stop"] = {"kind": st.kind, "cause": st.first_cause, "causes": list(st.causes),
                       "hardware_input": st.hardware_input}
    return out

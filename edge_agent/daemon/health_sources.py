"""The health monitor from the daemon's parts: what each probe reads (health/wiring.py builds)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from edge_agent.health.monitor import HealthMonitor
from edge_agent.health.wiring import HealthSources, build_health

if TYPE_CHECKING:
    from edge_agent.config import Config
    from edge_agent.daemon.comms_hub import CommsHub
    from edge_agent.daemon.control import ControlPath
    from edge_agent.daemon.linkmirror import LinkMirror
    from edge_agent.daemon.reporting import DaemonReports
    from edge_agent.executor.collector import CollectionStats
    from edge_agent.sensors.hub import SensorHub
    from edge_agent.store.decisions import DecisionJournal
    from edge_agent.store.reserve import SpaceReserve


def daemon_health(cfg: Config, *, comms: CommsHub, reports: DaemonReports, mirror: LinkMirror,
                  control: ControlPath, gc_stats: CollectionStats,
                  decisions: DecisionJournal | None, background: Mapping[str, Any],
                  hub: SensorHub, reserve: SpaceReserve | None = None) -> HealthMonitor:
    """The monitor (not started), tapped into every event the comms publish."""

    def shed_storage(on: bool) -> None:
        """storage_low: what can wait stops taking disk (the journal, report plots)."""
        if decisions is not None:
            decisions.set_shedding(on)
        reports.outbox.shed_plots = on

    def guardian_alive() -> bool:
        g = control.guardian
        return g is not None and g.alive

    def gc_long_pauses() -> int:
        after = gc_stats.after_startup
        return sum(after.over_5ms) if after is not None else 0

    return build_health(cfg, HealthSources(
        publish=comms.event, tap_events=comms.add_listener, state_changed=comms.state_changed,
        submit_report=reports.submit, mqtt_ready=lambda: comms.mqtt_ready,
        mqtt_detail=comms.mqtt_status,
        outbox_pending=lambda: int(reports.status().get("pending", 0)),
        link_frames=lambda: mirror.frames, link_up=lambda: mirror.link_up,
        guardian_alive=guardian_alive,
        loop_stats=lambda: control.loop.stats if control.loop is not None else None,
        gc_long_pauses=gc_long_pauses,
        journal_stats=lambda: decisions.stats() if decisions is not None else None,
        state_dir=Path(cfg.state_dir), background=background, sensor_hub=hub, reserve=reserve,
        shed_storage=shed_storage))

"""Wiring of the observers after READY: the Prometheus endpoint (edge_agent/metrics) and the
live Foxglove view (edge_agent/liveview), each only when its port is set, each imported only
then (prometheus_client, foxglove-sdk), each on threads of its own. A port that cannot be bound
is logged and the daemon runs on: an observer is never a reason to stop a robot.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from edge_agent.log import get_logger

if TYPE_CHECKING:
    from edge_agent.config import Config
    from edge_agent.daemon.control import ControlPath
    from edge_agent.executor.loop import LoopStats
    from edge_agent.liveview.server import LiveView
    from edge_agent.store.decisions import DecisionJournal

_log = get_logger(__name__)


class ObservedDaemon(Protocol):
    """The parts the observers read."""

    cfg: Config
    control: ControlPath
    decisions: DecisionJournal | None

    def status(self) -> dict[str, Any]: ...


class DaemonMetricsSource:
    """edge_agent.metrics.collector.MetricsSource over the running daemon."""

    def __init__(self, d: ObservedDaemon) -> None:
        self.d = d

    def status(self) -> dict[str, Any]:
        return self.d.status()

    def loop_stats(self) -> LoopStats | None:
        loop = self.d.control.loop
        return loop.stats if loop is not None else None

    def journal_files(self) -> Sequence[Path]:
        """Every journal's segments (decisions, episodes, shadow: one directory)."""
        dec = self.d.decisions
        if dec is None:
            return []
        try:
            with os.scandir(dec.journal.directory) as it:
                return [Path(e.path) for e in it if e.name.endswith(".jnl") and e.is_file()]
        except OSError:
            return []


class Observers:
    """What `start` started; `stop()` (the supervisor's "observe" member) stops them."""

    def __init__(self) -> None:
        self.stops: list[Callable[[], None]] = []
        self.live: LiveView | None = None

    def stop(self) -> None:
        for stop in reversed(self.stops):
            try:
                stop()
            except Exception as exc:  # never raises: the supervisor goes on
                _log.warning("observer_stop_failed", error=str(exc))
        self.stops.clear()


def start_observers(d: ObservedDaemon) -> Observers:
    """After READY: the metrics endpoint and the live view, each when its port is set."""
    obs = Observers()
    cfg = d.cfg.observe
    if cfg.metrics_port is not None:
        try:
            from edge_agent.metrics.server import MetricsServer
            srv = MetricsServer(DaemonMetricsSource(d), cfg.metrics_host, cfg.metrics_port)
            obs.stops.append(srv.stop)
        except OSError as exc:
            _log.error("metrics_not_started", host=cfg.metrics_host, port=cfg.metrics_port,
                       error=str(exc))
    if cfg.foxglove_port is not None:
        try:
            from edge_agent.liveview.server import LiveView
            view = LiveView(cfg.foxglove_host, cfg.foxglove_port, cfg.foxglove_rate_hz)
            obs.stops.append(view.stop)
            obs.live = view
        except (OSError, RuntimeError) as exc:  # foxglove-sdk: RuntimeError for a bind failure
            _log.error("liveview_not_started", host=cfg.foxglove_host, port=cfg.foxglove_port,
                       error=str(exc))
    return obs

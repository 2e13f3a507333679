"""Wiring of the observers after READY: the Prometheus endpoint (edge_agent/metrics) and the
live Foxglove view (edge_agent/liveview), each only when its port is set, each imported only
then (prometheus_client, foxglove-sdk), each on threads of its own. A port that cannot be bound
is logged and the daemon runs on: an observer is never a reason to stop a robot.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from edge_agent.log import get_logger

if TYPE_CHECKING:
    from edge_agent.config import Config
    from edge_agent.contract.status_observe import LiveViewStatus, MetricsStatus
    from edge_agent.daemon.control import ControlPath
    from edge_agent.executor.loop import LoopStats
    from edge_agent.liveview.server import LiveView
    from edge_agent.store.decisions import DecisionJournal

_log = get_logger(__name__)
_EXTRA = "install the observe extra: pip install 'edge-agent[observe]'"


class ObservedDaemon(Protocol):
    """The parts the observers read."""

    cfg: Config
    control: ControlPath
    decisions: DecisionJournal | None

    def status(self) -> Mapping[str, Any]: ...


class DaemonMetricsSource:
    """edge_agent.metrics.collector.MetricsSource over the running daemon."""

    def __init__(self, d: ObservedDaemon, observers: Observers | None = None) -> None:
        self.d = d
        self.observers = observers

    def status(self) -> Mapping[str, Any]:
        return self.d.status()

    def loop_stats(self) -> LoopStats | None:
        loop = self.d.control.loop
        return loop.stats if loop is not None else None

    def live_status(self) -> LiveViewStatus | None:
        live = self.observers.live if self.observers is not None else None
        return live.status() if live is not None else None

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
    """Started on a thread of their own (`start`: the imports of prometheus_client and
    foxglove-sdk and the binds never hold up the main thread after READY); `stop()` (the
    supervisor's "observe" member) waits for that thread, then stops what it started."""

    def __init__(self) -> None:
        self.stops: list[Callable[[], None]] = []
        self.live: LiveView | None = None
        self.metrics: MetricsStatus | None = None  # host and port, once it listens
        self._lock = threading.Lock()
        self._closing = False
        self._starter: threading.Thread | None = None

    def start(self, d: ObservedDaemon) -> Observers:
        self._starter = threading.Thread(target=self._start, args=(d,), name="observe-start",
                                         daemon=True)
        self._starter.start()
        return self

    def _keep(self, stop: Callable[[], None]) -> None:
        with self._lock:
            if not self._closing:
                self.stops.append(stop)
                return
        stop()  # stop() came first: this one goes at once

    def _start(self, d: ObservedDaemon) -> None:
        cfg = d.cfg.observe
        if cfg.metrics_port is not None:
            try:
                from edge_agent.metrics.server import MetricsServer
                srv = MetricsServer(DaemonMetricsSource(d, self), cfg.metrics_host,
                                    cfg.metrics_port)
                self._keep(srv.stop)
                self.metrics = {"host": cfg.metrics_host, "port": cfg.metrics_port}
            except (OSError, ImportError) as exc:  # ImportError: the `observe` extra is absent
                _log.error("metrics_not_started", host=cfg.metrics_host, port=cfg.metrics_port,
                           error=str(exc), hint=_EXTRA if isinstance(exc, ImportError) else None)
        if cfg.foxglove_port is not None:
            try:
                from edge_agent.liveview.server import LiveView
                view = LiveView(cfg.foxglove_host, cfg.foxglove_port, cfg.foxglove_rate_hz)
                self.live = view
                self._keep(view.stop)
            except (OSError, RuntimeError, ImportError) as exc:  # RuntimeError: bind failed
                _log.error("liveview_not_started", host=cfg.foxglove_host,
                           port=cfg.foxglove_port, error=str(exc),
                           hint=_EXTRA if isinstance(exc, ImportError) else None)

    def status(self) -> tuple[LiveViewStatus | None, MetricsStatus | None]:
        """`status.observe`'s live view and metrics parts (None: off or not started)."""
        live = self.live
        return (live.status() if live is not None else None), self.metrics

    def stop(self) -> None:
        with self._lock:
            self._closing = True
            stops, self.stops = self.stops, []
        if self._starter is not None:
            self._starter.join(5.0)
        for stop in reversed(stops):
            try:
                stop()
            except Exception as exc:  # never raises: the supervisor goes on
                _log.warning("observer_stop_failed", error=str(exc))


def start_observers(d: ObservedDaemon) -> Observers:
    """After READY: the metrics endpoint and the live view, each when its port is set."""
    return Observers().start(d)

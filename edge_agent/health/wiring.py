"""Builds the daemon's health monitor from explicit collaborators and routes what it decides.

`build_health(cfg, sources)` registers the probes (the daemon's own, health/probes.py; the
per-channel sensor probes; the inference probes once the policy stack exists:
`attach_inference_probes`) and turns each mode transition into (after switching the hub's
channel to its median for `sensor_filtered`, after shedding the journal and report plots for
`storage_low` or taking them back):
- an event `{"type": degraded | recovered, "mode", "subject", "probe", "cause", "figures"}`,
- a changed `state` (`state.degraded` reads `HealthMonitor.degraded()`),
- a repair report (`ModeRecord` → the daemon's reports outbox) whose recovery is the rule in
  words: "left after 3 good probes of broker; next probe at 14:03:10 UTC".
Every published event goes to `HealthMonitor.on_event`, the fast path: an MQTT disconnect, a link
fault, a journal turned off, a failed calibration count as a failed probe run at once (each
probe's `fails_on`; an inference or sensor probe says its own).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from edge_agent.health.modes import Transition
from edge_agent.health.monitor import HealthMonitor
from edge_agent.health.probe import Probe
from edge_agent.health.probes import BrokerProbe, LinkProbe, LoopProbe, StartupProbe, StoreProbe
from edge_agent.reports.record import ModeRecord
from edge_agent.store.reserve import SpaceReserve
from edge_agent.vocab import DegradationMode, EventType

if TYPE_CHECKING:
    from edge_agent.config import Config
    from edge_agent.contract.events import Event


# What each mode takes out of service, and what decides or carries on instead.
CAPABILITIES: Mapping[DegradationMode, tuple[str, ...]] = {
    DegradationMode.BROKER_LOST: ("commands over MQTT", "events, state and reports to the broker"),
    DegradationMode.CPU_INFERENCE: ("policy inference on the GPU",),
    DegradationMode.REMOTE_POLICY_LOST: ("the remote (Triton) policy",),
    DegradationMode.CACHED_POLICY: ("the current policy model",),
    DegradationMode.RULE_POLICY: ("every policy model",),
    DegradationMode.SENSOR_PREDICTED: ("a sensor channel's measurements",),
    DegradationMode.SENSOR_FILTERED: ("a sensor channel's raw samples (a spike storm)",),
    DegradationMode.STORAGE_LOW: ("the decision journal", "report plots",
                                  "free space under the state directory"),
}
FALLBACK: Mapping[DegradationMode, str] = {
    DegradationMode.BROKER_LOST: ("commands over the local control socket; events and state "
                                  "queued by the MQTT client (mqtt.max_queued), reports kept "
                                  "in the outbox until the broker is back"),
    DegradationMode.CPU_INFERENCE: "the policy on the CPU",
    DegradationMode.REMOTE_POLICY_LOST: "the local ONNX model",
    DegradationMode.CACHED_POLICY: "the verified last-known-good model",
    DegradationMode.RULE_POLICY: "the rule-based expert",
    DegradationMode.SENSOR_PREDICTED: "Kalman-predicted values inside the channel's bound",
    DegradationMode.SENSOR_FILTERED: ("the median of the channel's last spike-filter window of "
                                      "samples, for every sample (a wiring or EMI fault is "
                                      "likely: check the sensor's cable and shield)"),
    DegradationMode.STORAGE_LOW: ("decisions not journaled (counted as shed), reports without "
                                  "a plot; snapshots (the stop state) go on, into the "
                                  "preallocated reserve when the disk has no room — a protective "
                                  "stop (snapshot_failed) only once the reserve is gone: free "
                                  "space under the state directory"),
}


@dataclass(frozen=True, slots=True)
class HealthSources:
    """What the probes read and where the monitor's decisions go (all plain callables)."""

    publish: Callable[[Event], None]  # an event out (CommsHub.event)
    tap_events: Callable[[Callable[[Event], None]], None]  # sees every event
    state_changed: Callable[[], None]
    submit_report: Callable[[ModeRecord], object]  # DaemonReports.submit
    mqtt_ready: Callable[[], bool]  # connected with the command subscription granted
    mqtt_detail: Callable[[], Mapping[str, Any]]  # CommsHub.mqtt_status
    outbox_pending: Callable[[], int]
    link_frames: Callable[[], int]
    link_up: Callable[[], bool]
    guardian_alive: Callable[[], bool]
    loop_stats: Callable[[], Any]  # the control loop's LoopStats, None before it starts
    gc_long_pauses: Callable[[], int]
    journal_stats: Callable[[], Mapping[str, Any] | None]
    state_dir: Path
    background: Mapping[str, Any]  # the daemon's start-up work results
    sensor_hub: Any = None  # for the sensor probes (health/sensor_probes.py)
    reserve: SpaceReserve | None = None  # the snapshots' space reserve (the store probe)
    shed_storage: Callable[[bool], None] | None = None  # storage_low entered (True) / left
    clock: Callable[[], float] = time.monotonic


def daemon_probes(cfg: Config, src: HealthSources) -> list[Probe]:
    """The daemon's own probes (health/probes.py)."""
    status_hz = 1e6 / cfg.link.status_period_us
    return [
        BrokerProbe(src.mqtt_ready, src.mqtt_detail, src.outbox_pending),
        LinkProbe(src.link_frames, src.link_up, src.guardian_alive,
                  min_frames_hz=0.5 * status_hz),
        LoopProbe(src.loop_stats, src.gc_long_pauses, rate_hz=cfg.control.rate_hz),
        StoreProbe(src.state_dir, src.journal_stats, reserve=src.reserve,
                   min_free_bytes=cfg.store.min_free_bytes),
        StartupProbe(src.background),
    ]


def sensor_probes(cfg: Config, hub: Any) -> list[Probe]:
    """The per-channel sensor probes (health/sensor_probes.py)."""
    if hub is None:
        return []
    from edge_agent.health.sensor_probes import make_sensor_probes

    return list(make_sensor_probes(hub, cfg.robot, cfg))


def attach_inference_probes(monitor: HealthMonitor | None, router: Any, cfg: Config) -> int:
    """The inference probes (health/inference_probes.py) once the policy router exists (it is
    built after READY); returns how many were added."""
    if monitor is None or router is None:
        return 0
    from edge_agent.health.inference_probes import make_inference_probes

    probes = list(make_inference_probes(router, cfg))
    monitor.add_probes(probes)
    return len(probes)


def build_health(cfg: Config, src: HealthSources) -> HealthMonitor:
    """The monitor (not started), its event fast path tapped into the event stream."""
    h = cfg.health
    probes = daemon_probes(cfg, src) + sensor_probes(cfg, src.sensor_hub)
    periods = {k: getattr(h.periods, k) for k in h.periods.__dataclass_fields__}
    monitor = HealthMonitor(probes, period_s=h.period_s, periods=periods,
                            budget_s=h.probe_budget_s, fail_after=h.fail_after,
                            recover_after=h.recover_after,
                            on_transition=_router(src, h.recover_after), clock=src.clock)
    src.tap_events(monitor.on_event)
    if src.sensor_hub is not None:
        from edge_agent.health.sensor_probes import watch_stale

        watch_stale(src.sensor_hub, monitor.fail_now)  # a channel gone stale, at once
    return monitor


def _router(src: HealthSources, recover_after: int
            ) -> Callable[[Transition, HealthMonitor], None]:
    def on_transition(t: Transition, monitor: HealthMonitor) -> None:
        if t.mode is DegradationMode.SENSOR_FILTERED and src.sensor_hub is not None:
            src.sensor_hub.set_median(t.subject, t.entered)  # the mode's fallback, then the news
        if t.mode is DegradationMode.STORAGE_LOW and src.shed_storage is not None:
            src.shed_storage(t.entered)  # shed before the report, which needs a little disk
        fig = dict(t.figures)
        src.publish({"type": EventType.DEGRADED, "mode": t.mode, "subject": t.subject,
                     "probe": t.probe, "cause": t.cause, "figures": fig} if t.entered else
                    {"type": EventType.RECOVERED, "mode": t.mode, "subject": t.subject,
                     "probe": t.probe, "cause": t.cause, "figures": fig})
        src.state_changed()
        now, wall = src.clock(), time.time()
        nxt = monitor.next_run(t.probe)
        scope = CAPABILITIES.get(t.mode, ())
        if t.subject:
            scope = tuple(f"{c} ({t.subject})" for c in scope)
        recovery = (f"left after {recover_after} good probes of {t.probe}" if t.entered
                    else f"left after {recover_after} good probes of {t.probe}: normal operation")
        src.submit_report(ModeRecord(
            mode=t.mode.value + (f":{t.subject}" if t.subject else ""), entered=t.entered,
            reason=t.cause, wall=wall, mono=now, capabilities=scope,
            fallback=FALLBACK.get(t.mode) if t.entered else None, recovery=recovery,
            next_probe_wall=None if nxt is None else wall + max(0.0, nxt - now),
            figures={"probe": t.probe, "subject": t.subject, **dict(t.figures)}))

    return on_transition

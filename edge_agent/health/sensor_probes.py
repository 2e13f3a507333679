"""Sensor health probes: per channel of the robot description, its freshness and its quality.

Built on `SensorHub`: `snapshot(now)` (per channel freshness, age, prediction, bound) and
`channel_counts(name)` (samples received, dropped as spikes, invalid, non-finite, stuck). A
check reads them and compares with the previous check: no I/O, no heavy work, one snapshot per
round.

- `sensor:<channel>`: fresh, or not. For an `on_loss = "predict"` channel the mode is
  `sensor_predicted` with the channel as subject — the hub's Kalman estimator stands in for it,
  up to its bound; past the bound the hub's `sensor_bound` protective stop holds (the probe says
  so, the stop is not its business). A `stop` channel reports without a mode: its loss is that
  stop already.
- `sensor:<channel>:quality` (reports only, no mode: what it sees is either still measured or
  already refused by the hub, and a refused channel is `sensor:<channel>`'s loss): NaN/inf
  samples, a value outside the description's `range`, stuck (samples the hub refused as stuck —
  `stuck_samples` in a row the same bit for bit; on a channel without that check, a noise-free
  one, the value unchanged over a whole probe period while `moving()` says the joints move).
- `sensor:<channel>:spikes` (a channel with a `spike_filter`) → `sensor_filtered` with the channel
  as subject: the spike ratio (dropped / received over the period) above the channel's
  `spike_filter.max_ratio`. A storm that dense outgrows the Hampel test (its MAD grows with the
  outliers and lets them through), so while the mode holds the hub reports the median of the
  filter's window for every sample (`SensorHub.set_median`, switched by health/wiring.py); the
  filter still counts the outliers, so the ratio tells when the storm is over.

Fast paths: `watch_stale(hub, fail_now)` registers a hub stale listener — a channel that had
samples and goes stale (in the firmware's time too) is seen inside the control thread's next
snapshot, within one control tick of its staleness bound (three of its own periods); the
listener only enqueues, and a thread of this module hands it to `fail_now(probe, message,
**figures)` (the monitor's). And `sensor:<channel>` fails at once on the daemon's `sensor_lost`
event naming it (`fails_on`, the monitor's event tap).
"""

from __future__ import annotations

import math
import queue
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from edge_agent.health.probe import Figure, GuardedProbe, Probe, ProbeResult
from edge_agent.log import get_logger
from edge_agent.robot import RobotDescription, SensorChannel
from edge_agent.sensors.hub import SensorHub
from edge_agent.sensors.readings import ChannelCounts, Freshness, Snapshot, Source
from edge_agent.vocab import DegradationMode, EventType

if TYPE_CHECKING:
    from edge_agent.contract.events import Event

log = get_logger(__name__)
FailNow = Callable[..., None]  # HealthMonitor.fail_now(probe_name, message, **figures)
MIN_SAMPLES_FOR_RATIO = 10  # fewer samples in a period: no spike ratio is judged


class _Snapshots:
    """One hub snapshot per monitor round, shared by every sensor probe."""

    def __init__(self, hub: SensorHub) -> None:
        self._hub = hub
        self._last: Snapshot | None = None

    def at(self, now: float) -> Snapshot:
        snap = self._last
        if snap is None or snap.t != now:
            snap = self._last = self._hub.snapshot(now, tell=False)  # control thread tells
        return snap


class _ChannelProbe(GuardedProbe):
    def __init__(self, name: str, channel: SensorChannel, mode: DegradationMode | None,
                 snapshots: _Snapshots) -> None:
        super().__init__(name, mode)
        self._ch, self._snaps = channel, snapshots
        self.subject = channel.name if mode is not None else ""


class SensorFreshnessProbe(_ChannelProbe):
    """`sensor:<channel>`: see the module docstring. One failure enters `sensor_predicted`: the
    check fails only when the firmware went on without the channel, and from that tick on the
    executor already uses predicted values — the mode says what is true, not after 3 periods."""

    fail_after = 1

    def __init__(self, channel: SensorChannel, snapshots: _Snapshots, stale_s: float) -> None:
        mode = DegradationMode.SENSOR_PREDICTED if channel.on_loss == "predict" else None
        super().__init__(f"sensor:{channel.name}", channel, mode, snapshots)
        self._stale_s = stale_s

    def fails_on(self, event: Event) -> str | None:
        """The daemon's `sensor_lost` event naming this channel (health/probe.py EventAware)."""
        lost = event.get("channels") if event.get("type") == EventType.SENSOR_LOST else None
        if isinstance(lost, list) and self._ch.name in lost:
            return f"{self._ch.name} lost past its bound (sensor_lost)"
        return None

    def _check(self, now: float) -> ProbeResult:
        snap = self._snaps.at(now)
        c, ch = snap.channel(self._ch.name), self._ch
        age_ms = round(c.age_s * 1e3, 1) if math.isfinite(c.age_s) else None
        figs: dict[str, Figure] = {"channel": ch.name, "age_ms": age_ms,
                                   "source": c.source.value, "on_loss": ch.on_loss}
        if c.freshness is Freshness.OK:
            return ProbeResult.ok("fresh", **figs)
        if snap.fw_time_s is None:
            return ProbeResult.warn("no STATUS from the robot yet", **figs)
        if c.reading is None:  # nothing to predict from: not lost until its bound says so
            if c.lost:
                return ProbeResult.error("no valid sample since start-up (past its bound: the "
                                         "sensor_bound stop)", **figs)
            return ProbeResult.warn("no valid sample yet", **figs)
        if snap.fw_time_s - c.reading.t_fw <= self._stale_s:  # the robot sent nothing newer
            return ProbeResult.warn(f"no frame for {age_ms} ms: the host or the link is late, "
                                    "the channel is not", **figs)
        if ch.on_loss == "predict" and not (c.past_bound or c.lost):
            return ProbeResult.error(f"no sample for {age_ms} ms: Kalman-predicted (bound "
                                     f"{ch.predict_max_s:g} s)", **figs)
        if ch.on_loss == "predict":
            return ProbeResult.error(f"no sample for {age_ms} ms: past its prediction bound "
                                     f"({ch.predict_max_s:g} s, or its std bound; the "
                                     "sensor_bound stop)", **figs)
        return ProbeResult.error(f"no sample for {age_ms} ms (the sensor_bound stop)", **figs)


class SensorQualityProbe(_ChannelProbe):
    """`sensor:<channel>:quality`: see the module docstring."""

    def __init__(self, hub: SensorHub, channel: SensorChannel, snapshots: _Snapshots,
                 moving: Callable[[], bool] | None = None) -> None:
        super().__init__(f"sensor:{channel.name}:quality", channel, None, snapshots)
        self._hub = hub
        self._moving = moving
        self._prev: ChannelCounts | None = None
        self._prev_value: tuple[float, ...] | None = None

    def _check(self, now: float) -> ProbeResult:
        ch = self._ch
        snap = self._snaps.at(now)
        c = snap.channel(ch.name)
        counts = self._hub.channel_counts(ch.name)
        prev = self._prev or ChannelCounts(0, 0, 0, 0)
        self._prev = counts
        received = counts.received - prev.received
        nonfinite = counts.nonfinite - prev.nonfinite
        stuck = counts.stuck - prev.stuck
        figs: dict[str, Figure] = {"channel": ch.name, "received": received,
                                   "nonfinite": nonfinite,
                                   "invalid": counts.invalid - prev.invalid, "stuck": stuck}
        problems: list[str] = []
        if nonfinite:
            problems.append(f"{nonfinite} NaN/inf samples")
        if stuck:
            problems.append(f"stuck: {stuck} samples refused, each the same bit for bit as the "
                            f"{ch.stuck_samples - 1} before it (the channel counts as lost)")
        r = c.reading
        value = r.value if r is not None and r.source is Source.MEASURED else None
        if value is not None and ch.value_range is not None:
            lo, hi = ch.value_range
            out = [v for v in value if not lo <= v <= hi]
            if out:
                problems.append(f"value {out[0]:g} outside its range [{lo:g}, {hi:g}]")
        prev_value, self._prev_value = self._prev_value, value
        if (not ch.stuck_samples and value is not None and value == prev_value and received > 0
                and (ch.noise_std > 0 or (self._moving is not None and self._moving()))):
            problems.append("stuck: the same value over a whole probe period")
        if problems:
            return ProbeResult.error("; ".join(problems), **figs)
        return ProbeResult.ok("plausible", **figs)


class SpikeStormProbe(_ChannelProbe):
    """`sensor:<channel>:spikes`: see the module docstring."""

    def __init__(self, hub: SensorHub, channel: SensorChannel, snapshots: _Snapshots) -> None:
        super().__init__(f"sensor:{channel.name}:spikes", channel,
                         DegradationMode.SENSOR_FILTERED, snapshots)
        self._hub = hub
        self._prev: ChannelCounts | None = None

    def _check(self, now: float) -> ProbeResult:
        ch = self._ch
        counts = self._hub.channel_counts(ch.name)
        prev = self._prev or ChannelCounts(0, 0, 0, 0)
        self._prev = counts
        received = counts.received - prev.received
        spikes = counts.spikes_rejected - prev.spikes_rejected
        figs: dict[str, Figure] = {"channel": ch.name, "received": received,
                                   "spikes_rejected": spikes, "max_ratio": ch.spike_max_ratio}
        if received < MIN_SAMPLES_FOR_RATIO:
            return ProbeResult.ok(f"{received} samples this period: too few to judge", **figs)
        ratio = spikes / received
        figs["spike_ratio"] = round(ratio, 4)
        if ratio > ch.spike_max_ratio:
            return ProbeResult.error(
                f"{ratio:.0%} of {received} samples dropped as spikes (max "
                f"{ch.spike_max_ratio:.0%}): a spike storm; the median of the last "
                f"{ch.spike_window} samples stands in", **figs)
        return ProbeResult.ok(f"{ratio:.0%} of samples dropped as spikes", **figs)


def make_sensor_probes(hub: SensorHub, robot: RobotDescription, cfg: Any = None, *,
                       moving: Callable[[], bool] | None = None) -> list[Probe]:
    """Two probes per channel of `robot`, three with a spike filter (the module docstring);
    `cfg` (the Config) is accepted for the monitor's uniform call and not needed: each
    channel's bounds are in the description."""
    snaps = _Snapshots(hub)
    probes: list[Probe] = []
    for ch, stale_s in zip(robot.sensors, hub.loss_s, strict=True):
        probes.append(SensorFreshnessProbe(ch, snaps, stale_s))
        probes.append(SensorQualityProbe(hub, ch, snaps, moving))
        if ch.spike_window:
            probes.append(SpikeStormProbe(hub, ch, snaps))
    return probes


class StaleWatch:
    """The hub's stale listener (control thread: one queue put) and the thread that hands each
    channel gone stale to `fail_now` as a failure of its `sensor:<channel>` probe."""

    name = "sensor-stale-watch"

    def __init__(self, hub: SensorHub, fail_now: FailNow) -> None:
        self._fail_now = fail_now
        self._predicted = frozenset(c.name for c in hub.channels if c.on_loss == "predict")
        self._q: queue.SimpleQueue[tuple[tuple[str, ...], float] | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
        self._thread.start()
        hub.add_stale_listener(self._on_stale)
        self.seen = 0  # channels handed on

    def _on_stale(self, names: tuple[str, ...], now: float) -> None:
        self._q.put((names, now))

    def _run(self) -> None:
        while (item := self._q.get()) is not None:
            names, now = item
            for n in names:
                self.seen += 1
                try:
                    then = ("Kalman-predicted inside its bound" if n in self._predicted
                            else "held (the sensor_bound stop past its bound)")
                    self._fail_now(f"sensor:{n}", f"{n} went stale: no valid sample within "
                                   f"its staleness bound; {then}", channel=n, at=now)
                except Exception:
                    log.exception("stale_fail_now_failed", channel=n)

    def stop(self) -> None:
        """Idempotent; the listener stays registered but nothing is handed on."""
        self._q.put(None)


def watch_stale(hub: SensorHub, fail_now: FailNow) -> StaleWatch:
    """The sensor fast path (see the module docstring): call once the monitor exists."""
    return StaleWatch(hub, fail_now)

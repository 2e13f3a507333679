"""SensorHub: the latest sensor readings, kept by the link reader, handed to the control thread.

The link reader thread calls `update(msg, now)` with every decoded STATUS, SENSOR and ESTOP_EDGE
frame. The hub validates each sample (firmware valid flag, dimension, finite values), refuses a
stuck channel's (filters.StuckGate: lost as in a dropout), drops spikes on the channels it
filters, subtracts calibration offsets, feeds the channel's Kalman estimator (built with the
hub, so a `predict` channel is predicted from its first frame; the closed form needs neither
filterpy nor numpy), and publishes an immutable state by swapping one reference under a lock.
The control thread's `snapshot(now)` works out freshness, predictions and bounds for `now` from
that reference, without the lock and without copying.

STATUS fields map onto the "status" channels by name (docs/PROTOCOL.md §2): joint_encoders <- q,
joint_currents <- current, gripper_position <- gripper_pos, wrist_force <- gripper_force,
estop_input <- flags.ESTOP_INPUT; SENSOR frames by channel id onto the "sensor" channels.

An estimator is fed at most `estimator_rate_hz` (100 Hz) samples a second (a step costs a few
µs of the reader thread; 1 kHz channels would cost ten times that). Predictions extrapolate from
the filter's own time, so skipping samples costs accuracy only, not timing.

The 1 kHz STATUS path competes for the GIL with the control loop, so it is lean: a precomputed
spec per channel, finiteness checked with one `sum`, the estimates tuple rebuilt only when one
changed (`hil/bench_link_reader.py` measures it).

Threads: one writer (`update`; `set_calibration`, `attach_estimators` from any thread), any
number of readers (`snapshot`). No I/O; time is always passed in.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from types import MappingProxyType
from typing import TYPE_CHECKING, NamedTuple

from edge_agent.link.codec import EstopEdge, Sensor, Status, StatusFlag
from edge_agent.log import get_logger
from edge_agent.robot import RobotDescription, SensorChannel
from edge_agent.sensors.filters import spike_filters, step_delay_s, stuck_gates
from edge_agent.sensors.readings import (
    ChannelCounts,
    ChannelStatus,
    Freshness,
    Reading,
    Snapshot,
    Source,
    all_finite,
)
from edge_agent.sensors.specs import (
    ChannelSpec,
    build_specs,
    calibration_offsets,
    status_channels,
)

if TYPE_CHECKING:
    from edge_agent.sensors.kalman import EstimatorBank, EstimatorState

log = get_logger(__name__)
StaleListener = Callable[[tuple[str, ...], float], None]

_ESTOP_BIT = int(StatusFlag.ESTOP_INPUT)
_NEW_TUPLE = tuple.__new__  # builds a NamedTuple without its Python-level __new__ (same tuple)
_MEASURED = Source.MEASURED
_NEG_INF = -math.inf
_isfinite = math.isfinite


class _State(NamedTuple):
    """What the writer publishes: per channel (description order) the last valid reading."""

    readings: tuple[Reading | None, ...]
    estimates: tuple[EstimatorState | None, ...]
    status: Status | None  # the last STATUS frame
    dq: tuple[float, ...]  # its last finite joint velocities and gripper current
    gripper_current: float | None


class SensorHub:
    """Latest readings per channel, published as immutable snapshots."""

    def __init__(self, robot: RobotDescription, *, stale_periods: float = 3.0,
                 spike_filtered: Iterable[str] | None = None, spike_k: float = 5.0,
                 spike_window: int = 7, estimator_rate_hz: float = 100.0,
                 estimators: bool = True) -> None:
        self._channels = robot.sensors
        self._n_joints = robot.n_joints
        self._index = {c.name: i for i, c in enumerate(robot.sensors)}
        self._frame_index = tuple(self._index[c.name] for c in robot.frame_sensors)
        self._status_channels = status_channels(robot)
        if stale_periods <= 0 or estimator_rate_hz <= 0:
            raise ValueError("stale_periods and estimator_rate_hz must be > 0")
        # per channel: stale after this long without a sample; gone (the stale listeners) past
        # that plus the time its spike filter holds back a genuine step (filters.step_delay_s)
        self.stale_s = tuple(stale_periods / c.rate_hz for c in robot.sensors)
        self._spike = spike_filters(robot, spike_filtered, spike_k, spike_window)
        self._stuck_gates = stuck_gates(robot)
        self._median_on: frozenset[str] = frozenset()  # channels in sensor_filtered
        self.loss_s = tuple(s + step_delay_s(f, c.rate_hz) for s, f, c in
                            zip(self.stale_s, self._spike, robot.sensors, strict=True))
        self._min_est_dt = 1.0 / estimator_rate_hz
        self._first_fw: float | None = None  # firmware time of the first STATUS (s)
        self._offsets: tuple[tuple[float, ...] | None, ...] = (None,) * len(robot.sensors)
        self._bank: EstimatorBank | None = None
        if estimators:  # plain Python (see kalman.py): cheap enough for the start-up path
            from edge_agent.sensors.kalman import EstimatorBank
            self._bank = EstimatorBank.create(robot)
        self._readings: list[Reading | None] = [None] * len(robot.sensors)
        self._estimates: list[EstimatorState | None] = [None] * len(robot.sensors)
        self._counters = dict.fromkeys(("status_frames", "sensor_frames", "estop_edges",
                                        "invalid_samples", "spikes_rejected", "stuck_samples",
                                        "unknown_channel", "ignored_frames"), 0)
        # Per channel (only the rare paths count on the 1 kHz STATUS path: a status channel
        # receives one sample per STATUS frame): samples outside STATUS, spikes dropped,
        # stuck samples refused, invalid samples, and of those the non-finite ones.
        n = len(robot.sensors)
        self._received, self._spiked, self._stuck, self._invalid, self._nonfinite = (
            [0] * n, [0] * n, [0] * n, [0] * n, [0] * n)
        self._is_status = tuple(c.source == "status" for c in robot.sensors)
        self._enc = self._index.get("joint_encoders")
        self._stale_listeners: tuple[StaleListener, ...] = ()
        self._was_stale: frozenset[str] = frozenset()
        self._write_lock = threading.Lock()
        self._lock = threading.Lock()
        self._estimates_t: tuple[EstimatorState | None, ...] = tuple(self._estimates)
        self._state = _State(tuple(self._readings), self._estimates_t, None, (), None)
        self._specs: tuple[ChannelSpec, ...] = ()
        self._status_specs: tuple[ChannelSpec, ...] = ()
        self._build_specs()

    def _build_specs(self) -> None:
        """What `_sample` and the STATUS path look up per sample (under the write lock, or in
        __init__): sensors/specs.py."""
        self._specs = build_specs(self._channels, self._spike, self._stuck_gates, self._median_on,
                                  self._offsets, self._bank)
        self._status_specs = tuple(self._specs[i] for i in self._status_channels)

    # ------------------------------------------------------------------ writer side

    def update(self, msg: object, now: float) -> None:
        """Take one decoded frame that arrived at host monotonic time `now`.

        STATUS, SENSOR and ESTOP_EDGE frames update channels; anything else is counted, ignored.
        """
        with self._write_lock:
            old = self._state
            status, dq, current = old.status, old.dq, old.gripper_current
            if isinstance(msg, Status):
                self._counters["status_frames"] += 1
                if status is None or msg.fw_time_us < status.fw_time_us:
                    self._first_fw = msg.fw_time_us * 1e-6  # the first STATUS, or a restart
                self._status(msg, now)
                status = msg
                mdq = msg.dq
                if len(mdq) == self._n_joints and (_isfinite(sum(mdq)) or all_finite(mdq)):
                    dq = mdq
                if _isfinite(msg.gripper_current):
                    current = msg.gripper_current
            elif isinstance(msg, Sensor):
                self._counters["sensor_frames"] += 1
                if msg.channel >= len(self._frame_index):
                    self._counters["unknown_channel"] += 1
                    return
                self._sample(self._frame_index[msg.channel], msg.values,
                             msg.fw_time_us * 1e-6, now, msg.valid)
            elif isinstance(msg, EstopEdge):
                self._counters["estop_edges"] += 1
                idx = self._index.get("estop_input")
                if idx is not None:
                    self._sample(idx, (1.0 if msg.pressed else 0.0,), msg.fw_time_us * 1e-6,
                                 now, True)
            else:
                self._counters["ignored_frames"] += 1
                return
            new = _NEW_TUPLE(_State, (tuple(self._readings), self._estimates_t, status, dq,
                                      current))
            with self._lock:
                self._state = new

    def _status(self, msg: Status, now: float) -> None:
        """`_sample` for every status channel of one STATUS frame, inlined (1 kHz)."""
        t_fw = msg.fw_time_us * 1e-6
        fields = (msg.q, msg.current, (msg.gripper_pos,), (msg.gripper_force,),
                  (1.0 if int(msg.flags) & _ESTOP_BIT else 0.0,))
        readings = self._readings
        invalid = spikes = stuck_n = 0
        estimated = False
        for i, slot, name, dim, spike, stuck, median, offset, est, latency_s in self._status_specs:
            value = fields[slot]
            # sum() is finite only if every value is; an overflowing sum decides per value.
            if len(value) != dim or not (_isfinite(sum(value)) or all_finite(value)):
                invalid += 1
                self._invalid[i] += 1
                self._nonfinite[i] += len(value) == dim
                continue
            if stuck is not None and stuck(value, t_fw):
                stuck_n += 1
                self._stuck[i] += 1
                continue
            if spike is not None and not spike(value):
                spikes += 1
                self._spiked[i] += 1
                if median is None:
                    continue
            if median is not None:
                value = median()
            if offset is not None:
                value = tuple(v - o for v, o in zip(value, offset, strict=True))
            readings[i] = _NEW_TUPLE(Reading, (name, value, t_fw, now, True, _MEASURED))
            if est is not None:
                t_meas = now - latency_s
                et = est.t
                if est.t_measured == _NEG_INF or et is None or t_meas - et >= self._min_est_dt:
                    est.update(value, t_meas)
                    self._estimates[i] = est.state()
                    estimated = True
        if invalid:
            self._counters["invalid_samples"] += invalid
        if spikes:
            self._counters["spikes_rejected"] += spikes
        if stuck_n:
            self._counters["stuck_samples"] += stuck_n
        if estimated:
            self._estimates_t = tuple(self._estimates)

    def _sample(self, i: int, value: tuple[float, ...], t_fw: float, now: float,
                valid: bool) -> None:
        """Validate, filter, calibrate and store one sample of channel i (and feed its
        estimator, at most estimator_rate_hz)."""
        _, _, name, dim, spike, stuck, median, offset, est, latency_s = self._specs[i]
        self._received[i] += 1
        if not valid or len(value) != dim or not all_finite(value):
            self._counters["invalid_samples"] += 1
            self._invalid[i] += 1
            self._nonfinite[i] += len(value) == dim and not all_finite(value)
            return
        if stuck is not None and stuck(tuple(value), t_fw):
            self._counters["stuck_samples"] += 1
            self._stuck[i] += 1
            return
        if spike is not None and not spike(value):
            self._counters["spikes_rejected"] += 1
            self._spiked[i] += 1
            if median is None:
                return
        if median is not None:
            value = median()
        if offset is not None:
            value = tuple(v - o for v, o in zip(value, offset, strict=True))
        self._readings[i] = Reading(name, value, t_fw, now)
        if est is not None:
            t_meas = now - latency_s
            if not est.measured or est.t is None or t_meas - est.t >= self._min_est_dt:
                est.update(value, t_meas)
                self._estimates[i] = est.state()
                self._estimates_t = tuple(self._estimates)

    def set_calibration(self, offsets: Mapping[str, Sequence[float]]) -> None:
        """Replace the calibration: each listed channel's offset is subtracted from its samples."""
        new = calibration_offsets(self._channels, offsets)
        with self._write_lock:
            self._offsets = new
            self._build_specs()

    def set_median(self, name: str, on: bool) -> bool:
        """`sensor_filtered` (the health monitor's mode): while on, channel `name` reports the
        median of its spike filter's window for every sample, outliers too (still counted);
        False for a channel without a spike filter."""
        i = self._index.get(name)
        if i is None or self._spike[i] is None:
            return False
        with self._write_lock:
            self._median_on = self._median_on | {name} if on else self._median_on - {name}
            self._build_specs()
        return True

    @property
    def median_on(self) -> frozenset[str]:
        """The channels in `sensor_filtered` now (their values are the window's median)."""
        return self._median_on

    def attach_estimators(self, bank: EstimatorBank) -> None:
        """Replace the Kalman estimators (other tuning; the hub builds default ones itself)."""
        with self._write_lock:
            self._bank = bank
            self._build_specs()

    def counters(self) -> dict[str, int]:
        """Frames seen and samples refused, by kind."""
        return dict(self._counters)

    def channel_counts(self, name: str) -> ChannelCounts:
        """Samples of one channel received, dropped as spikes, invalid, non-finite, refused as
        stuck (so far)."""
        i = self._index[name]
        received = self._received[i] + (self._counters["status_frames"]
                                        if self._is_status[i] else 0)
        return ChannelCounts(received, self._spiked[i], self._invalid[i], self._nonfinite[i],
                             self._stuck[i])

    @property
    def channels(self) -> tuple[SensorChannel, ...]:
        """The robot description's channels, in frame order."""
        return tuple(self._channels)

    def add_stale_listener(self, listener: StaleListener) -> None:
        """Call `listener(channels, now)` when channels that had samples are gone in host and
        firmware time (`loss_s`): the health fast path. Runs inside `snapshot`: only enqueue."""
        self._stale_listeners = (*self._stale_listeners, listener)

    # ------------------------------------------------------------------ reader side
    def snapshot(self, now: float, *, tell: bool = True) -> Snapshot:
        """The picture at `now` (host time); `tell`: the stale listeners hear of it (only the
        control thread tells; a reader elsewhere — the health monitor — passes False).

        `past_bound` (the control view: hold) counts host time since the last sample arrived;
        `lost` (a protective stop) counts firmware time (`_lost`, docs/PROTOCOL.md "Sensor
        loss"): a stalled host or a silent link has lost no channel. Only stale channels are
        looked at (a healthy one is cheap).
        """
        with self._lock:
            st = self._state
        fw_now = st.status.fw_time_us * 1e-6 if st.status is not None else None
        statuses: dict[str, ChannelStatus] = {}
        stale: list[str] = []
        went: list[str] = []  # stale, with a sample before (the stale listeners)
        past: list[str] = []
        for i, ch in enumerate(self._channels):
            r = st.readings[i]
            age = now - r.t_host if r is not None else math.inf
            past_bound = lost = False
            if age <= self.stale_s[i]:
                fresh = Freshness.OK
            else:
                fresh = Freshness.STALE
                stale.append(ch.name)
                # gone in the firmware's time too (a stalled host or a silent link is not)
                if r is not None and fw_now is not None and fw_now - r.t_fw > self.loss_s[i]:
                    went.append(ch.name)
                est = st.estimates[i]
                if ch.on_loss == "predict":
                    past_bound = age > ch.predict_max_s
                    if past_bound:
                        past.append(ch.name)
                if fw_now is not None:
                    lost = self._lost(i, ch, r, est, fw_now, age)
                if r is not None:
                    if not past_bound and est is not None and est.measured:
                        r = r.with_value(est.value_at(now), Source.PREDICTED)
                    else:
                        r = r.with_value(r.value, Source.STALE)
            statuses[ch.name] = ChannelStatus(ch.name, r, fresh, age, ch.on_loss, past_bound,
                                              lost)
        if tell and (went or self._was_stale):
            self._tell_stale(went, now)
        enc_est = st.estimates[self._enc] if self._enc is not None else None
        return Snapshot.assemble(now, st.status, st.dq, st.gripper_current,
                                 enc_est.vel if enc_est is not None else None,
                                 MappingProxyType(statuses), tuple(stale), tuple(past))

    def _tell_stale(self, went: list[str], now: float) -> None:
        now_stale = frozenset(went)
        new = now_stale - self._was_stale
        self._was_stale = now_stale
        if new and self._stale_listeners:
            names = tuple(n for n in went if n in new)
            for listener in self._stale_listeners:
                try:
                    listener(names, now)
                except Exception:  # a broken listener must not break the control loop
                    log.exception("stale_listener_failed")

    def _lost(self, i: int, ch: SensorChannel, r: Reading | None, est: EstimatorState | None,
              fw_now: float, host_age: float) -> bool:
        """Whether stale channel i is lost in firmware time (docs/PROTOCOL.md "Sensor loss")."""
        since = r.t_fw if r is not None else self._first_fw
        if since is None:
            return False
        fw_age = fw_now - since
        if fw_age < 0:  # the firmware restarted since that sample: its clock began again
            fw_age = host_age
        if ch.on_loss == "stop":
            return fw_age > self.stale_s[i] + ch.latency_s
        if fw_age > ch.predict_max_s:
            return True
        if ch.predict_max_std > 0 and est is not None and est.measured:
            # the std after the firmware time lost, not the host's: a late host loses nothing
            return max(est.std_at(est.t + fw_age)) > ch.predict_max_std
        return False

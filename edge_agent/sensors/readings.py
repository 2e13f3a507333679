"""Sensor values as immutable records: readings per channel, channel health, the hub's snapshot.

A `Reading` is what the control thread sees for one channel: the value (calibrated), the
firmware time of the sample, the host's monotonic time when it arrived, whether the firmware
called it valid, and where the value comes from now — measured, predicted by the channel's
Kalman estimator, or stale (the last value, held, past any prediction). A `Snapshot` is the
whole picture at one instant, built by `SensorHub.snapshot(now)`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:
    from edge_agent.link.codec import Status


class Source(StrEnum):
    MEASURED = "measured"
    PREDICTED = "predicted"
    STALE = "stale"


class Freshness(StrEnum):
    """Whether a channel's measurements are arriving (REQUIREMENTS 19: STALE is never OK)."""

    OK = "ok"  # a valid sample within `stale_periods` periods of the channel's rate
    STALE = "stale"  # no valid sample for longer (or never)


class Reading(NamedTuple):
    """One channel's value at one instant.

    A NamedTuple rather than a frozen dataclass: as immutable, and several times cheaper to
    build — the hub builds one per channel per STATUS frame, at 1 kHz.
    """

    channel: str
    value: tuple[float, ...]
    t_fw: float  # firmware time of the sample, s (fw_time_us / 1e6)
    t_host: float  # host monotonic time when the sample arrived, s
    valid: bool = True
    source: Source = Source.MEASURED

    def age(self, now: float) -> float:
        """Seconds since the underlying measurement arrived."""
        return now - self.t_host

    def with_value(self, value: tuple[float, ...], source: Source) -> Reading:
        """The same sample times, another value and source (a prediction or a held value)."""
        return Reading(self.channel, value, self.t_fw, self.t_host, self.valid, source)


class ChannelStatus(NamedTuple):
    """A channel's state in a snapshot: its reading (None before the first), freshness, bounds."""

    name: str
    reading: Reading | None
    freshness: Freshness
    age_s: float  # since the last valid measurement arrived; inf if none yet
    on_loss: str  # "predict" | "stop", from the robot description
    past_bound: bool  # a predict channel stale for longer than its predict_max_s
    # Lost past its bound in the firmware's time (see SensorHub.snapshot): a protective stop.
    lost: bool = False

    @property
    def source(self) -> Source:
        return self.reading.source if self.reading is not None else Source.STALE

    @property
    def usable(self) -> bool:
        """Fresh, or a predict channel within its bound (predicted, or held before the
        estimators are up): safe to control with. The complement of `Snapshot.lost`."""
        if self.reading is None:
            return False
        return self.freshness is Freshness.OK or (self.on_loss == "predict"
                                                  and not self.past_bound)


@dataclass(frozen=True, slots=True)
class Snapshot:
    """Everything the control thread needs for one tick; immutable, safe to keep.

    Values never received are empty tuples / None. `q` is measured while the encoders are
    fresh, Kalman-predicted while they are stale but within their bound, then the last value
    held (`q_source` says which). `lost` lists what should stop the robot: `stop` channels
    without a valid sample for a few of their periods and predicted channels past their bound,
    both counted in the firmware's time (a host that stalled has lost nothing).
    """

    t: float  # host monotonic time the snapshot is for
    fw_time_s: float | None  # firmware time of the last STATUS
    flags: int  # StatusFlag bits of the last STATUS (0 before the first)
    last_cmd_seq: int | None
    estop_input: bool | None  # None: never reported
    q: tuple[float, ...]
    dq: tuple[float, ...]
    q_source: Source
    currents: tuple[float, ...]
    gripper_pos: float | None
    gripper_current: float | None
    gripper_force: float | None
    object_pose: Reading | None
    channels: Mapping[str, ChannelStatus]
    stale: tuple[str, ...]
    past_bound: tuple[str, ...]

    def channel(self, name: str) -> ChannelStatus:
        return self.channels[name]

    @classmethod
    def assemble(cls, now: float, status: Status | None, dq: tuple[float, ...],
                 gripper_current: float | None, enc_vel: tuple[float, ...] | None,
                 ch: Mapping[str, ChannelStatus], stale: tuple[str, ...],
                 past: tuple[str, ...]) -> Snapshot:
        """The snapshot from the last STATUS and every channel's status (`SensorHub`);
        `enc_vel` (the encoders' estimator velocity) is `dq` while `q` is predicted."""
        def value(name: str) -> Reading | None:
            c = ch.get(name)
            return c.reading if c is not None else None

        def scalar(name: str) -> float | None:
            r = value(name)
            return r.value[0] if r is not None else None

        s = status
        enc, estop = value("joint_encoders"), value("estop_input")
        if enc is not None and enc.source is Source.PREDICTED and enc_vel is not None:
            dq = enc_vel
        currents = value("joint_currents")
        return cls(
            t=now,
            fw_time_s=s.fw_time_us * 1e-6 if s is not None else None,
            flags=int(s.flags) if s is not None else 0,
            last_cmd_seq=s.last_cmd_seq if s is not None else None,
            estop_input=bool(estop.value[0]) if estop is not None else None,
            q=enc.value if enc is not None else (),
            dq=dq,
            q_source=enc.source if enc is not None else Source.STALE,
            currents=currents.value if currents is not None else (),
            gripper_pos=scalar("gripper_position"),
            gripper_current=gripper_current,
            gripper_force=scalar("wrist_force"),
            object_pose=value("object_pose"),
            channels=ch,
            stale=stale,
            past_bound=past,
        )

    @property
    def lost(self) -> tuple[str, ...]:
        """Channels whose loss calls for a protective stop (the caller decides what it needs)."""
        return tuple(c.name for c in self.channels.values() if c.lost)

    @property
    def ok(self) -> bool:
        return not self.lost


def all_finite(values: tuple[float, ...]) -> bool:
    return all(math.isfinite(v) for v in values)


class ChannelCounts(NamedTuple):
    """One channel's samples so far (`SensorHub.channel_counts`)."""

    received: int
    spikes_rejected: int
    invalid: int
    nonfinite: int
    stuck: int = 0  # refused: the same value bit for bit `stuck_samples` times in a row

"""The SensorHub's per-channel work, resolved once: which STATUS field feeds a channel, and per
channel the spike filter, stuck gate, median (in `sensor_filtered`), calibration offset and
Kalman estimator the 1 kHz path calls (rebuilt on calibration, estimators, a mode change)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from types import MappingProxyType
from typing import TYPE_CHECKING, NamedTuple

from edge_agent.errors import ConfigError
from edge_agent.robot import RobotDescription, SensorChannel
from edge_agent.sensors.filters import SpikeFilter, StuckGate
from edge_agent.sensors.readings import all_finite

if TYPE_CHECKING:
    from edge_agent.sensors.kalman import ChannelEstimator, EstimatorBank

# the channels a STATUS frame carries (hub.py's docstring), each its slot in `_status`'s fields
STATUS_FIELDS: Mapping[str, int] = MappingProxyType({
    "joint_encoders": 0, "joint_currents": 1, "gripper_position": 2, "wrist_force": 3,
    "estop_input": 4})


class ChannelSpec(NamedTuple):
    """One channel's per-sample work."""

    channel_index: int
    slot: int  # STATUS_FIELDS of a status channel; -1 otherwise
    name: str
    dim: int
    spike: Callable[[Sequence[float]], bool] | None  # SpikeFilter.accept
    stuck: Callable[[tuple[float, ...], float], bool] | None  # StuckGate.stuck
    median: Callable[[], tuple[float, ...]] | None  # SpikeFilter.median in sensor_filtered
    offset: tuple[float, ...] | None
    est: ChannelEstimator | None
    latency_s: float


def status_channels(robot: RobotDescription) -> list[int]:
    """The indices of the description's "status" channels; a ConfigError for a channel a STATUS
    frame does not carry, or an encoder / current channel whose dim is not the joint count."""
    src = robot.source or None
    for c in robot.sensors:
        if c.source == "status" and c.name not in STATUS_FIELDS:
            raise ConfigError("sensors", c.name, "a STATUS frame carries no such channel "
                              f"(known: {', '.join(STATUS_FIELDS)})", src)
    for c in robot.sensors:
        if c.name in ("joint_encoders", "joint_currents") and c.dim != robot.n_joints:
            raise ConfigError("sensors", c.name, f"dim must equal the {robot.n_joints} joints",
                              src)
    return [i for i, c in enumerate(robot.sensors) if c.source == "status"]


def build_specs(channels: Sequence[SensorChannel], spike: Sequence[SpikeFilter | None],
                stuck: Sequence[StuckGate | None], median_on: frozenset[str],
                offsets: Sequence[tuple[float, ...] | None], bank: EstimatorBank | None
                ) -> tuple[ChannelSpec, ...]:
    return tuple(
        ChannelSpec(i, STATUS_FIELDS.get(c.name, -1) if c.source == "status" else -1, c.name,
                    c.dim, s.accept if (s := spike[i]) is not None else None,
                    g.stuck if (g := stuck[i]) is not None else None,
                    s.median if s is not None and c.name in median_on else None, offsets[i],
                    bank.get(c.name) if bank is not None else None, c.latency_s)
        for i, c in enumerate(channels))


def calibration_offsets(channels: Sequence[SensorChannel], offsets: Mapping[str, Sequence[float]]
                        ) -> tuple[tuple[float, ...] | None, ...]:
    """Per channel the offset to subtract, or None; ValueError for a channel that cannot be
    calibrated (unknown, the e-stop input) or an offset that is not dim finite values."""
    index = {c.name: i for i, c in enumerate(channels)}
    new: list[tuple[float, ...] | None] = [None] * len(channels)
    for name, off in offsets.items():
        if name not in index or name == "estop_input":
            raise ValueError(f"cannot calibrate channel {name!r}")
        ch = channels[index[name]]
        vals = tuple(float(v) for v in off)
        if len(vals) != ch.dim or not all_finite(vals):
            raise ValueError(f"{name}: offset must be {ch.dim} finite values, got {vals}")
        new[index[name]] = vals
    return tuple(new)

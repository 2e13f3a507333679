"""The robot description: joints, limits, frames, workspace, gripper and sensors, validated.

One TOML file (configs/robot/*.toml) read by both the daemon and the simulated robot. Values are
SI units; every bad value raises ConfigError naming the key, the value and why.
"""

from __future__ import annotations

import math
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from edge_agent.errors import ConfigError
from edge_agent.toml_table import TableReader as _Reader

ROBOT_SCHEMA_VERSION = 1
MAX_JOINTS = 16  # docs/PROTOCOL.md: LIMIT_CLAMPED / OVERCURRENT details are u16 joint bit masks
OnLoss = Literal["predict", "stop"]
SensorSource = Literal["status", "sensor"]


@dataclass(frozen=True, slots=True)
class Joint:
    """One revolute joint: axis, link length and limits (SI units)."""

    name: str
    axis: Literal["x", "y", "z"]
    link_length_m: float
    position_min_rad: float
    position_max_rad: float
    velocity_max_rad_s: float
    current_max_a: float
    home_rad: float

    def clamp(self, q: float) -> float:
        return min(max(q, self.position_min_rad), self.position_max_rad)


@dataclass(frozen=True, slots=True)
class Workspace:
    """Axis-aligned box (base frame) the tool centre may be commanded into."""

    min_m: tuple[float, float, float]
    max_m: tuple[float, float, float]

    def contains(self, p: tuple[float, float, float] | list[float]) -> bool:
        return all(lo <= v <= hi for v, lo, hi in zip(p, self.min_m, self.max_m, strict=True))


@dataclass(frozen=True, slots=True)
class Gripper:
    """The parallel gripper's stroke, force, current and speed range."""

    stroke_min_m: float
    stroke_max_m: float
    force_min_n: float
    force_max_n: float
    current_min_a: float
    current_max_a: float
    current_nominal_a: float
    speed_max_m_s: float


@dataclass(frozen=True, slots=True)
class SensorChannel:
    """One sensor channel: where it arrives, its rate and noise, what its loss means."""

    name: str
    source: SensorSource
    dim: int
    unit: str
    rate_hz: float
    noise_std: float
    on_loss: OnLoss
    predict_max_s: float = 0.0
    latency_s: float = 0.0
    # A predicted channel is also past its bound once its estimator's position std exceeds
    # this (in the channel's unit); 0 = the time bound only.
    predict_max_std: float = 0.0
    # `range = [lo, hi]`: every value of a sane sample lies within (the health probe's check).
    value_range: tuple[float, float] | None = None
    # `spike_filter = {window, k, max_ratio}`: the hub's Hampel filter (window samples, k robust
    # sigmas) and the health probe's bound on rejected / received per period; window 0 = none.
    spike_window: int = 0
    spike_k: float = 5.0
    spike_max_ratio: float = 0.2
    # `stuck_samples`: this many samples in a row the same bit for bit is a stuck sensor (a
    # channel with noise never repeats itself); the hub refuses them until the value moves, so
    # the channel is lost as in a dropout. 0 (the default): off — a real sensor may repeat
    # itself (a quantized encoder at rest, a current of exactly 0 A with the drives off).
    stuck_samples: int = 0


@dataclass(frozen=True, slots=True)
class RobotDescription:
    """A validated robot description: frames, joints, workspace, gripper, sensor channels."""

    name: str
    version: str
    base_xyz_m: tuple[float, float, float]
    base_rpy_rad: tuple[float, float, float]
    tool_offset_m: float
    joints: tuple[Joint, ...]
    workspace: Workspace
    table_z_m: float
    gripper: Gripper
    sensors: tuple[SensorChannel, ...]
    source: str = ""
    # Soft joint limits for manual jogs: this far inside each joint's position limits.
    soft_limit_margin_rad: float = 0.0

    def soft_limits(self) -> tuple[tuple[float, float], ...]:
        """(min, max) per joint that a jog may reach: the limits less the soft margin."""
        m = self.soft_limit_margin_rad
        return tuple((j.position_min_rad + m, j.position_max_rad - m) for j in self.joints)

    @property
    def n_joints(self) -> int:
        return len(self.joints)

    @property
    def home(self) -> tuple[float, ...]:
        return tuple(j.home_rad for j in self.joints)

    def sensor(self, name: str) -> SensorChannel:
        for s in self.sensors:
            if s.name == name:
                return s
        raise KeyError(name)

    @property
    def frame_sensors(self) -> tuple[SensorChannel, ...]:
        """Channels sent as SENSOR frames, in channel-id order (docs/PROTOCOL.md §7)."""
        return tuple(s for s in self.sensors if s.source == "sensor")

    def sensor_channel_id(self, name: str) -> int:
        for i, s in enumerate(self.frame_sensors):
            if s.name == name:
                return i
        raise KeyError(name)


# --------------------------------------------------------------------------- loading


def _unique(readers: list[_Reader], names: list[str], what: str) -> None:
    seen: dict[str, int] = {}
    for i, (r, n) in enumerate(zip(readers, names, strict=True)):
        if n in seen:
            raise r.fail("name", n, f"duplicate {what} name (also {readers[seen[n]].key('name')})")
        seen[n] = i


def _range(r: _Reader, lo_key: str, hi_key: str, lo: float, hi: float) -> None:
    if lo > hi:
        raise r.fail(lo_key, lo, f"min is greater than max ({r.key(hi_key)} = {hi})")


def _joint(r: _Reader) -> Joint:
    j = Joint(
        name=r.text("name"),
        axis=r.text("axis", choices=("x", "y", "z")),  # type: ignore[arg-type]
        link_length_m=r.num("link_length_m", lo=0.0),
        position_min_rad=r.num("position_min_rad", lo=-2 * math.pi, hi=2 * math.pi),
        position_max_rad=r.num("position_max_rad", lo=-2 * math.pi, hi=2 * math.pi),
        velocity_max_rad_s=r.num("velocity_max_rad_s", lo=0.0, lo_open=True),
        current_max_a=r.num("current_max_a", lo=0.0, lo_open=True),
        home_rad=r.num("home_rad", 0.0),
    )
    _range(r, "position_min_rad", "position_max_rad", j.position_min_rad, j.position_max_rad)
    if not j.position_min_rad <= j.home_rad <= j.position_max_rad:
        raise r.fail("home_rad", j.home_rad, "is outside the joint's position limits")
    r.done()
    return j


def _value_range(r: _Reader) -> tuple[float, float] | None:
    v = r.raw("range", None)
    if v is None:
        return None
    if (not isinstance(v, list) or len(v) != 2
            or not all(isinstance(x, int | float) and not isinstance(x, bool) for x in v)
            or not all(math.isfinite(float(x)) for x in v)):
        raise r.fail("range", v, "must be [min, max]: 2 finite numbers")
    lo, hi = float(v[0]), float(v[1])
    if lo >= hi:
        raise r.fail("range", v, "min must be less than max")
    return lo, hi


def _spike_filter(r: _Reader) -> dict[str, Any]:
    if r.raw("spike_filter", None) is None:
        return {}
    f = r.table("spike_filter")
    out = {"spike_window": f.integer("window", lo=3, hi=64),
           "spike_k": f.num("k", 5.0, lo=0.0, lo_open=True),
           "spike_max_ratio": f.num("max_ratio", 0.2, lo=0.0, hi=1.0, lo_open=True)}
    f.done()
    return out


def _stuck_samples(r: _Reader) -> int:
    noisy = r.num("noise_std", lo=0.0) > 0
    n = r.integer("stuck_samples", 0, lo=0, hi=100_000)
    if n == 1:
        raise r.fail("stuck_samples", n, "must be 0 (off) or >= 2: one sample is never stuck")
    if n and not noisy:
        raise r.fail("stuck_samples", n, "a noise-free channel (noise_std = 0) repeats itself "
                     "at rest: stuck detection needs noise")
    return n


def _sensor(r: _Reader) -> SensorChannel:
    s = SensorChannel(
        name=r.text("name"),
        source=r.text("source", choices=("status", "sensor")),  # type: ignore[arg-type]
        dim=r.integer("dim", lo=1, hi=16),
        unit=r.text("unit"),
        rate_hz=r.num("rate_hz", lo=0.0, lo_open=True),
        noise_std=r.num("noise_std", lo=0.0),
        on_loss=r.text("on_loss", choices=("predict", "stop")),  # type: ignore[arg-type]
        predict_max_s=r.num("predict_max_s", 0.0, lo=0.0),
        latency_s=r.num("latency_s", 0.0, lo=0.0),
        predict_max_std=r.num("predict_max_std", 0.0, lo=0.0),
        value_range=_value_range(r),
        **_spike_filter(r),
        stuck_samples=_stuck_samples(r),
    )
    if s.on_loss == "stop" and s.predict_max_std > 0:
        raise r.fail("predict_max_std", s.predict_max_std,
                     "only a channel with on_loss = 'predict' is predicted")
    if s.name == "estop_input" and s.spike_window:
        raise r.fail("spike_filter", "{...}", "the e-stop input is never filtered")
    if s.name == "estop_input" and s.on_loss != "stop":
        raise r.fail("on_loss", s.on_loss, "the e-stop input is never predicted")
    if s.on_loss == "predict" and s.predict_max_s <= 0:
        raise r.fail("predict_max_s", s.predict_max_s, "on_loss = 'predict' needs a bound > 0")
    r.done()
    return s


def parse_robot(data: Mapping[str, Any], source: str = "") -> RobotDescription:
    """Validate a parsed robot-description table."""
    r = _Reader(data, "", source)
    ver = r.raw("schema_version")
    if ver != ROBOT_SCHEMA_VERSION:
        raise r.fail("schema_version", ver, f"this edge-agent reads version {ROBOT_SCHEMA_VERSION}")
    base = r.table("base")
    tool = r.table("tool")
    ws = r.table("workspace")
    table = r.table("table")
    g = r.table("gripper")
    joint_tables = r.tables("joints")
    if len(joint_tables) > MAX_JOINTS:
        raise r.fail("joints", f"{len(joint_tables)} joints",
                     f"at most {MAX_JOINTS} (the wire protocol's joint bit masks are 16 bits)")
    joints = tuple(_joint(j) for j in joint_tables)
    _unique(joint_tables, [j.name for j in joints], "joint")
    sensor_tables = r.tables("sensors")
    sensors = tuple(_sensor(s) for s in sensor_tables)
    _unique(sensor_tables, [s.name for s in sensors], "sensor")
    workspace = Workspace(ws.vec3("min_m"), ws.vec3("max_m"))
    margin = ws.num("soft_limit_margin_rad", 0.0, lo=0.0)
    for j in joints:
        if 2 * margin >= j.position_max_rad - j.position_min_rad:
            raise ws.fail("soft_limit_margin_rad", margin,
                          f"leaves joint {j.name!r} no range (its limits are "
                          f"{j.position_min_rad}..{j.position_max_rad} rad)")
    for i, ax in enumerate("xyz"):
        if workspace.min_m[i] > workspace.max_m[i]:
            raise ws.fail("min_m", list(workspace.min_m),
                          f"min {ax} is greater than max {ax} ({workspace.max_m[i]})")
    gripper = Gripper(
        stroke_min_m=g.num("stroke_min_m", lo=0.0),
        stroke_max_m=g.num("stroke_max_m", lo=0.0, lo_open=True),
        force_min_n=g.num("force_min_n", lo=0.0),
        force_max_n=g.num("force_max_n", lo=0.0, lo_open=True),
        current_min_a=g.num("current_min_a", lo=0.0),
        current_max_a=g.num("current_max_a", lo=0.0, lo_open=True),
        current_nominal_a=g.num("current_nominal_a", lo=0.0, lo_open=True),
        speed_max_m_s=g.num("speed_max_m_s", lo=0.0, lo_open=True),
    )
    _range(g, "stroke_min_m", "stroke_max_m", gripper.stroke_min_m, gripper.stroke_max_m)
    _range(g, "force_min_n", "force_max_n", gripper.force_min_n, gripper.force_max_n)
    _range(g, "current_min_a", "current_max_a", gripper.current_min_a, gripper.current_max_a)
    if not gripper.current_min_a <= gripper.current_nominal_a <= gripper.current_max_a:
        raise g.fail("current_nominal_a", gripper.current_nominal_a,
                     "must lie between current_min_a and current_max_a")
    desc = RobotDescription(
        name=r.text("name"),
        version=r.text("version"),
        base_xyz_m=base.vec3("xyz_m"),
        base_rpy_rad=base.vec3("rpy_rad", [0.0, 0.0, 0.0]),
        tool_offset_m=tool.num("offset_m", lo=0.0),
        joints=joints,
        workspace=workspace,
        table_z_m=table.num("z_m"),
        gripper=gripper,
        sensors=sensors,
        source=source,
        soft_limit_margin_rad=margin,
    )
    for sub in (base, tool, ws, table, g, r):
        sub.done()
    return desc


def load_robot(path: str | Path) -> RobotDescription:
    """Read and validate a robot description file."""
    p = Path(path)
    try:
        data = tomllib.loads(p.read_text(encoding="utf-8"))
    except FileNotFoundError as exc:
        raise ConfigError("robot.description", str(p), "file not found") from exc
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError("robot.description", str(p), f"not valid TOML: {exc}") from exc
    return parse_robot(data, str(p))

"""Rig settings (configs/rig/*.toml): hidden biases, motor and gripper dynamics, fault ranges.

What the robot description does not say about the simulated robot. Validated against the
description (per-joint arrays must have one value per joint); a bad value raises ConfigError naming
the key. `RigConfig()` with no file gives the same values as configs/rig/default.toml.
"""

from __future__ import annotations

import dataclasses
import math
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from edge_agent.errors import ConfigError
from edge_agent.robot import RobotDescription

RIG_SCHEMA_VERSION = 1
DEFAULT_RIG = Path(__file__).resolve().parents[2] / "configs" / "rig" / "default.toml"

_SPIKES = {"joint_encoders": 0.2, "joint_currents": 5.0, "gripper_position": 0.02,
           "wrist_force": 20.0, "object_pose": 0.10}


@dataclass(frozen=True, slots=True)
class RigConfig:
    """Every rig setting; field names are `<table>_<key>` of the TOML file."""

    firmware_tick_us: int = 1000
    firmware_fw_version: str = "hil-sim-1"
    firmware_estop_hold: bool = True
    firmware_deadman_latch: bool = True
    firmware_bad_frame_report_s: float = 0.1
    firmware_max_catch_up_ticks: int = 200
    motor_time_constant_s: float = 0.030
    motor_transport_delay_s: float = 0.018
    motor_brake_time_constant_s: float = 0.010
    motor_accel_max_rad_s2: tuple[float, ...] = (200.0, 150.0, 200.0, 300.0)
    motor_current_per_accel_a: tuple[float, ...] = (0.012, 0.025, 0.014, 0.004)
    motor_current_per_velocity_a: tuple[float, ...] = (0.30, 0.40, 0.30, 0.10)
    motor_gravity_current_a_per_m: tuple[float, ...] = (0.0, 4.0, 3.5, 2.0)
    motor_payload_current_a_per_m: tuple[float, ...] = (0.0, 1.0, 1.0, 0.6)
    collision_current_fraction: float = 0.95
    collision_full_depth_m: float = 0.002
    collision_max_penetration_m: float = 0.003
    collision_fault_current_fraction: float = 0.95
    gripper_time_constant_s: float = 0.020
    gripper_free_current_a: float = 0.12
    gripper_current_per_speed_a: float = 2.0
    gripper_contact_stiffness_n_m: float = 20000.0
    gripper_squeeze_gain_a_per_m: float = 100.0
    gripper_grasp_force_min_n: float = 3.0
    gripper_grasp_xy_tolerance_m: float = 0.012
    gripper_grasp_tilt_tolerance_rad: float = 0.30
    object_size_m: float = 0.04
    object_box_min_m: tuple[float, ...] = (0.28, -0.18)
    object_box_max_m: tuple[float, ...] = (0.42, 0.18)
    biases_joint_encoder_offset_rad: tuple[float, ...] = (0.012, -0.008, 0.010, -0.006)
    biases_force_offset_n: float = 0.35
    biases_camera_offset_m: tuple[float, ...] = (0.004, -0.003, 0.002)
    noise_scale: float = 1.0
    noise_channel_scale: Mapping[str, float] = field(default_factory=dict)
    noise_velocity_noise_rad_s: float = 0.001
    faults_weak_close_recoverable: tuple[float, ...] = (0.45, 0.70)
    faults_weak_close_unrecoverable: tuple[float, ...] = (0.80, 1.00)
    faults_noise_multiplier: float = 20.0
    faults_spike_probability: float = 0.05
    faults_link_corrupt_byte_probability: float = 0.01
    faults_spike_amplitude: Mapping[str, float] = field(default_factory=lambda: dict(_SPIKES))
    source: str = ""

    @property
    def tick_s(self) -> float:
        return self.firmware_tick_us * 1e-6

    def replace(self, **changes: Any) -> RigConfig:
        """A copy with some fields changed (CLI overrides such as --tick-us)."""
        return dataclasses.replace(self, **changes)

    def check(self, robot: RobotDescription) -> RigConfig:
        """Validate the per-joint arrays against `robot`; returns self."""
        n = robot.n_joints
        for name in ("motor_accel_max_rad_s2", "motor_current_per_accel_a",
                     "motor_current_per_velocity_a", "motor_gravity_current_a_per_m",
                     "motor_payload_current_a_per_m", "biases_joint_encoder_offset_rad"):
            v = getattr(self, name)
            if len(v) != n:
                raise ConfigError(_key(name), list(v), f"needs {n} values (one per joint of "
                                  f"{robot.name})", self.source)
        names = {s.name for s in robot.sensors}
        for name in ("noise_channel_scale", "faults_spike_amplitude"):
            unknown = sorted(set(getattr(self, name)) - names)
            if unknown:
                raise ConfigError(f"{_key(name)}.{unknown[0]}", getattr(self, name)[unknown[0]],
                                  f"no such sensor channel in {robot.name}", self.source)
        if self.firmware_tick_us < 100:
            raise ConfigError("firmware.tick_us", self.firmware_tick_us, "must be >= 100",
                              self.source)
        return self


def _key(field_name: str) -> str:
    table, _, key = field_name.partition("_")
    return f"{table}.{key}"


_FIELDS = {f.name: f for f in dataclasses.fields(RigConfig) if f.name != "source"}
_TABLES = {"firmware", "motor", "collision", "gripper", "object", "biases", "noise", "faults"}


def _convert(key: str, default: Any, v: Any, source: str) -> Any:
    def bad(why: str) -> ConfigError:
        return ConfigError(key, v, why, source)

    if isinstance(default, bool):
        if not isinstance(v, bool):
            raise bad("must be true or false")
        return v
    if isinstance(default, int):
        if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
            raise bad("must be a positive integer")
        return v
    if isinstance(default, float):
        if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
            raise bad("must be a finite number")
        if v < 0:
            raise bad("must be >= 0")
        return float(v)
    if isinstance(default, str):
        if not isinstance(v, str) or not v:
            raise bad("must be a non-empty string")
        return v
    if isinstance(default, tuple):
        if (not isinstance(v, list) or not v
                or not all(isinstance(x, int | float) and not isinstance(x, bool) for x in v)
                or not all(math.isfinite(x) for x in v)):
            raise bad("must be a list of finite numbers")
        return tuple(float(x) for x in v)
    if isinstance(default, Mapping):
        if not isinstance(v, Mapping) or not all(
                isinstance(x, int | float) and not isinstance(x, bool) and x >= 0
                for x in v.values()):
            raise bad("must be a table of numbers >= 0")
        return {**default, **{str(k): float(x) for k, x in v.items()}}
    raise bad("unsupported setting")  # pragma: no cover


def parse_rig(data: Mapping[str, Any], source: str = "") -> RigConfig:
    """Validate a parsed rig table (unknown keys are errors: a typo must not go unnoticed)."""
    if data.get("schema_version") != RIG_SCHEMA_VERSION:
        raise ConfigError("schema_version", data.get("schema_version"),
                          f"this rig reads version {RIG_SCHEMA_VERSION}", source)
    base = RigConfig()
    values: dict[str, Any] = {"source": source}
    for table, body in data.items():
        if table == "schema_version":
            continue
        if table not in _TABLES or not isinstance(body, Mapping):
            raise ConfigError(table, body, "unknown table", source)
        for k, v in body.items():
            name = f"{table}_{k}"
            if name not in _FIELDS:
                raise ConfigError(f"{table}.{k}", v, "unknown key", source)
            values[name] = _convert(f"{table}.{k}", getattr(base, name), v, source)
    rig = dataclasses.replace(base, **values)
    for rng in ("faults_weak_close_recoverable", "faults_weak_close_unrecoverable"):
        lo_hi = getattr(rig, rng)
        if len(lo_hi) != 2 or not 0.0 <= lo_hi[0] <= lo_hi[1] <= 1.0:
            raise ConfigError(_key(rng), list(lo_hi), "must be [lo, hi] with 0 <= lo <= hi <= 1",
                              source)
    if len(rig.object_box_min_m) != 2 or len(rig.object_box_max_m) != 2:
        raise ConfigError("object.box_min_m", list(rig.object_box_min_m), "must be [x, y]", source)
    if len(rig.biases_camera_offset_m) != 3:
        raise ConfigError("biases.camera_offset_m", list(rig.biases_camera_offset_m),
                          "must be [x, y, z]", source)
    return rig


def load_rig(path: str | Path | None, robot: RobotDescription | None = None) -> RigConfig:
    """Read a rig file (None: configs/rig/default.toml, or the identical built-in defaults where
    the repository's configs/ is not installed), checked against `robot` when given."""
    if path is None and not DEFAULT_RIG.exists():
        return RigConfig().check(robot) if robot is not None else RigConfig()
    p = Path(path) if path is not None else DEFAULT_RIG
    try:
        data = tomllib.loads(p.read_text(encoding="utf-8"))
    except FileNotFoundError as exc:
        raise ConfigError("rig", str(p), "file not found") from exc
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError("rig", str(p), f"not valid TOML: {exc}") from exc
    rig = parse_rig(data, str(p))
    return rig.check(robot) if robot is not None else rig

"""hil.bench_degraded's single faults (`FAULTS`) and the rig a spike storm needs."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

RIG_DEFAULT = Path(__file__).resolve().parents[1] / "configs" / "rig" / "default.toml"


@dataclass(frozen=True, slots=True)
class Fault:
    """One single fault of the benchmark: what `failure.inject` gets, and the mode expected."""

    name: str
    target: str  # a failure.inject target; "broker" = stop the private Mosquitto
    mode: str
    duration_s: float
    severity: float | None = None
    expect: tuple[str, str] | None = None  # (mode, subject) a degraded event should carry
    stop: str | None = None  # not degradable: the protective stop (cause) that is the answer


FAULTS: dict[str, Fault] = {f.name: f for f in (
    # inside the channel's bound (robot description predict_max_s: 1.0 s and 0.5 s)
    Fault("camera", "sensor:object_pose", "dropout", 0.5,
          expect=("sensor_predicted", "object_pose")),
    Fault("wrist_force", "sensor:wrist_force", "dropout", 0.3,
          expect=("sensor_predicted", "wrist_force")),
    # not degradable: the repeats are refused, the encoders lost past their 10 ms bound
    Fault("stuck_encoder", "sensor:joint_encoders", "stuck", 0.5,
          expect=("sensor_predicted", "joint_encoders"), stop="sensor_bound"),
    # ±outliers in --spike-probability of the samples (the shipped rig's 0.05 is no storm)
    Fault("spikes", "sensor:wrist_force", "spikes", 2.0, severity=1.0,
          expect=("sensor_filtered", "wrist_force")),
    Fault("gpu", "gpu", "fail", 3.0, expect=("cpu_inference", "")),
    Fault("triton", "triton", "down", 3.0, expect=("remote_policy_lost", "")),
    Fault("broker", "broker", "stop", 3.0, expect=("broker_lost", "")),
)}


def storm_rig_config(dest: Path, spike_probability: float) -> Path:
    """configs/rig/default.toml with `spike_probability` changed (the shipped 0.05 is under any
    description's max_ratio: no storm), written to `dest` for `sim.rig_config`."""
    rig = RIG_DEFAULT.read_text(encoding="utf-8")
    storm, n = re.subn(r"(?m)^spike_probability = [0-9.]+",
                       f"spike_probability = {spike_probability}", rig)
    if n != 1:
        raise ValueError(f"{RIG_DEFAULT}: no spike_probability line to change")
    dest.write_text(storm, encoding="utf-8")
    return dest

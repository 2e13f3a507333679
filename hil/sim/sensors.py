"""What the sensors report: true value + hidden bias + noise, then any injected sensor fault.

Pure: values in, values out, with the rig's seeded random streams. A channel in dropout reports
None — the firmware turns that into NaN fields in STATUS or `valid=0` in a SENSOR frame. The
camera (`object_pose`) samples on its own rate grid and delivers each sample `latency_s` later,
stamped with the sample's time (docs/PROTOCOL.md §2, SENSOR).
"""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Sequence

from edge_agent.robot import RobotDescription, SensorChannel
from hil.sim.config import RigConfig

DROPOUT, STUCK, NOISE, SPIKES = "dropout", "stuck", "noise", "spikes"
SENSOR_FAULT_MODES = (DROPOUT, STUCK, NOISE, SPIKES)


class SensorModel:
    """Bias, noise and fault shaping for every channel of the robot description."""

    def __init__(self, robot: RobotDescription, rig: RigConfig, noise_rng: random.Random,
                 fault_rng: random.Random) -> None:
        self.rng = noise_rng
        self.fault_rng = fault_rng
        self.normals = Normals(noise_rng)
        self.std: dict[str, float] = {
            s.name: s.noise_std * rig.noise_scale * rig.noise_channel_scale.get(s.name, 1.0)
            for s in robot.sensors}
        self.bias: dict[str, tuple[float, ...]] = {
            "joint_encoders": rig.biases_joint_encoder_offset_rad,
            "wrist_force": (rig.biases_force_offset_n,),
            "object_pose": rig.biases_camera_offset_m,
        }
        self.vel_std = rig.noise_velocity_noise_rad_s * rig.noise_scale
        self.noise_mult = rig.faults_noise_multiplier
        self.spike_p = rig.faults_spike_probability
        self.spike_amp = dict(rig.faults_spike_amplitude)
        # channel -> (mode, severity); the firmware mirrors the fault engine's view here each tick
        self.faults: dict[str, tuple[str, float]] = {}
        # channel -> its last reported value (what a STUCK fault repeats); the fast STATUS path
        # (status.py) writes it too
        self.last_reported: dict[str, tuple[float, ...] | None] = {}

    def shape(self, name: str, true: Sequence[float]) -> tuple[float, ...] | None:
        """The reported value of channel `name` given its true value (None: no sample)."""
        std = self.std.get(name, 0.0)
        bias = self.bias.get(name)
        tab, k = self.normals.tab, self.normals.take(len(true))
        if bias is None:
            out = tuple([v + std * tab[k + j] for j, v in enumerate(true)])
        else:
            out = tuple([v + b + std * tab[k + j]
                         for j, (v, b) in enumerate(zip(true, bias, strict=False))])
        fault = self.faults.get(name) if self.faults else None
        if fault is None:
            self.last_reported[name] = out
            return out
        mode, severity = fault
        if mode == DROPOUT:
            return None
        if mode == STUCK:
            return self.last_reported.get(name)
        frng = self.fault_rng
        if mode == NOISE:
            extra = self.noise_mult * severity * max(std, 1e-4)
            out = tuple(v + frng.gauss(0.0, extra) for v in out)
        elif mode == SPIKES and frng.random() < self.spike_p * severity:
            i = frng.randrange(len(out))
            amp = self.spike_amp.get(name, 10.0 * max(std, 1e-3))
            out = (*out[:i], out[i] + frng.choice((-amp, amp)), *out[i + 1 :])
        self.last_reported[name] = out
        return out

    def velocity(self, dq: Sequence[float]) -> tuple[float, ...] | None:
        """Reported joint velocities: they come from the encoders and share their faults."""
        fault = self.faults.get("joint_encoders") if self.faults else None
        if fault is not None and fault[0] == DROPOUT:
            return None
        if fault is not None and fault[0] == STUCK:
            return tuple(0.0 for _ in dq)
        tab, k, std = self.normals.tab, self.normals.take(len(dq)), self.vel_std
        return tuple([v + std * tab[k + j] for j, v in enumerate(dq)])


class Normals:
    """Standard normal samples drawn once from the seeded stream and used in turn, restarting at
    a random offset when used up: ~10x cheaper per sample than random.gauss, still seeded."""

    SIZE = 1 << 14

    def __init__(self, rng: random.Random) -> None:
        import numpy as np  # only here: one vectorised draw, then plain floats

        self.rng = rng
        self.tab: list[float] = np.random.default_rng(rng.getrandbits(64)).standard_normal(
            self.SIZE + 64).tolist()
        self.i = 0

    def take(self, n: int) -> int:
        """Index of `n` fresh samples in `tab`."""
        i = self.i
        if i + n > self.SIZE:
            i = self.rng.randrange(self.SIZE // 2)
        self.i = i + n
        return i

    def gauss(self, std: float) -> float:
        return std * self.tab[self.take(1)]


class Camera:
    """A frame channel sampled on its rate grid and delivered `latency_s` after the sample."""

    def __init__(self, channel: SensorChannel, channel_id: int) -> None:
        self.channel = channel
        self.channel_id = channel_id
        self.period_us = max(1, round(1e6 / channel.rate_hz))
        self.latency_us = round(channel.latency_s * 1e6)
        self.next_sample_us = 0
        self.pending: deque[tuple[int, int, tuple[float, ...] | None]] = deque()

    def sample_due(self, t_us: int) -> bool:
        if t_us < self.next_sample_us:
            return False
        self.next_sample_us += self.period_us * (1 + (t_us - self.next_sample_us)
                                                 // self.period_us)
        return True

    def push(self, t_us: int, value: tuple[float, ...] | None) -> None:
        self.pending.append((t_us + self.latency_us, t_us, value))

    def deliverable(self, t_us: int) -> list[tuple[int, tuple[float, ...] | None]]:
        """Samples whose latency has passed at `t_us`: (sample time, value or None)."""
        out = []
        pending = self.pending
        while pending and pending[0][0] <= t_us:
            _, ts, v = pending.popleft()
            out.append((ts, v))
        return out

"""Rest calibration, pure: sensor offsets, the link's round trip and the firmware clock's offset.

Samples in, estimates out — no I/O, no clock: the daemon's runner (`calibration_run.py`) feeds it
from the link, the lock-step tests feed it from the simulated firmware. What the daemon can
honestly observe with the robot at rest, and what it cannot:

- **Firmware clock offset and link round trip** — always. PING(host µs) → PONG(host µs, firmware
  µs at reception) received at host µs: `rtt = t_recv - t_send`, `offset = t_fw - (t_send +
  t_recv) / 2` (NTP with T2 = T3). Whatever the one-way delays, the true offset lies within
  ±rtt/2 of each exchange's value. The estimate is the centre of the intersection of those
  intervals — min-RTT filtering in its exact form: the fastest exchanges set it — and
  `bound_us`, its half-width, holds for sure (never more than the fastest rtt / 2). If stamping
  jitter makes the intervals disagree, the median of the fastest quarter is used instead.
  Valid when taken: a real firmware clock drifts (ppm).
- **Wrist force sensor offset** — when nothing is held: the gripper at least `min_open_fraction`
  of its stroke open and the mean reading within `max_force_offset_n` (a held part is squeezed
  with ≥ 3 N). The reading is then offset + noise.
- **Joint encoder offsets** — only against a known pose. The firmware powers up at the
  description's home pose, so `mean(q) - home` is the offset *if the arm has not moved since*:
  refused when any joint is further than `max_encoder_offset_rad` from home, but a true
  displacement below that bound cannot be told from an offset. Published, not applied by
  default (the firmware servos in encoder coordinates: a caller applying them must also add them
  back to its commands).
- **Camera (object pose) offset** — only against an object at a known pose (a calibration
  fixture, `object_reference`). Nothing in the robot description pins an object down at rest.
- Not observable at rest: the motor's transport delay and servo dynamics (they need motion).

The encoder and force estimates need the arm at rest over the whole window (joint speeds and
the q span below `rest_velocity_rad_s` / `rest_span_rad`); otherwise both are refused, with the
reason. Every refusal is a value (`Estimate.reason`), never an exception.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from edge_agent.link.codec import Status
from edge_agent.robot import RobotDescription

NOT_AT_REST = "the arm was moving during the window"


@dataclass(frozen=True, slots=True)
class CalibrationLimits:
    """What counts as at rest, open, plausible; how much data is enough."""

    rest_velocity_rad_s: float = 0.01
    rest_span_rad: float = 0.002
    max_encoder_offset_rad: float = 0.05
    max_force_offset_n: float = 2.0
    min_open_fraction: float = 0.75
    max_camera_offset_m: float = 0.03
    min_status_samples: int = 50
    min_camera_samples: int = 10
    min_exchanges: int = 3
    max_samples: int = 20_000


@dataclass(frozen=True, slots=True)
class Estimate:
    """One channel's offset (None when refused: `reason` says why), its standard error, n."""

    value: tuple[float, ...] | None
    stderr: tuple[float, ...] = ()
    samples: int = 0
    reason: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return {"value": None if self.value is None else [round(v, 7) for v in self.value],
                "stderr": [round(v, 8) for v in self.stderr], "samples": self.samples,
                "reason": self.reason}


@dataclass(frozen=True, slots=True)
class ClockEstimate:
    """Firmware clock minus host clock (µs), sure within ±bound_us; the link's round trips."""

    offset_us: float
    bound_us: float
    rtt_min_us: float
    rtt_median_us: float
    rtt_max_us: float
    exchanges: int
    used: int

    def fw_to_host_us(self, fw_us: float) -> float:
        return fw_us - self.offset_us

    def as_dict(self) -> dict[str, Any]:
        return {"offset_us": round(self.offset_us, 1), "bound_us": round(self.bound_us, 1),
                "rtt_min_ms": round(self.rtt_min_us / 1e3, 4),
                "rtt_median_ms": round(self.rtt_median_us / 1e3, 4),
                "rtt_max_ms": round(self.rtt_max_us / 1e3, 4),
                "exchanges": self.exchanges, "used": self.used}


@dataclass(frozen=True, slots=True)
class CalibrationResult:
    at_rest: bool
    joint_encoders: Estimate
    wrist_force: Estimate
    object_pose: Estimate
    clock: ClockEstimate | None
    clock_reason: str | None
    status_samples: int

    def offsets(self, channels: Iterable[str]) -> dict[str, tuple[float, ...]]:
        """The estimated offsets of `channels` (those refused are left out), for
        `SensorHub.set_calibration`."""
        out = {}
        for name in channels:
            est = getattr(self, name, None)
            if isinstance(est, Estimate) and est.value is not None:
                out[name] = est.value
        return out

    def as_dict(self) -> dict[str, Any]:
        return {"at_rest": self.at_rest, "status_samples": self.status_samples,
                "joint_encoders": self.joint_encoders.as_dict(),
                "wrist_force": self.wrist_force.as_dict(),
                "object_pose": self.object_pose.as_dict(),
                "clock": None if self.clock is None else self.clock.as_dict(),
                "clock_reason": self.clock_reason}


def _mean_se(rows: Sequence[Sequence[float]]) -> tuple[tuple[float, ...], tuple[float, ...]]:
    n = len(rows)
    means, ses = [], []
    for col in zip(*rows, strict=True):
        m = math.fsum(col) / n
        var = math.fsum((x - m) ** 2 for x in col) / (n - 1) if n > 1 else 0.0
        means.append(m)
        ses.append(math.sqrt(var / n))
    return tuple(means), tuple(ses)


def estimate_clock(exchanges: Sequence[tuple[int, int, int]], min_exchanges: int = 3,
                   keep_fraction: float = 0.25) -> ClockEstimate | None:
    """(t_send_us, t_fw_us, t_recv_us) per PING/PONG → the offset; None with too few."""
    good = sorted(((r - s, f - (s + r) / 2.0) for s, f, r in exchanges if r >= s),
                  key=lambda x: x[0])
    if len(good) < max(1, min_exchanges):
        return None
    used = good[: max(1, math.ceil(len(good) * keep_fraction))]
    offs = sorted(o for _, o in used)
    mid = len(offs) // 2
    est = offs[mid] if len(offs) % 2 else (offs[mid - 1] + offs[mid]) / 2.0
    lo = max(o - r / 2.0 for r, o in good)
    hi = min(o + r / 2.0 for r, o in good)
    if lo <= hi:  # every exchange agrees: the truth is in [lo, hi]; its centre is minimax
        est, bound, n_used = (lo + hi) / 2.0, (hi - lo) / 2.0, len(good)
    else:  # timestamps inconsistent (jitter in stamping): the fastest exchange's own bound
        bound, n_used = min(abs(est - o) + r / 2.0 for r, o in used), len(used)
    rtts = [r for r, _ in good]
    return ClockEstimate(est, bound, rtts[0], float(rtts[len(rtts) // 2]), rtts[-1],
                         len(good), n_used)


class RestCalibrator:
    """Accumulates one window of samples; `result()` turns them into estimates."""

    def __init__(self, robot: RobotDescription, limits: CalibrationLimits | None = None) -> None:
        self.robot = robot
        self.limits = limits or CalibrationLimits()
        self._q: list[tuple[float, ...]] = []
        self._dq: list[tuple[float, ...]] = []
        self._force: list[tuple[float]] = []
        self._grip: list[float] = []
        self._camera: list[tuple[float, ...]] = []
        self._exchanges: list[tuple[int, int, int]] = []
        self._last_status_fw: int | None = None
        self._last_camera_fw: float | None = None

    def add_status(self, st: Status) -> bool:
        """One STATUS frame (repeats and samples with a dropped channel are skipped)."""
        if st.fw_time_us == self._last_status_fw or len(self._q) >= self.limits.max_samples:
            return False
        self._last_status_fw = st.fw_time_us
        vals = (*st.q, *st.dq, st.gripper_pos, st.gripper_force)
        n = self.robot.n_joints
        if len(st.q) != n or len(st.dq) != n or not all(math.isfinite(v) for v in vals):
            return False
        self._q.append(tuple(st.q))
        self._dq.append(tuple(st.dq))
        self._force.append((st.gripper_force,))
        self._grip.append(st.gripper_pos)
        return True

    def add_object_pose(self, value: Sequence[float], t_fw: float) -> bool:
        """One camera sample of the object's position (repeats by sample time skipped)."""
        if t_fw == self._last_camera_fw or len(value) != 3 or len(self._camera) >= \
                self.limits.max_samples or not all(math.isfinite(v) for v in value):
            return False
        self._last_camera_fw = t_fw
        self._camera.append(tuple(float(v) for v in value))
        return True

    def add_exchange(self, t_send_us: int, t_fw_us: int, t_recv_us: int) -> None:
        """One PING/PONG: host µs when sent, firmware µs at reception, host µs when answered."""
        self._exchanges.append((t_send_us, t_fw_us, t_recv_us))

    @property
    def status_samples(self) -> int:
        return len(self._q)

    def at_rest(self) -> bool:
        if len(self._q) < self.limits.min_status_samples:
            return False
        lim = self.limits
        dq_mean, _ = _mean_se(self._dq)
        spans = [max(c) - min(c) for c in zip(*self._q, strict=True)]
        return (all(abs(v) <= lim.rest_velocity_rad_s for v in dq_mean)
                and all(s <= lim.rest_span_rad for s in spans))

    def result(self, *, reference_q: Sequence[float] | None = None,
               object_reference: Sequence[float] | None = None) -> CalibrationResult:
        """Estimates from everything added; `reference_q` defaults to the home pose."""
        lim = self.limits
        ref_q = tuple(reference_q) if reference_q is not None else self.robot.home
        rest = self.at_rest()
        n = len(self._q)
        if n < lim.min_status_samples:
            why = f"{n} status samples (< {lim.min_status_samples})"
            enc = force = Estimate(None, samples=n, reason=why)
        elif not rest:
            enc = force = Estimate(None, samples=n, reason=NOT_AT_REST)
        else:
            enc = self._encoders(ref_q)
            force = self._wrist_force()
        cam = self._object_pose(object_reference)
        clock = estimate_clock(self._exchanges, lim.min_exchanges)
        why_clock = None if clock is not None else (
            f"{len(self._exchanges)} PING/PONG exchanges (< {lim.min_exchanges})")
        return CalibrationResult(rest, enc, force, cam, clock, why_clock, n)

    def _encoders(self, ref_q: Sequence[float]) -> Estimate:
        mean, se = _mean_se(self._q)
        off = tuple(m - r for m, r in zip(mean, ref_q, strict=True))
        worst = max(abs(o) for o in off)
        if worst > self.limits.max_encoder_offset_rad:
            return Estimate(None, samples=len(self._q), reason=(
                f"not at the reference pose: a joint reads {worst:.4f} rad from it (> "
                f"{self.limits.max_encoder_offset_rad} rad)"))
        return Estimate(off, se, len(self._q), "assumes the arm is at its power-up (home) "
                                               "pose; not applied by default")

    def _wrist_force(self) -> Estimate:
        lim, g = self.limits, self.robot.gripper
        opening = math.fsum(self._grip) / len(self._grip)
        if opening < lim.min_open_fraction * g.stroke_max_m:
            return Estimate(None, samples=len(self._force), reason=(
                f"gripper open {opening:.4f} m (< {lim.min_open_fraction:g} of the stroke): "
                "contact cannot be ruled out"))
        mean, se = _mean_se(self._force)
        if abs(mean[0]) > lim.max_force_offset_n:
            return Estimate(None, samples=len(self._force), reason=(
                f"reads {mean[0]:.3f} N at rest (> {lim.max_force_offset_n} N): a load, not "
                "an offset"))
        return Estimate(mean, se, len(self._force))

    def _object_pose(self, ref: Sequence[float] | None) -> Estimate:
        n = len(self._camera)
        if ref is None:
            return Estimate(None, samples=n, reason="no reference object pose: not observable "
                                                    "at rest")
        if n < self.limits.min_camera_samples:
            return Estimate(None, samples=n, reason=f"{n} camera samples (< "
                                                    f"{self.limits.min_camera_samples})")
        mean, se = _mean_se(self._camera)
        off = tuple(m - r for m, r in zip(mean, ref, strict=True))
        if max(abs(o) for o in off) > self.limits.max_camera_offset_m:
            return Estimate(None, samples=n, reason="the object is not at the reference pose")
        return Estimate(off, se, n)

"""Watchers the executor runs every tick: joint-current collision detection, the sensor ring buffer.

`CollisionMonitor`: a joint collides when its current stays above `factor` × its expected current,
or at its description's `current_max_a`, for `persist_s`. The expected current is learned
online (a slow low-pass of |current| — gravity and friction change slowly with the pose), never
below `floor_fraction` × current_max_a, and frozen while the joint is over the threshold, so a
pushing contact cannot raise its own bar. `SensorRing`: the last N seconds of measurements at a
low rate, the raw samples for the fault record of `diagnostic` and the stop reports.
`ObjectEstimate`: the camera's object pose, and whether the object has been seen at rest since
a given time (the re-grasp guard).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence
from itertools import repeat
from typing import Any

from edge_agent.executor.controllers import Measured
from edge_agent.robot import RobotDescription


class CollisionMonitor:
    """Current-threshold collision detection, pure (`update` takes now and dt)."""

    def __init__(self, robot: RobotDescription, factor: float = 1.5,
                 floor_fraction: float = 0.3, tau_s: float = 0.5, persist_s: float = 0.02,
                 max_fraction: float = 0.98) -> None:
        self.factor = factor
        self.tau_s = max(tau_s, 1e-6)
        self.persist_s = persist_s
        self.imax = tuple(j.current_max_a for j in robot.joints)
        self.hard = tuple(max_fraction * i for i in self.imax)
        self.floor = tuple(floor_fraction * i for i in self.imax)
        self.baseline = list(self.floor)
        self._since: list[float | None] = [None] * len(self.imax)
        self.last_trip: dict[str, Any] | None = None

    def reset(self) -> None:
        """Forget the learned baseline (after the drives were off)."""
        self.baseline = list(self.floor)
        self._since = [None] * len(self.imax)

    def update(self, now: float, current: Sequence[float], dt: float) -> int | None:
        """Feed one tick of joint currents; the index of a colliding joint, or None."""
        k = min(1.0, dt / self.tau_s) if dt > 0 else 0.0
        hit: int | None = None
        for i, c in enumerate(current):
            a = abs(c)
            if a != a:  # NaN: no reading this tick, nothing learned
                continue
            base = self.baseline[i]
            expected = base if base > self.floor[i] else self.floor[i]
            if a > self.factor * expected or a >= self.hard[i]:
                since = self._since[i]
                if since is None:
                    self._since[i] = since = now
                if now - since >= self.persist_s and hit is None:
                    hit = i
                    self.last_trip = {"joint": i, "current_a": round(c, 3),
                                      "expected_a": round(expected, 3),
                                      "limit_a": self.imax[i]}
            else:
                self._since[i] = None
                self.baseline[i] = base + (a - base) * k
        return hit


class SensorRing:
    """The last `window_s` seconds of measurements, sampled at `sample_hz`."""

    def __init__(self, window_s: float = 5.0, sample_hz: float = 50.0) -> None:
        self.period = 1.0 / sample_hz
        self.window_s = window_s
        self._buf: deque[tuple[float, Measured]] = deque(maxlen=max(2, int(window_s * sample_hz)))
        self._last = -math.inf

    def add(self, now: float, m: Measured) -> None:
        if now - self._last >= self.period:
            self._buf.append((now, m))
            self._last = now

    def __len__(self) -> int:
        return len(self._buf)

    def snapshot(self) -> tuple[tuple[float, Measured], ...]:
        """The kept samples as they are (a pointer copy: cheap enough for any thread that
        holds the executor lock, e.g. a stop listener); `window_of` turns it into plain data."""
        return tuple(self._buf)

    def window(self) -> dict[str, Any]:
        """Every kept sample, as the raw values (the fault record's sensor window)."""
        return window_of(tuple(self._buf), 1.0 / self.period)


WINDOW_FORMAT = 1


def window_of(samples: Sequence[tuple[float, Measured]], sample_hz: float) -> dict[str, Any]:
    """Samples as a table: `columns` (t_s, q<i>_rad, current<i>_a, gripper_pos_m,
    gripper_force_n) and one row per sample — the raw measurements, not a summary."""
    n = len(samples[0][1].q) if samples else 0
    columns = (["t_s"] + [f"q{i}_rad" for i in range(n)] + [f"current{i}_a" for i in range(n)]
               + ["gripper_pos_m", "gripper_force_n"])
    r5, r3 = repeat(5), repeat(3)  # map() rounds in C: ~25 % less than generators
    rows = [[round(t, 4), *map(round, m.q, r5), *map(round, m.current, r3),
             round(m.gripper_pos, 5), round(m.gripper_force, 3)] for t, m in samples]
    return {"format": WINDOW_FORMAT, "samples": len(rows), "sample_hz": sample_hz,
            "columns": columns, "rows": rows}


class ObjectEstimate:
    """Mean of the last distinct camera samples of the object pose; restarts when it moves.

    It also keeps when each sample arrived (host time), so `at_rest` can say whether the object
    was seen lying still since some moment, from samples taken after it only.
    """

    def __init__(self, max_samples: int = 30, jump_m: float = 0.02) -> None:
        self.jump_m = jump_m
        self._buf: deque[tuple[float, float, float]] = deque(maxlen=max_samples)
        self._arrived: deque[tuple[float, tuple[float, float, float]]] = deque(
            maxlen=max_samples)
        self._last_t: float | None = None
        self._sum = [0.0, 0.0, 0.0]
        # The hub's Kalman-predicted pose while the camera is lost inside its bound (the
        # executor's tick sets it, None otherwise): `current()` prefers it to the mean.
        self.predicted: Sequence[float] | None = None

    def add(self, pose: Sequence[float], sample_t: float, arrived_t: float = math.nan) -> None:
        """One camera sample, its (firmware) sample time and its (host) arrival time; repeats
        of a sample are ignored."""
        if len(pose) < 3 or sample_t == self._last_t:
            return  # the same sample again (the camera is slower than the loop)
        p = (float(pose[0]), float(pose[1]), float(pose[2]))
        if not all(math.isfinite(v) for v in p):
            return
        self._last_t = sample_t
        self._arrived.append((arrived_t, p))
        mean = self.estimate()
        if mean is not None and math.dist(mean, p) > self.jump_m:
            self.clear()  # the object moved (or was carried): start over
        buf = self._buf
        if len(buf) == buf.maxlen:
            old = buf[0]
            self._sum = [s - o for s, o in zip(self._sum, old, strict=True)]
        buf.append(p)
        self._sum = [s + v for s, v in zip(self._sum, p, strict=True)]

    def clear(self) -> None:
        self._buf.clear()
        self._sum = [0.0, 0.0, 0.0]

    @property
    def samples(self) -> int:
        return len(self._buf)

    def estimate(self) -> tuple[float, float, float] | None:
        n = len(self._buf)
        if n == 0:
            return None
        return (self._sum[0] / n, self._sum[1] / n, self._sum[2] / n)

    def current(self) -> tuple[float, float, float] | None:
        """The pose now: the predicted one during a camera dropout inside its bound, else the
        mean of the last distinct samples."""
        p = self.predicted
        if p is not None and len(p) >= 3 and all(math.isfinite(v) for v in p[:3]):
            return (float(p[0]), float(p[1]), float(p[2]))
        return self.estimate()

    def last_arrival(self) -> float | None:
        """Host time the newest distinct sample arrived (None before the first)."""
        return self._arrived[-1][0] if self._arrived else None

    def at_rest(self, since: float, min_samples: int, tol_m: float
                ) -> tuple[float, float, float] | None:
        """The mean of the newest `min_samples` samples, when all of them arrived after `since`
        and every one lies within `tol_m` of that mean (the object is still); None otherwise."""
        pts = [p for t, p in self._arrived if t > since][-max(1, min_samples):]
        if len(pts) < max(1, min_samples):
            return None  # too few samples since `since`
        n = len(pts)
        mean = (sum(p[0] for p in pts) / n, sum(p[1] for p in pts) / n,
                sum(p[2] for p in pts) / n)
        if any(math.dist(p, mean) > tol_m for p in pts):
            return None
        return mean

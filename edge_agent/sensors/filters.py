"""Robust filters for sensor samples: a Hampel spike filter and a running median, pure Python.

The spike test compares a sample with the median of the samples before it and rejects it when it
lies more than k robust standard deviations away (1.4826 * MAD estimates sigma for Gaussian
noise), or more than a floor when the window is flat. The window holds the *raw* samples, the
rejected ones too: an isolated spike is dropped, while a genuine step is accepted once it fills
half the window (a step costs about window/2 samples of delay).

A stuck test (`StuckGate`): a channel with noise never repeats a sample bit for bit, so the
description's `stuck_samples` in a row the same, at advancing firmware times, are a sensor that
stopped measuring; they are refused until the value moves.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Sequence

from edge_agent.robot import RobotDescription

MAD_TO_SIGMA = 1.4826
STORM_WINDOW_FACTOR = 3  # `SpikeFilter.median`'s window, in spike-filter windows


def median(values: Sequence[float]) -> float:
    """The median of a non-empty sequence."""
    s = sorted(values)
    n = len(s)
    if n == 0:
        raise ValueError("median of an empty sequence")
    mid = n // 2
    return s[mid] if n % 2 else 0.5 * (s[mid - 1] + s[mid])


def mad(values: Sequence[float], center: float | None = None) -> float:
    """Median absolute deviation from `center` (default: the median)."""
    c = median(values) if center is None else center
    return median([abs(v - c) for v in values])


def is_spike(window: Sequence[float], value: float, k: float, floor: float = 0.0) -> bool:
    """True when value is further than max(k * sigma_robust, floor) from the window's median."""
    m = median(window)
    return abs(value - m) > max(k * MAD_TO_SIGMA * mad(window, m), floor)


def median_filter(values: Sequence[float], window: int) -> list[float]:
    """Causal running median: each output is the median of up to `window` samples ending there."""
    if window < 1:
        raise ValueError(f"window must be >= 1, got {window}")
    return [median(values[max(0, i + 1 - window):i + 1]) for i in range(len(values))]


class SpikeFilter:
    """Stateful spike test for a vector channel: `accept(sample)` says whether to use it."""

    def __init__(self, dim: int, *, window: int = 7, k: float = 5.0, floor: float = 0.0,
                 min_samples: int = 5) -> None:
        if dim < 1 or window < 3 or not 3 <= min_samples <= window or k <= 0 or floor < 0:
            raise ValueError("SpikeFilter needs dim >= 1, 3 <= min_samples <= window, k > 0, "
                             "floor >= 0")
        self.dim = dim
        self.k = k
        self.floor = floor
        self.min_samples = min_samples
        self.window = window
        self._window: deque[tuple[float, ...]] = deque(maxlen=window)
        self._long: deque[tuple[float, ...]] = deque(maxlen=STORM_WINDOW_FACTOR * window)
        self.rejected = 0

    def accept(self, sample: Sequence[float]) -> bool:
        """Test a sample against the ones before it, then remember it; False means a spike."""
        if len(sample) != self.dim:
            raise ValueError(f"expected {self.dim} values, got {len(sample)}")
        ok = True
        window = self._window
        n = len(window)
        if n >= self.min_samples:
            # is_spike per dimension, inlined (the hub runs this at 1 kHz): the same medians,
            # the same threshold max(k * MAD_TO_SIGMA * mad, floor).
            kk, floor = self.k * MAD_TO_SIGMA, self.floor
            mid, odd = n // 2, n % 2
            for d in range(self.dim):
                col = sorted([s[d] for s in window])
                m = col[mid] if odd else 0.5 * (col[mid - 1] + col[mid])
                dev = sorted([abs(v - m) for v in col])
                limit = kk * (dev[mid] if odd else 0.5 * (dev[mid - 1] + dev[mid]))
                if abs(sample[d] - m) > (floor if floor > limit else limit):
                    ok = False
                    break
        t = tuple(sample)
        window.append(t)
        self._long.append(t)
        if not ok:
            self.rejected += 1
        return ok

    def median(self) -> tuple[float, ...]:
        """Per dimension, the median of the last STORM_WINDOW_FACTOR windows of samples (all
        that `accept` saw, spikes too): what a channel in `sensor_filtered` reports. In a dense
        storm of outliers on both sides the Hampel test's MAD grows and lets them through,
        while the median of a wider window stays among the true samples (tests: 30 % outliers,
        a hundredfold fewer wrong values). Call after `accept` (never empty then)."""
        return tuple(median([s[d] for s in self._long]) for d in range(self.dim))

    def reset(self) -> None:
        self._window.clear()
        self._long.clear()


class MedianFilter:
    """Running median of a vector channel over the last `window` samples."""

    def __init__(self, dim: int, window: int = 5) -> None:
        if dim < 1 or window < 1:
            raise ValueError("MedianFilter needs dim >= 1 and window >= 1")
        self.dim = dim
        self._window: deque[tuple[float, ...]] = deque(maxlen=window)

    def update(self, sample: Sequence[float]) -> tuple[float, ...]:
        if len(sample) != self.dim:
            raise ValueError(f"expected {self.dim} values, got {len(sample)}")
        self._window.append(tuple(sample))
        return tuple(median([s[d] for s in self._window]) for d in range(self.dim))

    def reset(self) -> None:
        self._window.clear()


class StuckGate:
    """`stuck(sample, t_fw)`: True from the n-th sample in a row equal to the one before it (bit
    for bit, at a later firmware time: a frame seen twice is one sample) until one differs."""

    __slots__ = ("_last", "_n", "_run", "_t")

    def __init__(self, n: int) -> None:
        if n < 2:
            raise ValueError(f"a stuck run needs n >= 2 samples, got {n}")
        self._n = n
        self._last: tuple[float, ...] | None = None
        self._t = -1.0
        self._run = 0

    def stuck(self, sample: tuple[float, ...], t_fw: float) -> bool:
        if sample != self._last:
            self._last, self._t, self._run = sample, t_fw, 1
            return False
        if t_fw > self._t:
            self._t = t_fw
            self._run += 1
        return self._run >= self._n


def stuck_gates(robot: RobotDescription) -> list[StuckGate | None]:
    """One StuckGate per channel of `robot` with `stuck_samples` (None for the others)."""
    return [StuckGate(c.stuck_samples) if c.stuck_samples else None for c in robot.sensors]


def spike_filters(robot: RobotDescription, names: Iterable[str] | None, k: float = 5.0,
                  window: int = 7) -> list[SpikeFilter | None]:
    """One SpikeFilter per channel of `robot` that has one (None for the others): the
    description's `spike_filter` channels, or the channels `names` lists (tests, benches), with
    the channel's own window and k where it has them, else `window` and `k`."""
    wanted = (tuple(c.name for c in robot.sensors if c.spike_window)
              if names is None else tuple(names))
    index = {c.name: i for i, c in enumerate(robot.sensors)}
    out: list[SpikeFilter | None] = [None] * len(robot.sensors)
    for name in wanted:
        if name == "estop_input":
            raise ValueError("the e-stop input is never filtered")
        if name not in index:
            raise ValueError(f"spike filter for unknown channel {name!r}")
        c = robot.sensors[index[name]]
        w, kk = (c.spike_window, c.spike_k) if c.spike_window else (window, k)
        out[index[name]] = SpikeFilter(c.dim, window=w, k=kk, floor=kk * c.noise_std + 1e-9,
                                       min_samples=min(5, w))
    return out


def step_delay_s(f: SpikeFilter | None, rate_hz: float) -> float:
    """How long a genuine step can go unaccepted: about half the filter's window of samples."""
    return (f.window // 2 + 1) / rate_hz if f is not None else 0.0

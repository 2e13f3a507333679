"""The daemon's own health probes: broker, link, control loop, store, start-up work.

Each reads counters other parts keep, through the plain callables it is built with (wiring.py
passes them), and never blocks (the store probe's one write: re-taking a missing snapshot
reserve chunk, a posix_fallocate and an fsync, inside the probe budget); `fails_on(event)` is
each one's event fast path (probe.py EventAware). Counters are compared with the previous run,
so "per window" means "since the last run of this probe" (its period). Only the broker probe and
the store probe have a degradation mode (`broker_lost`, `storage_low`); the others report levels
only: a link fault is a protective stop already, and a late loop or failed start-up work has no
fallback to switch to.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from edge_agent.health.probe import Figure, ProbeResult
from edge_agent.store.reserve import SpaceReserve
from edge_agent.vocab import DegradationMode, EventType

if TYPE_CHECKING:
    from edge_agent.contract.events import Event


class _Base:
    """Name, mode, subject and period as plain attributes (the Probe protocol's properties)."""

    name = ""
    mode: DegradationMode | None = None
    subject = ""

    def __init__(self, period_s: float | None = None) -> None:
        self.period_s = period_s


class _Delta:
    """A counter's growth since the previous reading (its first reading counts from 0)."""

    __slots__ = ("last",)

    def __init__(self) -> None:
        self.last: float | None = None

    def __call__(self, value: float) -> float:
        prev, self.last = self.last, value
        return value - prev if prev is not None else 0.0


class BrokerProbe(_Base):
    """MQTT connected with the command subscription granted; the reports outbox backlog.

    ERROR (a strike toward `broker_lost`) while not ready — except before the first connection
    while no attempt has failed yet (WARN: connecting); WARN when the outbox holds more than
    `backlog_warn` undelivered reports."""

    name = "broker"
    mode: DegradationMode | None = DegradationMode.BROKER_LOST

    def __init__(self, ready: Callable[[], bool], detail: Callable[[], Mapping[str, Any]],
                 backlog: Callable[[], int], *, backlog_warn: int = 20,
                 period_s: float | None = None) -> None:
        super().__init__(period_s)
        self._ready, self._detail, self._backlog = ready, detail, backlog
        self.backlog_warn = backlog_warn

    def check(self, now: float) -> ProbeResult:
        backlog = int(self._backlog())
        if not self._ready():
            d = self._detail()
            why = d.get("error")
            figs: dict[str, Figure] = {"connected": bool(d.get("connected")),
                                       "subscribed": False, "outbox_pending": backlog}
            if why is None and not d.get("connections"):
                # the first connection still in progress, nothing failed yet: not a strike
                return ProbeResult.warn("connecting to the MQTT broker", **figs)
            return ProbeResult.error(f"MQTT broker not usable: {why or 'not connected'}", **figs)
        if backlog > self.backlog_warn:
            return ProbeResult.warn(f"{backlog} reports waiting in the outbox",
                                    connected=True, subscribed=True, outbox_pending=backlog)
        return ProbeResult.ok("connected, commands subscribed", connected=True,
                              subscribed=True, outbox_pending=backlog)

    def fails_on(self, event: Event) -> str | None:
        return "MQTT connection lost" if event.get("type") == EventType.MQTT_DISCONNECTED else None


class LinkProbe(_Base):
    """Frames per second from the guardian, bad frames the firmware reported, guardian alive.

    ERROR: the guardian process is not running, or the serial link is down. WARN: fewer frames
    per second than `min_frames_hz`, or bad frames over `bad_ratio_warn` of the frames received
    in the window. `bad_frames` is the count of the firmware's `bad_frame` events (frames from
    us it could not decode); the guardian's own decoder counters stay in its process."""

    name = "link"

    def __init__(self, frames: Callable[[], int], link_up: Callable[[], bool],
                 guardian_alive: Callable[[], bool], *, min_frames_hz: float,
                 bad_ratio_warn: float = 0.01, period_s: float | None = None) -> None:
        super().__init__(period_s)
        self._frames, self._link_up, self._alive = frames, link_up, guardian_alive
        self.bad_frames = 0  # the firmware's bad_frame events seen (fails_on counts them)
        self.min_frames_hz, self.bad_ratio_warn = min_frames_hz, bad_ratio_warn
        self._dframes, self._dbad = _Delta(), _Delta()
        self._last_at: float | None = None

    def check(self, now: float) -> ProbeResult:
        frames, bad = self._dframes(self._frames()), self._dbad(self.bad_frames)
        window = now - self._last_at if self._last_at is not None else 0.0
        self._last_at = now
        hz = frames / window if window > 0 else None
        ratio = bad / (frames + bad) if frames + bad > 0 else 0.0
        figs: dict[str, Figure] = {
            "frames_hz": None if hz is None else round(hz, 1), "bad_frames": int(bad),
            "bad_ratio": round(ratio, 5), "window_s": round(window, 3)}
        if not self._alive():
            return ProbeResult.error("the link guardian process is not running",
                                     guardian_alive=False, **figs)
        if not self._link_up():
            return ProbeResult.error("the serial link is down", guardian_alive=True,
                                     link_up=False, **figs)
        if hz is not None and hz < self.min_frames_hz:
            return ProbeResult.warn(f"{hz:.0f} frames/s from the guardian (expected at least "
                                    f"{self.min_frames_hz:g})", guardian_alive=True,
                                    link_up=True, **figs)
        if ratio > self.bad_ratio_warn:
            return ProbeResult.warn(f"{bad:.0f} bad frames in {window:.1f} s", guardian_alive=True,
                                    link_up=True, **figs)
        return ProbeResult.ok("link up", guardian_alive=True, link_up=True, **figs)

    def fails_on(self, event: Event) -> str | None:
        t = event.get("type")
        if t == EventType.FIRMWARE_EVENT and event.get("code") == "bad_frame":
            self.bad_frames += 1  # a level (WARN) at the next run, not a failure now
        elif t == EventType.LINK_FAULT:
            return f"link fault: {event.get('cause')}"
        return None


class LoopProbe(_Base):
    """The control loop per window: ticks on time, overruns, missed periods, tick errors, long
    GC pauses. ERROR: no tick for `stall_s` or a tick raised; WARN: a missed period, overruns
    over `overrun_warn` of the ticks, or a collection over 5 ms while tasks may run."""

    name = "loop"

    def __init__(self, stats: Callable[[], Any], gc_long_pauses: Callable[[], int], *,
                 rate_hz: float, stall_s: float = 1.0, overrun_warn: float = 0.01,
                 period_s: float | None = None) -> None:
        super().__init__(period_s)
        self._stats, self._gc = stats, gc_long_pauses
        self.rate_hz, self.stall_s, self.overrun_warn = rate_hz, stall_s, overrun_warn
        self._d = {k: _Delta() for k in ("ticks", "overruns", "missed_periods", "tick_errors",
                                         "gc")}

    def check(self, now: float) -> ProbeResult:
        st = self._stats()
        if st is None:
            return ProbeResult.ok("control loop not started yet")
        d = {k: int(self._d[k](getattr(st, k))) for k in ("ticks", "overruns", "missed_periods",
                                                           "tick_errors")}
        gc_long = int(self._d["gc"](self._gc()))
        since = now - st.last_tick_mono if st.last_tick_mono > 0 else None
        figs: dict[str, Figure] = {**d, "gc_over_5ms": gc_long,
                                   "last_tick_s_ago": None if since is None else round(since, 4),
                                   "max_late_ms": round(st.max_late_s * 1e3, 3)}
        if since is not None and since > self.stall_s:
            return ProbeResult.error(f"no control tick for {since:.2f} s", **figs)
        if d["tick_errors"]:
            return ProbeResult.error(f"{d['tick_errors']} control ticks raised", **figs)
        ratio = d["overruns"] / d["ticks"] if d["ticks"] else 0.0
        if d["missed_periods"] or ratio > self.overrun_warn:
            return ProbeResult.warn(f"{d['missed_periods']} missed periods, {d['overruns']} "
                                    f"late ticks of {d['ticks']}", **figs)
        if gc_long:
            return ProbeResult.warn(f"{gc_long} garbage collections over 5 ms", **figs)
        return ProbeResult.ok("on time", **figs)


class StoreProbe(_Base):
    """Disk free under the state directory, the snapshot reserve, the decision journal's state.

    ERROR (a strike toward `storage_low`): less than `min_free_bytes` free, or the snapshot
    reserve (store/reserve.py) not whole — each run first re-takes the chunks there is room for;
    WARN: less than `warn_free_bytes` free, or the journal turned itself off (journal_disabled:
    a full disk shows in the free space; an I/O error has no storage fallback)."""

    name = "store"
    mode: DegradationMode | None = DegradationMode.STORAGE_LOW

    def __init__(self, state_dir: Path, journal: Callable[[], Mapping[str, Any] | None], *,
                 reserve: SpaceReserve | None = None, warn_free_bytes: int = 512 << 20,
                 min_free_bytes: int = 64 << 20, period_s: float | None = None) -> None:
        super().__init__(period_s)
        self.state_dir, self._journal, self.reserve = state_dir, journal, reserve
        self.warn_free_bytes, self.min_free_bytes = warn_free_bytes, min_free_bytes

    def check(self, now: float) -> ProbeResult:
        held = self.reserve.take() if self.reserve is not None else None
        try:
            st = os.statvfs(self.state_dir)
        except OSError as exc:
            return ProbeResult.error(f"state directory unreadable: {exc}")
        free = st.f_bavail * st.f_frsize
        j = self._journal()
        disabled = j.get("disabled") if j else None
        figs: dict[str, Figure] = {"free_mb": round(free / 1e6, 3),
                                   "min_free_mb": round(self.min_free_bytes / 1e6, 3),
                                   "journal": None if j is None else not disabled,
                                   "journal_disabled": disabled}
        if self.reserve is not None:
            r = self.reserve.status()
            figs.update(reserve_held=held, reserve_chunks=r["chunks"],
                        reserve_lent=r["lent"], reserve_retaken=r["retaken"])
        if free < self.min_free_bytes:
            return ProbeResult.error(f"{free / 1e6:.1f} MB free under {self.state_dir} (under "
                                     f"store.min_free_bytes, {self.min_free_bytes / 1e6:.0f} MB)",
                                     **figs)
        if self.reserve is not None and held is not None and held < self.reserve.chunks:
            return ProbeResult.error(f"the snapshot reserve holds {held} of {self.reserve.chunks}"
                                     f" chunks: {self.reserve.last_error or 'not re-taken'}",
                                     **figs)
        if disabled:
            return ProbeResult.warn(f"the decision journal is off: {disabled}", **figs)
        if free < self.warn_free_bytes:
            return ProbeResult.warn(f"{free / 1e6:.0f} MB free under {self.state_dir}", **figs)
        return ProbeResult.ok(f"{free / 1e9:.1f} GB free", **figs)

    def fails_on(self, event: Event) -> str | None:
        if event.get("type") == EventType.JOURNAL_DISABLED and event.get("cause") == "disk_full":
            return f"the decision journal is off: {event.get('cause')}"
        return None


class StartupProbe(_Base):
    """The start-up work after READY (`status.background`: inference, journal, estimators,
    calibration): ERROR naming each part that failed; OK while it runs and once it succeeded."""

    name = "startup"

    def __init__(self, background: Mapping[str, Any], period_s: float | None = None) -> None:
        super().__init__(period_s)
        self._bg = background

    def check(self, now: float) -> ProbeResult:
        parts = dict(self._bg)  # a copy: the start-up threads add keys
        failed = {k: v for k, v in parts.items()
                  if isinstance(v, Mapping) and v.get("ok") is False}
        figs: dict[str, Figure] = {"done": ",".join(sorted(parts)),
                                   "failed": ",".join(sorted(failed))}
        if failed:
            why = "; ".join(f"{k}: {v.get('error') or v.get('reason') or 'failed'}"
                            for k, v in sorted(failed.items()))
            return ProbeResult.error(f"start-up work failed — {why}", **figs)
        return ProbeResult.ok("start-up work fine" if parts else "start-up work running", **figs)

    def fails_on(self, event: Event) -> str | None:
        if event.get("type") == EventType.CALIBRATION_FAILED:
            return f"calibration failed: {event.get('reason')}"
        return None

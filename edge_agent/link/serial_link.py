"""The serial link: decoded frames from a transport, fault detection, and reopening with backoff.

`SerialLink` does no waiting of its own: its owner select()s on `fileno()` and calls `read(now)`
when readable and `poll(now)` by `next_deadline()`. The link guardian runs it that way in its
single loop; `LinkThread` runs the same loop on a thread for everyone else (tests, tools).

Faults (each reported once per outage through `on_down(cause, detail, now)`):
- `port_lost`: read/write error, hang-up (EIO, end of file, the peer closed the pty);
- `open_failed`: the port cannot be opened (ENOENT, busy, permissions);
- `silent`: no valid frame within `open_timeout_s` of an open, or later `max_silent_windows`
  windows of `rx_timeout_s` in a row without one;
- `bad_frames`: `max_bad_in_row` bad frames (CRC, COBS, length, type) without a good one between;
- `write_timeout`: `max_write_timeouts` write timeouts in a row.
After a fault the port is closed and reopened after an exponential backoff with jitter, for ever;
`on_open(now)` runs after each successful open (the guardian sends HELLO there) and `on_up(now)`
on the first valid frame after an open (the first ever counts too). Frames repeating the previous
sequence number are dropped (`duplicates_skipped`).
"""

from __future__ import annotations

import contextlib
import queue
import random
import select
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

from edge_agent.errors import LinkError
from edge_agent.link.codec import MAX_WIRE_LEN, Frame, FrameDecoder
from edge_agent.link.transport import PortLost, Transport, WriteTimeout, open_transport

OnOpen = Callable[[float], None]
OnUp = Callable[[float], None]
OnDown = Callable[[str, str, float], None]


@dataclass(frozen=True, slots=True)
class LinkConfig:
    port: str
    baudrate: int = 1_000_000
    write_timeout_s: float = 0.005
    rx_timeout_s: float = 0.1
    open_timeout_s: float = 2.0  # the first frame after an open (a board may reboot on open)
    max_silent_windows: int = 3
    max_bad_in_row: int = 16
    max_write_timeouts: int = 3
    backoff_min_s: float = 0.05
    backoff_max_s: float = 2.0
    exclusive: bool = True


@dataclass(slots=True)
class LinkCounters:
    opens: int = 0
    open_failures: int = 0
    faults: int = 0
    recoveries: int = 0
    timeouts: int = 0
    resyncs: int = 0
    write_timeouts: int = 0
    frames_written: int = 0
    duplicates_skipped: int = 0
    queue_overflows: int = 0


@dataclass(frozen=True, slots=True)
class Received:
    """What one read produced: the valid frames, and the raw bytes of complete frames when every
    frame in them was valid (`clean`, ready to relay unchanged; None when something was skipped)."""

    frames: list[Frame] = field(default_factory=list)
    clean: bytes | None = None


class Backoff:
    """Exponential backoff with jitter: min, 2·min, 4·min … capped, each scaled by U(0.5, 1)."""

    def __init__(self, min_s: float, max_s: float, rng: random.Random | None = None) -> None:
        self._min, self._max = min_s, max_s
        self._rng = rng or random.Random()
        self._n = 0

    def next(self) -> float:
        base = min(self._max, self._min * (2.0 ** min(self._n, 30)))
        self._n += 1
        return base * (0.5 + 0.5 * self._rng.random())

    def reset(self) -> None:
        self._n = 0


def _ignore_open(now: float) -> None:
    return None


def _ignore_down(cause: str, detail: str, now: float) -> None:
    return None


class SerialLink:
    """One port, decoded, watched and reopened; driven by its owner's loop (no threads)."""

    def __init__(self, config: LinkConfig, *, on_open: OnOpen = _ignore_open,
                 on_up: OnUp = _ignore_open, on_down: OnDown = _ignore_down,
                 opener: Callable[[LinkConfig], Transport] | None = None,
                 rng: random.Random | None = None) -> None:
        self.config = config
        self.counters = LinkCounters()
        self.decoder = FrameDecoder()
        self._on_open, self._on_up, self._on_down = on_open, on_up, on_down
        self._opener = opener or (lambda c: open_transport(
            c.port, baudrate=c.baudrate, write_timeout_s=c.write_timeout_s,
            exclusive=c.exclusive))
        self._backoff = Backoff(config.backoff_min_s, config.backoff_max_s, rng)
        self._t: Transport | None = None
        self._reopen_at = 0.0
        self._window_end = self._opened_at = 0.0
        self._got_frame_in_window = False
        self._silent = self._bad_in_row = self._wtimeouts_in_row = 0
        self._last_seq: int | None = None
        self._relay = bytearray()
        self.up = False  # a valid frame arrived since the last open
        self._down_reported = False
        self.last_fault: str | None = None

    # -- owner's loop -----------------------------------------------------------------------
    def fileno(self) -> int | None:
        """The fd to select() on for reading, None while the port is closed."""
        return self._t.fileno() if self._t is not None else None

    def next_deadline(self) -> float:
        if self._t is None:
            return self._reopen_at
        return self._window_end if self.up else self._opened_at + self.config.open_timeout_s

    def poll(self, now: float) -> None:
        """Open when due; count silent windows and fault after too many."""
        if self._t is None:
            if now >= self._reopen_at:
                self._open(now)
            return
        if not self.up:
            if now >= self._opened_at + self.config.open_timeout_s:
                self._fault("silent", f"no valid frame within {self.config.open_timeout_s:g} s "
                            "of opening", now)
            return
        if now < self._window_end:
            return
        if not self._got_frame_in_window:
            self.counters.timeouts += 1
            self._silent += 1
        self._got_frame_in_window = False
        self._window_end = now + self.config.rx_timeout_s
        if self._silent >= self.config.max_silent_windows:
            ms = self._silent * self.config.rx_timeout_s * 1000
            self._fault("silent", f"no valid frame for {ms:.0f} ms", now)

    def read(self, now: float, on_frame: Callable[[Frame], None] | None = None) -> Received:
        """Read what the port has and decode it; call when fileno() is readable.

        `on_frame` runs for each valid frame as soon as it is decoded, before the rest of the
        chunk is (an e-stop edge is acted on without waiting for the frames behind it).
        """
        if self._t is None:
            return Received()
        try:
            data = self._t.read()
        except LinkError as exc:
            self._fault("port_lost", str(exc), now)
            return Received()
        if not data:
            return Received()
        c = self.decoder.counters
        discarded_before = c.bytes_discarded
        frames: list[Frame] = []
        clean = True
        start, n = 0, len(data)
        while start < n and self._t is not None:  # a callback's write may have faulted
            idx = data.find(0, start)
            end = n if idx < 0 else idx + 1
            bad_before = c.bad_frames
            for f in self.decoder.feed(data[start:end]):
                if self._t is None:
                    break
                self._bad_in_row = self._silent = 0
                self._got_frame_in_window = True
                if not self.up:
                    self._became_up(now)
                if f.seq == self._last_seq:
                    self.counters.duplicates_skipped += 1
                    clean = False
                else:
                    frames.append(f)
                    if on_frame is not None:
                        on_frame(f)
                self._last_seq = f.seq
            self._bad_in_row += c.bad_frames - bad_before
            start = end
        if c.bytes_discarded != discarded_before:
            self.counters.resyncs += 1
            clean = False
        relay = self._cut_relay(data, clean=clean)
        if self._bad_in_row >= self.config.max_bad_in_row and self._t is not None:
            self._fault("bad_frames", f"{self._bad_in_row} bad frames in a row", now)
        return Received(frames, relay)

    def write(self, data: bytes, now: float, *, urgent: bool = False) -> bool:
        """Write one or more encoded frames; False (counted, maybe a fault) if it did not go out."""
        if self._t is None:
            return False
        try:
            self._t.write(data, urgent=urgent)
        except WriteTimeout:
            self.counters.write_timeouts += 1
            self._wtimeouts_in_row += 1
            if self._wtimeouts_in_row >= self.config.max_write_timeouts:
                self._fault("write_timeout", f"{self._wtimeouts_in_row} write timeouts", now)
            return False
        except LinkError as exc:
            self._fault("port_lost", str(exc), now)
            return False
        self._wtimeouts_in_row = 0
        self.counters.frames_written += 1
        return True

    def stop(self) -> None:
        """Close the port; idempotent, never raises."""
        t, self._t = self._t, None
        if t is not None:
            t.close()

    def counters_dict(self) -> dict[str, int]:
        return asdict(self.counters) | {f"rx_{k}": v for k, v in
                                         self.decoder.counters.as_dict().items()}

    # -- internals ---------------------------------------------------------------------------
    def _cut_relay(self, data: bytes, *, clean: bool) -> bytes | None:
        """Keep the bytes up to the last delimiter (whole frames), hold back the partial tail."""
        self._relay += data
        cut = self._relay.rfind(0)
        if cut < 0:
            if len(self._relay) > MAX_WIRE_LEN:
                self._relay.clear()  # the decoder drops it as oversize too
            return None
        whole = bytes(self._relay[: cut + 1])
        del self._relay[: cut + 1]
        return whole if clean else None

    def _open(self, now: float) -> None:
        try:
            self._t = self._opener(self.config)
        except LinkError as exc:
            self.counters.open_failures += 1
            self._reopen_at = now + self._backoff.next()
            self._report_down("open_failed", str(exc), now)
            return
        self.counters.opens += 1
        self.decoder.reset()
        self._relay.clear()
        self._last_seq = None
        self._silent = self._bad_in_row = self._wtimeouts_in_row = 0
        self._got_frame_in_window = False
        self._opened_at = now
        self.up = False
        self._on_open(now)

    def _became_up(self, now: float) -> None:
        self.up = True
        self._window_end = now + self.config.rx_timeout_s
        self._backoff.reset()
        if self._down_reported:
            self.counters.recoveries += 1
        self._down_reported = False
        self.last_fault = None
        self._on_up(now)

    def _fault(self, cause: str, detail: str, now: float) -> None:
        self.stop()
        self.up = False
        self._reopen_at = now + self._backoff.next()
        self._report_down(cause, detail, now)

    def _report_down(self, cause: str, detail: str, now: float) -> None:
        if self._down_reported:
            return
        self._down_reported = True
        self.counters.faults += 1
        self.last_fault = f"{cause}: {detail}"
        self._on_down(cause, detail, now)


class LinkThread:
    """A SerialLink on its own thread: frames into a bounded queue (oldest dropped and counted)."""

    def __init__(self, link: SerialLink, *, maxsize: int = 4096) -> None:
        self.link = link
        self.frames: queue.Queue[Frame] = queue.Queue(maxsize=maxsize)
        self._lock = threading.RLock()  # link callbacks may write from inside poll()
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name="serial-link", daemon=True)

    def start(self) -> LinkThread:
        self._thread.start()
        return self

    def write(self, data: bytes, *, urgent: bool = False) -> bool:
        with self._lock:
            return self.link.write(data, time.monotonic(), urgent=urgent)

    def _run(self) -> None:
        while not self._stopping.is_set():
            with self._lock:
                now = time.monotonic()
                self.link.poll(now)
                fd = self.link.fileno()
                timeout = min(0.05, max(0.0, self.link.next_deadline() - now))
            try:
                ready = select.select([fd], [], [], timeout)[0] if fd is not None else []
            except (OSError, ValueError):  # closed under us by a fault on a write
                ready = []
            if fd is None:
                self._stopping.wait(timeout)
            if not ready:
                continue
            with self._lock:
                got = self.link.read(time.monotonic())
            for f in got.frames:
                self._put(f)

    def _put(self, frame: Frame) -> None:
        while True:
            try:
                self.frames.put_nowait(frame)
                return
            except queue.Full:
                self.link.counters.queue_overflows += 1
                with contextlib.suppress(queue.Empty):
                    self.frames.get_nowait()

    def stop(self) -> None:
        """Stop the thread and close the port; idempotent, never raises."""
        self._stopping.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout=2.0)
        with self._lock:
            self.link.stop()


__all__ = ["Backoff", "LinkConfig", "LinkCounters", "LinkThread", "PortLost", "Received",
           "SerialLink"]

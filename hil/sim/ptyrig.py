"""The real-time runner: simulated firmwares on real ptys, stepped by one thread at the tick rate.

One thread serves every robot of the process: it waits for input with `select` on the pty
masters until the next absolute deadline (time.monotonic) minus a short spin, spins the rest,
then steps each firmware. Input is handed to the firmware the moment it is read (stamped with
time.monotonic()), and replies such as PONG are written at once. asyncio cannot hold 1 kHz here;
a thread with absolute deadlines can, and spends most of each tick asleep in select.

The rig keeps its own slave fd open, so the host can open, close and reopen the device without
the master seeing a hang-up, and sets the line raw at once (no echo of our own frames). Writes
never block: when the host does not read and the pty buffer is full, bytes are dropped and
counted, as a UART FIFO would.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import gc
import os
import select
import threading
import time
import tty
from collections import deque
from collections.abc import Sequence
from typing import Any

from hil.sim.firmware import Firmware


class PtyPort:
    """One pty pair: the rig owns the master; `path` is the device the host opens."""

    def __init__(self) -> None:
        self.master, self.slave = os.openpty()
        tty.setraw(self.slave)
        flags = fcntl.fcntl(self.master, fcntl.F_GETFL)
        fcntl.fcntl(self.master, fcntl.F_SETFL, flags | os.O_NONBLOCK)
        self.path = os.ttyname(self.slave)
        self.tx_dropped = 0
        self.closed = False

    def read(self) -> bytes:
        try:
            return os.read(self.master, 65536)
        except (BlockingIOError, InterruptedError):
            return b""
        except OSError as exc:  # EIO: no slave open (cannot happen while we hold one)
            if exc.errno == errno.EIO:
                return b""
            raise

    def write(self, data: bytes) -> None:
        try:
            n = os.write(self.master, data)
        except (BlockingIOError, InterruptedError):
            n = 0
        except OSError:
            n = 0
        if n < len(data):
            self.tx_dropped += len(data) - n

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        for fd in (self.master, self.slave):
            with contextlib.suppress(OSError):
                os.close(fd)


class RealTimeRig:
    """Steps `firmwares[i]` on `ports[i]` in real time until stop()."""

    def __init__(self, firmwares: Sequence[Firmware], ports: Sequence[PtyPort], *,
                 spin_s: float = 0.00005, lock: threading.Lock | None = None) -> None:
        if len(firmwares) != len(ports) or not firmwares:
            raise ValueError("one port per firmware, at least one")
        self.firmwares = list(firmwares)
        self.ports = list(ports)
        self.spin_s = spin_s
        self.lock = lock or threading.Lock()
        self.overruns = 0  # ticks stepped more than one tick late
        self.max_late_s = 0.0
        self.loops = 0
        self.started_at = time.monotonic()
        self._cpu0 = time.process_time()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._flush_every_s = 0.2
        self.late_ticks: deque[tuple[float, float]] = deque(maxlen=1000)  # (monotonic, late s)

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="rig-rt", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Idempotent; never raises."""
        self._stop.set()
        t = self._thread
        if t is not None and t is not threading.current_thread():
            t.join(timeout=2.0)
        for fw in self.firmwares:
            fw.record.flush()

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def info(self) -> dict[str, Any]:
        up = time.monotonic() - self.started_at
        cpu = time.process_time() - self._cpu0
        return {"robots": len(self.firmwares), "tick_us": self.firmwares[0].tick_us,
                "uptime_s": up, "cpu_s": cpu, "cpu_percent": 100.0 * cpu / up if up else 0.0,
                "overruns": self.overruns, "max_late_ms": self.max_late_s * 1e3,
                "late_ticks": [[round(t, 4), round(late * 1e3, 2)] for t, late in
                               list(self.late_ticks)],
                "ptys": [p.path for p in self.ports],
                "tx_dropped": [p.tx_dropped for p in self.ports]}

    def _run(self) -> None:
        fws, ports, lock = self.firmwares, self.ports, self.lock
        by_fd = {p.master: (fw, p) for fw, p in zip(fws, ports, strict=True)}
        fds = list(by_fd)
        tick = fws[0].tick_us * 1e-6
        spin = self.spin_s
        next_flush = time.monotonic() + self._flush_every_s
        clock = time.monotonic
        while not self._stop.is_set():
            deadline = fws[0].next_tick_time()
            now = clock()
            wait = deadline - now
            if wait > spin:
                ready, _, _ = select.select(fds, [], [], wait - spin)
                if ready:
                    now = clock()
                    with lock:
                        for fd in ready:
                            fw, port = by_fd[fd]
                            data = port.read()
                            if data:
                                fw.receive(data, now)
                                out = fw.drain()
                                if out:
                                    port.write(out)
                                    fw.wired(clock())
                continue
            while now < deadline:
                now = clock()
            late = now - deadline
            if late > tick:
                self.overruns += 1
                self.late_ticks.append((now, late))
            self.max_late_s = max(self.max_late_s, late)
            with lock:
                for fw, port in zip(fws, ports, strict=True):
                    out = fw.step(now)
                    if out:
                        port.write(out)
                        fw.wired(clock())
            self.loops += 1
            if now >= next_flush:
                next_flush = now + self._flush_every_s
                for fw in fws:
                    fw.record.flush()
                # The frame record keeps up to 200,000 entries (~10^6 tracked objects): a full
                # collection over them stalled this loop 50-120 ms (rig max_late_ms), which
                # benchmarks then read as the host's lateness. Entries are acyclic and freed by
                # reference counting, so freezing what exists costs nothing and collections
                # only ever scan the last 0.2 s of objects.
                gc.freeze()

"""Byte transports under the serial link: a tty path or a pyserial URL, selectable, write timeouts.

Every transport exposes a file descriptor that select() reports readable when `read()` has bytes
(or the port is gone), so one select loop can serve the tty, the daemon's socket and a timer
without threads and without busy polling.

- A path (`/dev/ttyUSB0`, a pty slave) is opened with pyserial (raw mode, baud rate, an exclusive
  flock so two guardians never share a tty). pyserial leaves VMIN=0; we set VMIN=1/VTIME=0 and
  read only after select() said readable, so a read never spins and an empty read means hang-up.
- A URL (`loop://`, `socket://host:port`, `rfc2217://…`) is opened with `serial.serial_for_url`;
  those objects have no fd, so a small reader thread moves their bytes into a pipe.

Writes are non-blocking with a deadline (`WriteTimeout`): a full buffer never stalls the caller.
An *urgent* write (a STOP frame) that finds the buffer full first discards the queued output
(stale setpoints are worthless) and then writes the whole frame, so the stop is never stuck behind
them. Every OS / pyserial failure becomes a `LinkError` (`PortLost`, `WriteTimeout`) with `from`.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import select
import termios
import threading
import time
from typing import Any, Protocol

import serial

from edge_agent.errors import LinkError

_READ_CHUNK = 65536


class PortLost(LinkError):
    """The port went away (unplugged, peer closed the pty, EIO/ENOENT) or could not be opened."""


class WriteTimeout(LinkError):
    """The port did not take a frame within the write timeout (nobody reads the other side)."""


class Transport(Protocol):
    """What the serial link needs from a port."""

    name: str

    def fileno(self) -> int:
        """An fd that select() reports readable when read() has bytes or the port is gone."""
        ...

    def read(self) -> bytes:
        """The bytes available now (never blocks after select said readable); PortLost if gone."""
        ...

    def write(self, data: bytes, *, urgent: bool = False) -> None:
        """Write all of `data` within the write timeout, or raise WriteTimeout / PortLost."""
        ...

    def close(self) -> None:
        """Release the port; idempotent, never raises."""
        ...


def open_transport(port: str, *, baudrate: int = 1_000_000, write_timeout_s: float = 0.005,
                   exclusive: bool = True) -> Transport:
    """Open `port` (a device path or a pyserial URL) or raise PortLost."""
    if "://" in port:
        return UrlTransport(port, baudrate=baudrate, write_timeout_s=write_timeout_s)
    return TtyTransport(port, baudrate=baudrate, write_timeout_s=write_timeout_s,
                        exclusive=exclusive)


class TtyTransport:
    """A tty or pty opened by path, read and written through its fd."""

    def __init__(self, path: str, *, baudrate: int = 1_000_000, write_timeout_s: float = 0.005,
                 exclusive: bool = True) -> None:
        self.name = path
        self._write_timeout_s = write_timeout_s
        try:
            self._serial: Any = serial.Serial(path, baudrate=baudrate, timeout=0,
                                              exclusive=exclusive)
            fd: int = self._serial.fd
            attrs = termios.tcgetattr(fd)
            attrs[6][termios.VMIN] = 1
            attrs[6][termios.VTIME] = 0
            termios.tcsetattr(fd, termios.TCSANOW, attrs)
            # Non-blocking stays on: we only read after select() and writes need a deadline.
            fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) | os.O_NONBLOCK)
        except (serial.SerialException, OSError, termios.error, ValueError) as exc:
            self.close()
            raise PortLost(f"cannot open {path}: {exc}") from exc
        self._fd: int | None = fd

    def fileno(self) -> int:
        if self._fd is None:
            raise PortLost(f"{self.name} is closed")
        return self._fd

    def read(self) -> bytes:
        fd = self.fileno()
        try:
            data = os.read(fd, _READ_CHUNK)
        except BlockingIOError:
            return b""  # select woke us for nothing (another reader, a signal): not a hang-up
        except OSError as exc:
            raise PortLost(f"{self.name}: read failed: {exc}") from exc
        if not data:
            raise PortLost(f"{self.name}: hang-up (end of file)")
        return data

    def write(self, data: bytes, *, urgent: bool = False) -> None:
        fd = self.fileno()
        view = memoryview(data)
        deadline: float | None = None
        flushed = False
        while True:
            try:
                n = os.write(fd, view)
            except BlockingIOError:
                n = 0
            except OSError as exc:
                raise PortLost(f"{self.name}: write failed: {exc}") from exc
            view = view[n:]
            if not view:
                return
            if urgent and not flushed:
                # Drop the queued (stale) output and start the frame again from its delimiter.
                flushed = True
                with contextlib.suppress(termios.error, OSError):
                    termios.tcflush(fd, termios.TCOFLUSH)
                view = memoryview(data)
                continue
            now = time.monotonic()
            if deadline is None:
                deadline = now + self._write_timeout_s
            if now >= deadline:
                raise WriteTimeout(
                    f"{self.name}: {len(view)} of {len(data)} bytes not taken within "
                    f"{self._write_timeout_s * 1000:.1f} ms")
            try:
                select.select([], [fd], [], deadline - now)
            except OSError as exc:
                raise PortLost(f"{self.name}: select failed: {exc}") from exc

    def close(self) -> None:
        self._fd = None
        ser = getattr(self, "_serial", None)
        if ser is not None:
            with contextlib.suppress(Exception):
                ser.close()


class UrlTransport:
    """A pyserial URL; a reader thread moves its bytes into a pipe the link can select() on."""

    def __init__(self, url: str, *, baudrate: int = 1_000_000,
                 write_timeout_s: float = 0.005) -> None:
        self.name = url
        self._lock = threading.Lock()
        self._closed = threading.Event()
        self._error: BaseException | None = None
        try:
            self._serial: Any = serial.serial_for_url(url, baudrate=baudrate, timeout=0.05,
                                                      write_timeout=write_timeout_s)
        except (serial.SerialException, OSError, ValueError) as exc:
            raise PortLost(f"cannot open {url}: {exc}") from exc
        self._pipe_r, self._pipe_w = os.pipe()
        os.set_blocking(self._pipe_r, False)
        self._thread = threading.Thread(target=self._pump, name=f"link-url-{url}", daemon=True)
        self._thread.start()

    def _pump(self) -> None:
        try:
            while not self._closed.is_set():
                data = self._serial.read(max(1, self._serial.in_waiting))
                if data:
                    os.write(self._pipe_w, data)
        except Exception as exc:  # any pyserial/OS failure: the port is gone
            self._error = exc
        finally:
            with contextlib.suppress(OSError):
                os.close(self._pipe_w)  # wakes the reader's select with end of file

    def fileno(self) -> int:
        return self._pipe_r

    def read(self) -> bytes:
        try:
            data = os.read(self._pipe_r, _READ_CHUNK)
        except BlockingIOError:
            return b""
        except OSError as exc:
            raise PortLost(f"{self.name}: read failed: {exc}") from exc
        if not data:
            raise PortLost(f"{self.name}: port gone: {self._error!r}")
        return data

    def write(self, data: bytes, *, urgent: bool = False) -> None:
        with self._lock:
            try:
                self._serial.write(data)
            except serial.SerialTimeoutException as exc:
                if urgent:
                    with contextlib.suppress(Exception):
                        self._serial.reset_output_buffer()
                        self._serial.write(data)
                        return
                raise WriteTimeout(f"{self.name}: write timeout") from exc
            except (serial.SerialException, OSError) as exc:
                raise PortLost(f"{self.name}: write failed: {exc}") from exc

    def close(self) -> None:
        if self._closed.is_set():
            return
        self._closed.set()
        self._thread.join(timeout=1.0)
        with contextlib.suppress(Exception):
            self._serial.close()
        with contextlib.suppress(OSError):
            os.close(self._pipe_r)


"""sd_notify over its socket protocol: one AF_UNIX datagram to $NOTIFY_SOCKET, no libsystemd."""

from __future__ import annotations

import os
import socket
import threading


class SystemdNotifier:
    """Sends READY / WATCHDOG / STATUS / STOPPING; a no-op when not run by systemd.

    A leading '@' in $NOTIFY_SOCKET names the abstract namespace. Sending never raises: a
    daemon must not die because the service manager went away.
    """

    def __init__(self, address: str | None = None) -> None:
        addr = os.environ.get("NOTIFY_SOCKET") if address is None else address
        self._addr: str | bytes | None = None
        if addr:
            self._addr = "\0" + addr[1:] if addr.startswith("@") else addr
        self._sock: socket.socket | None = None
        self._lock = threading.Lock()
        self.errors = 0

    @property
    def enabled(self) -> bool:
        return self._addr is not None

    def notify(self, *fields: str) -> bool:
        if self._addr is None:
            return False
        msg = "\n".join(fields).encode()
        with self._lock:
            try:
                if self._sock is None:
                    # Non-blocking: a full receive queue (a service manager that does not read)
                    # must cost a counted error, never hang the caller (the main loop, stop()).
                    kind = socket.SOCK_DGRAM | socket.SOCK_CLOEXEC | socket.SOCK_NONBLOCK
                    self._sock = socket.socket(socket.AF_UNIX, kind)
                self._sock.sendto(msg, self._addr)
                return True
            except OSError:
                self.errors += 1
                return False

    def ready(self, status: str = "") -> bool:
        return self.notify("READY=1", f"MAINPID={os.getpid()}",
                           *([f"STATUS={status}"] if status else []))

    def watchdog(self) -> bool:
        return self.notify("WATCHDOG=1")

    def status(self, text: str) -> bool:
        return self.notify(f"STATUS={text}")

    def stopping(self) -> bool:
        return self.notify("STOPPING=1")

    @staticmethod
    def watchdog_interval_s() -> float | None:
        """Half of $WATCHDOG_USEC (the interval systemd expects pings at), when it targets us."""
        usec = os.environ.get("WATCHDOG_USEC")
        pid = os.environ.get("WATCHDOG_PID")
        if not usec or (pid and pid != str(os.getpid())):
            return None
        try:
            return int(usec) / 2e6
        except ValueError:
            return None

    def close(self) -> None:
        with self._lock:
            if self._sock is not None:
                self._sock.close()
                self._sock = None

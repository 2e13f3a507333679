"""Test helper: a threaded TCP proxy between a client (the daemon) and a server (the broker) that
can cut the connection and restore it — a network blip the client sees as a dropped socket.

While cut, the proxy still accepts (so the client's connect succeeds at TCP level) and closes at
once: the client's MQTT CONNECT never reaches the broker, as on a dead link.
"""

from __future__ import annotations

import contextlib
import socket
import threading

from mosquitto import free_port


class TcpProxy:
    """`127.0.0.1:<port>` → upstream; `cut()` drops every connection, `restore()` allows new."""

    host = "127.0.0.1"

    def __init__(self, upstream_host: str, upstream_port: int) -> None:
        self.upstream = (upstream_host, upstream_port)
        self.port = free_port()
        self._listener = socket.create_server((self.host, self.port))
        self._lock = threading.Lock()
        self._open: list[socket.socket] = []
        self._up = True
        self._closed = False
        self.accepted = 0
        self._thread = threading.Thread(target=self._accept_loop, name="tcp-proxy", daemon=True)
        self._thread.start()

    def cut(self) -> None:
        """Drop every connection now and refuse new ones until `restore()`."""
        with self._lock:
            self._up = False
            socks, self._open = self._open, []
        for s in socks:
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            s.close()

    def restore(self) -> None:
        with self._lock:
            self._up = True

    def close(self) -> None:
        self._closed = True
        self.cut()
        with contextlib.suppress(OSError):
            self._listener.close()

    def _accept_loop(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            with self._lock:
                up = self._up
            if not up:
                client.close()
                continue
            try:
                server = socket.create_connection(self.upstream, timeout=5)
                server.settimeout(None)
            except OSError:
                client.close()
                continue
            for s in (client, server):
                s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            with self._lock:
                self._open += [client, server]
                self.accepted += 1
            for a, b in ((client, server), (server, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                dst.sendall(data)
        except OSError:
            pass
        for s in (src, dst):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)

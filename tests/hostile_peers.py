"""Test helpers: peers that misbehave on purpose, and the peak RSS of the process they hit.

`FloodHTTP` is a real HTTP server (a thread on a 127.0.0.1 socket) that answers every POST with
200 and a body of `body_bytes` streamed lazily in 1 MiB pieces (never held whole), counting what
it managed to send before the client closed. `publish_raw` writes one MQTT 3.1.1 PUBLISH of any
size through a plain socket, its payload generated piece by piece. `peak_rss_mb` reads VmHWM.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from pathlib import Path

_PIECE = b"x" * (1 << 20)


def peak_rss_mb(pid: int) -> float:
    """The process's peak resident set (VmHWM) in MB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise AssertionError(f"no VmHWM for pid {pid}")


class FloodHTTP:
    """POST → `HTTP/1.1 200` with a `body_bytes` JSON-looking body, streamed until the client
    stops reading. `sent` holds the body bytes written per request."""

    def __init__(self, body_bytes: int) -> None:
        self.body_bytes = body_bytes
        self.sent: list[int] = []
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind(("127.0.0.1", 0))
        self._sock.listen(8)
        self.port = int(self._sock.getsockname()[1])
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def url(self, token: str) -> str:
        return f"http://127.0.0.1:{self.port}/cgi-bin/webhook/send?key={token}"

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            threading.Thread(target=self._answer, args=(conn,), daemon=True).start()

    def _answer(self, conn: socket.socket) -> None:
        with conn, contextlib.suppress(OSError):
            conn.settimeout(30)
            reader = conn.makefile("rb")
            length = 0
            while (line := reader.readline(65536)) not in (b"\r\n", b"\n", b""):
                if line.lower().startswith(b"content-length:"):
                    length = int(line.split(b":", 1)[1])
            reader.read(length)
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                         b"Content-Length: %d\r\n\r\n" % self.body_bytes)
            head = b'{"errcode":0,"errmsg":"'
            sent = 0
            self.sent.append(0)
            try:
                conn.sendall(head)
                sent = len(head)
                while sent < self.body_bytes and not self._stop.is_set():
                    piece = _PIECE[:self.body_bytes - sent]
                    conn.sendall(piece)
                    sent += len(piece)
            finally:
                self.sent[-1] = sent

    def stop(self) -> None:
        self._stop.set()
        self._sock.close()


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte, n = n % 128, n // 128
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _utf8(s: str) -> bytes:
    b = s.encode()
    return len(b).to_bytes(2, "big") + b


def publish_raw(host: str, port: int, user: str, password: str, topic: str,
                payload_head: bytes, payload_bytes: int, timeout: float = 30.0) -> None:
    """One MQTT 3.1.1 QoS 0 PUBLISH of `payload_bytes` (starting with `payload_head`, padded
    with spaces) through a plain socket: CONNECT, CONNACK, PUBLISH, DISCONNECT."""
    with socket.create_connection((host, port), timeout=timeout) as s:
        var = _utf8("MQTT") + bytes([4, 0xC2]) + (0).to_bytes(2, "big")  # no keepalive: a slow
        # transfer on a loaded machine must not be cut by the broker
        body = var + _utf8(f"raw-{user}") + _utf8(user) + _utf8(password)
        s.sendall(bytes([0x10]) + _varint(len(body)) + body)
        connack = s.recv(4)
        assert connack[:1] == b"\x20" and connack[3:4] == b"\x00", f"CONNACK {connack!r}"
        t = _utf8(topic)
        s.sendall(bytes([0x30]) + _varint(len(t) + payload_bytes) + t + payload_head)
        left = payload_bytes - len(payload_head)
        pad = b" " * (1 << 20)
        while left > 0:
            piece = pad[:left]
            s.sendall(piece)
            left -= len(piece)
        s.sendall(b"\xe0\x00")


class FloodUnix:
    """A Unix stream server at `path` that reads one request line and answers with a line of
    `line_bytes` that never ends (no newline), streamed lazily; `sent` per connection."""

    def __init__(self, path: Path, line_bytes: int) -> None:
        self.line_bytes = line_bytes
        self.sent: list[int] = []
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._sock.bind(str(path))
        self._sock.listen(8)
        self._stop = threading.Event()
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            threading.Thread(target=self._answer, args=(conn,), daemon=True).start()

    def _answer(self, conn: socket.socket) -> None:
        with conn, contextlib.suppress(OSError):
            conn.settimeout(30)
            conn.makefile("rb").readline(65536)
            sent = 0
            self.sent.append(0)
            try:
                conn.sendall(b'{"ok": true, "pad": "')
                while sent < self.line_bytes and not self._stop.is_set():
                    piece = _PIECE[:self.line_bytes - sent]
                    conn.sendall(piece)
                    sent += len(piece)
            finally:
                self.sent[-1] = sent

    def stop(self) -> None:
        self._stop.set()
        self._sock.close()

"""The local control socket: `<state_dir>/control.sock`, JSON lines onto the same CommandAPI.

Request line: `{"cmd": "<name>", "v": 1, "id": "...", ...args}`; reply line: the Reply as JSON.
Only the daemon's user may connect (the socket file is 0600: bound, chmod'ed, *then* listened on,
so there is no window in which a connect can succeed with looser permissions). An `estop` line
calls `on_estop("socket")` before anything else, as the MQTT e-stop does — and so does a line
that cannot be read as a known command but names `estop` (fail safe: `{"cmd": "estop"` cut
short, a bare `estop`, `"cmd": "ESTOP"`). One accept thread plus one thread per connection
(bounded); a connection past the bound has its first line read by the accept thread and is
served only if it is an e-stop (comms/socket_overflow.py), so no number of idle connections can
make an `estop` bounce. Every blocking call has a timeout or is woken by `stop()`.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import selectors
import socket
import stat
import struct
import threading
from collections.abc import Callable
from pathlib import Path

from edge_agent.commands.api import CommandAPI
from edge_agent.commands.codes import Reply
from edge_agent.commands.schema import COMMANDS, PayloadError, decode
from edge_agent.comms.socket_overflow import OverflowLane
from edge_agent.errors import EdgeAgentError
from edge_agent.log import get_logger
from edge_agent.vocab import ErrorCode

_log = get_logger(__name__)
SOCKET_NAME = "control.sock"
_SUN_PATH_MAX = 107
_ESTOP_WORD = re.compile(rb"(?<![a-z0-9_])estop(?![a-z0-9_])", re.IGNORECASE)


def names_estop(line: bytes) -> bool:
    """The word `estop` anywhere in the line (any case; `estop_input` does not count)."""
    return _ESTOP_WORD.search(line) is not None


class ControlSocketServer:
    """Serves the CommandAPI on a Unix stream socket; `start()`/`stop()` (idempotent)."""

    def __init__(self, api: CommandAPI, path: Path | str, *,
                 on_estop: Callable[[str], None] | None = None, max_clients: int = 8,
                 idle_timeout_s: float = 60.0, max_line: int | None = None,
                 overflow_pending: int = 32, overflow_line_timeout_s: float = 1.0) -> None:
        self.path = Path(path)
        if len(os.fsencode(self.path)) > _SUN_PATH_MAX:
            raise EdgeAgentError(f"control socket path too long for AF_UNIX: {self.path}")
        self._api = api
        self._on_estop = on_estop
        self._max_clients = max_clients
        self._idle_timeout_s = idle_timeout_s
        self._max_line = max_line or api.limits.max_bytes + 64
        self._overflow_pending = overflow_pending
        self._overflow_line_timeout_s = overflow_line_timeout_s
        self.overflow: OverflowLane | None = None  # the accept thread's; counters readable
        self._lock = threading.Lock()
        self._listener: socket.socket | None = None
        self._wake_r, self._wake_w = socket.socketpair()
        self._accept_thread: threading.Thread | None = None
        self._clients: dict[socket.socket, threading.Thread] = {}
        self._inode: int | None = None
        self._started = self._stopping = False

    def start(self) -> None:
        """Remove a stale socket file, bind 0600, listen, start accepting."""
        with self._lock:
            if self._started or self._stopping:
                return
            self._started = True
        self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        self._remove_stale()
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.bind(os.fspath(self.path))
            os.chmod(self.path, 0o600)
            self._inode = os.stat(self.path).st_ino
            sock.listen(128)  # a burst of connections must not bounce an e-stop's connect
        except OSError as exc:
            sock.close()
            raise EdgeAgentError(f"control socket {self.path}: {exc}") from exc
        sock.setblocking(False)
        self._listener = sock
        self._accept_thread = threading.Thread(target=self._accept_loop, name="control-socket",
                                               daemon=True)
        self._accept_thread.start()
        _log.info("control_socket_listening", path=str(self.path))

    def _remove_stale(self) -> None:
        try:
            st = os.lstat(self.path)
        except FileNotFoundError:
            return
        if not stat.S_ISSOCK(st.st_mode):
            raise EdgeAgentError(f"{self.path} exists and is not a socket; not removing it")
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        probe.settimeout(1.0)
        try:
            probe.connect(os.fspath(self.path))
        except (ConnectionRefusedError, FileNotFoundError):
            self.path.unlink(missing_ok=True)
            _log.info("control_socket_stale_removed", path=str(self.path))
            return
        except OSError as exc:
            raise EdgeAgentError(f"control socket {self.path}: {exc}") from exc
        finally:
            probe.close()
        raise EdgeAgentError(f"another process is serving {self.path}")

    def stop(self, timeout: float = 2.0) -> None:
        """Stop accepting, close every connection, remove the socket file. Never raises."""
        with self._lock:
            if self._stopping:
                return
            self._stopping = True
            clients = list(self._clients)
        try:
            with contextlib.suppress(OSError):
                self._wake_w.send(b"x")
            if self._accept_thread is not None:
                self._accept_thread.join(timeout)
            for conn in clients:
                with contextlib.suppress(OSError):
                    conn.shutdown(socket.SHUT_RDWR)
            with self._lock:
                threads = list(self._clients.values())
            for t in threads:
                t.join(timeout)
            if self._listener is not None:
                self._listener.close()
            with contextlib.suppress(OSError):
                if self._inode is not None and os.stat(self.path).st_ino == self._inode:
                    self.path.unlink()
            self._wake_r.close()
            self._wake_w.close()
        except Exception:
            _log.exception("control_socket_stop_failed")

    def _accept_loop(self) -> None:
        assert self._listener is not None
        with selectors.DefaultSelector() as sel:
            sel.register(self._listener, selectors.EVENT_READ)
            sel.register(self._wake_r, selectors.EVENT_READ)
            lane = self.overflow = OverflowLane(
                sel, self._overflow_answer, busy=_line(Reply.failure(
                    None, ErrorCode.BUSY, "too many connections (only estop is served now)")),
                max_pending=self._overflow_pending, max_line=self._max_line,
                line_timeout_s=self._overflow_line_timeout_s)
            try:
                while not self._stopping:
                    for key, _ in sel.select(lane.timeout()):
                        if key.fileobj is self._wake_r or self._stopping:
                            return
                        if key.fileobj is not self._listener:
                            lane.readable(key.fileobj)  # type: ignore[arg-type]
                            continue
                        try:
                            conn, _addr = self._listener.accept()
                        except BlockingIOError:
                            continue
                        except OSError:
                            _log.exception("control_socket_accept_failed")
                            continue
                        self._admit(conn, lane)
                    lane.expire()
            finally:
                lane.close_all()

    def _admit(self, conn: socket.socket, lane: OverflowLane) -> None:
        with self._lock:
            full = len(self._clients) >= self._max_clients or self._stopping
            if not full:
                t = threading.Thread(target=self._serve, args=(conn,), daemon=True,
                                     name="control-socket-conn")
                self._clients[conn] = t
        if full:  # its first line decides: an e-stop is served, anything else is busy
            lane.add(conn)
            return
        conn.setblocking(True)
        conn.settimeout(self._idle_timeout_s)
        t.start()

    def _overflow_answer(self, line: bytes) -> bytes | None:
        return _line(self.handle_line(line)) if self.estop_requested(line) else None

    def _serve(self, conn: socket.socket) -> None:
        peer = _peer(conn)
        _log.debug("control_socket_client", **peer)
        try:
            with conn, conn.makefile("rb") as reader:
                while not self._stopping:
                    line = reader.readline(self._max_line + 1)
                    if not line:
                        return
                    if len(line) > self._max_line and not line.endswith(b"\n"):
                        conn.sendall(_line(self._estop(line) if names_estop(line) else
                                           Reply.failure(None, ErrorCode.TOO_LARGE,
                                                         f"line longer than {self._max_line} "
                                                         "bytes")))
                        return
                    if line.strip():
                        conn.sendall(_line(self.handle_line(line)))
        except (TimeoutError, OSError) as exc:
            _log.debug("control_socket_client_closed", why=str(exc), **peer)
        finally:
            with self._lock:
                self._clients.pop(conn, None)

    def estop_requested(self, line: bytes) -> bool:
        """Whether `handle_line` stops for this line: `"cmd": "estop"`, or no known command
        can be read from it and it names estop (fail safe, as any payload on MQTT's
        `cmd/estop` stops)."""
        try:
            obj = decode(line, self._api.limits)
        except PayloadError:
            return names_estop(line)
        name = obj.get("cmd")
        if name == "estop":
            return True
        return not (isinstance(name, str) and name in COMMANDS) and names_estop(line)

    def _estop(self, line: bytes) -> Reply:
        """Stop first, then the e-stop command (whose reply says what was wrong with the line)."""
        if self._on_estop is not None:
            try:
                self._on_estop("socket")
            except Exception:
                _log.exception("on_estop_failed", source="socket")
        try:
            obj = decode(line, self._api.limits)
        except PayloadError:  # the API reports it as the reply's payload_error
            return self._api.handle("estop", line, source="socket")
        obj.pop("cmd", None)
        return self._api.handle("estop", obj, source="socket")

    def handle_line(self, line: bytes) -> Reply:
        """One request line → its reply (the socket's whole protocol, without the socket)."""
        if self.estop_requested(line):
            return self._estop(line)
        try:
            obj = decode(line, self._api.limits)
        except PayloadError as exc:
            return Reply.failure(exc.command_id, exc.code, exc.message)
        name = obj.pop("cmd", None)
        if not isinstance(name, str):
            raw_id = obj.get("id")
            cid = (raw_id if isinstance(raw_id, str)
                   and 0 < len(raw_id) <= self._api.limits.max_id_len else None)
            return Reply.failure(cid, ErrorCode.BAD_ARGS,
                                 "cmd: missing or not a string (expected a command name)")
        return self._api.handle(name, obj, source="socket")


def _line(reply: Reply) -> bytes:
    return json.dumps(reply.to_dict(), separators=(",", ":")).encode("utf-8") + b"\n"


def _peer(conn: socket.socket) -> dict[str, int]:
    try:
        pid, uid, gid = struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET,
                                                            socket.SO_PEERCRED, 12))
    except (OSError, AttributeError, struct.error):
        return {}
    return {"peer_pid": pid, "peer_uid": uid, "peer_gid": gid}

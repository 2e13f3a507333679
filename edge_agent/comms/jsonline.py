"""One JSON line over a Unix stream socket, one JSON-object line back — no MQTT imported.

The daemon's control socket and the simulated robot's control socket speak this; the daemon's
own rig requests use it on its start-up path, so it must not pull paho (~30 ms) in.
"""

from __future__ import annotations

import json
import os
import socket
import time
from typing import Any

from edge_agent.errors import EdgeAgentError

__all__ = ["MAX_REPLY_BYTES", "CommandTimeout", "CommandTransportError", "json_line_request"]

# The longest reply line read: a `status` is ~10 KB; a peer streaming a line without end (a rig,
# anything bound at the socket's path) is cut here rather than held.
MAX_REPLY_BYTES = 1024 * 1024


class CommandTimeout(EdgeAgentError):
    """No reply arrived within the timeout (the command may or may not have run)."""


class CommandTransportError(EdgeAgentError):
    """Neither the control socket nor the broker could be used (refused, auth, no route)."""


def json_line_request(path: str | os.PathLike[str], request: dict[str, Any], timeout: float,
                      *, what: str = "request") -> dict[str, Any]:
    """One JSON line to a Unix stream socket, one JSON-object line back (the daemon's control
    socket and the simulated robot's speak this). Raises CommandTimeout/CommandTransportError."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(timeout)
    try:
        _connect(sock, path, timeout)
        try:
            sock.sendall(json.dumps(request).encode("utf-8") + b"\n")
            with sock.makefile("rb") as reader:
                line = reader.readline(MAX_REPLY_BYTES + 1)
        except TimeoutError:
            raise CommandTimeout(f"no reply to {what} within {timeout:g} s") from None
        except OSError as exc:
            raise CommandTransportError(f"control socket {path}: {exc}") from exc
    finally:
        sock.close()
    if not line:
        raise CommandTransportError(f"control socket {path} closed without a reply")
    if len(line) > MAX_REPLY_BYTES:
        raise CommandTransportError(f"control socket {path}: reply over {MAX_REPLY_BYTES} "
                                    "bytes, not read")
    try:
        reply = json.loads(line)
    except ValueError as exc:
        raise CommandTransportError(f"control socket {path}: reply is not JSON") from exc
    if not isinstance(reply, dict):
        raise CommandTransportError(f"control socket {path}: reply is not an object")
    return reply


def _connect(sock: socket.socket, path: str | os.PathLike[str], timeout: float) -> None:
    """Connect within `timeout`: a Unix socket whose listen backlog is full for a moment (a
    burst of connections) answers EAGAIN at once; an e-stop must try again, not give up."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            sock.connect(os.fspath(path))
            return
        except BlockingIOError as exc:
            if time.monotonic() >= deadline:
                raise CommandTransportError(f"control socket {path}: {exc}") from exc
            time.sleep(0.002)
        except OSError as exc:
            raise CommandTransportError(f"control socket {path}: {exc}") from exc

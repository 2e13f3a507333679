"""Issue #15 item 4 on the real daemon (--sim: guardian, rig on a pty): the local control
socket's `estop` can never be crowded out, and a malformed line that names estop stops.

What counts is what a user notices: the robot gets a STOP frame (the rig's record) and the
daemon is latched in `estop`.
"""

from __future__ import annotations

import json
import socket
import time
from pathlib import Path
from typing import Any

from daemon_proc import DaemonProc
from mosquitto import wait_until
from unix_socket import try_connect


def _connect(path: Path) -> socket.socket:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(20)
    wait_until(lambda: try_connect(s, path), 20, "a connection")
    return s


def _ask(s: socket.socket, req: dict[str, Any]) -> dict[str, Any]:
    s.sendall(json.dumps(req).encode() + b"\n")
    line = b""
    while not line.endswith(b"\n"):
        chunk = s.recv(65536)
        assert chunk, "closed without a reply"
        line += chunk
    out: dict[str, Any] = json.loads(line)
    return out


def _stops_since(d: DaemonProc, since: float) -> list[dict[str, Any]]:
    rec = d.rig({"cmd": "record", "type": "STOP", "since": since})
    assert rec["ok"], rec
    frames: list[dict[str, Any]] = rec["frames"]
    return frames


def test_a_flood_of_silent_connections_cannot_crowd_out_the_local_estop(tmp_path: Path) -> None:
    d = DaemonProc(tmp_path, None, extra=("executor.reset_min_interval_s=0",)).start()
    sockets: list[socket.socket] = []
    try:
        d.wait_ready()
        wait_until(lambda: d.socket_cmd("status")["result"]["link_up"], 60, "link up")
        path = d.state_dir / "control.sock"
        # eight connections take every slot (each answered once), then say nothing
        held = [_connect(path) for _ in range(8)]
        sockets += held
        for i, s in enumerate(held):
            assert _ask(s, {"cmd": "status", "v": 1, "id": f"hold-{i}"})["ok"]
        sockets += [_connect(path) for _ in range(40)]  # and a crowd waiting silently
        assert _ask(_connect(path), {"cmd": "status", "v": 1, "id": "x"})["error"]["code"] \
            == "busy"
        since = time.monotonic()
        reply = d.socket_cmd("estop")  # `edge-agent cmd estop`'s path: a new connection
        assert reply["ok"] and reply["result"]["latched"], reply
        assert _ask(held[0], {"cmd": "status", "v": 1, "id": "after"})["result"]["mode"] == \
            "estop"
        wait_until(lambda: bool(_stops_since(d, since)), 20, "a STOP frame at the robot")

        # a malformed line that names estop stops too, slots full or not
        assert _ask(held[1], {"cmd": "reset", "v": 1, "id": "r1"})["ok"]
        assert _ask(held[1], {"cmd": "status", "v": 1, "id": "s1"})["result"]["mode"] == "idle"
        since = time.monotonic()
        with _connect(path) as s:
            s.sendall(b'{"cmd": "estop", "id": "cut-sh\n')
            cut = json.loads(s.makefile("rb").readline())
        assert cut["ok"] and "payload_error" in cut["result"], cut
        assert _ask(held[2], {"cmd": "status", "v": 1, "id": "s2"})["result"]["mode"] == "estop"
        wait_until(lambda: bool(_stops_since(d, since)), 20, "a STOP frame at the robot")
        assert _ask(held[1], {"cmd": "reset", "v": 1, "id": "r2"})["ok"]
        since = time.monotonic()
        held[3].sendall(b"estop\n")  # by hand, on a connection that has a slot
        assert json.loads(held[3].makefile("rb").readline())["ok"]
        assert _ask(held[2], {"cmd": "status", "v": 1, "id": "s3"})["result"]["mode"] == "estop"
        wait_until(lambda: bool(_stops_since(d, since)), 20, "a STOP frame at the robot")
    finally:
        for s in sockets:
            s.close()
        d.stop()

"""sd_notify over a real AF_UNIX datagram socket (path and abstract namespace)."""

from __future__ import annotations

import os
import socket
from pathlib import Path

from edge_agent.daemon.notify import SystemdNotifier


def _recv(sock: socket.socket) -> str:
    sock.settimeout(5.0)
    return sock.recv(4096).decode()


def test_ready_watchdog_stopping_on_a_path_socket(tmp_path: Path) -> None:
    path = str(tmp_path / "notify.sock")
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as srv:
        srv.bind(path)
        n = SystemdNotifier(path)
        assert n.ready("up")
        msg = _recv(srv)
        assert "READY=1" in msg.split("\n") and f"MAINPID={os.getpid()}" in msg
        assert n.watchdog() and _recv(srv) == "WATCHDOG=1"
        assert n.stopping() and _recv(srv) == "STOPPING=1"
        n.close()


def test_abstract_namespace_socket() -> None:
    name = f"edge-agent-test-{os.getpid()}"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as srv:
        srv.bind("\0" + name)
        n = SystemdNotifier("@" + name)
        assert n.status("calibrating")
        assert _recv(srv) == "STATUS=calibrating"
        n.close()


def test_without_notify_socket_is_a_quiet_no_op(monkeypatch: object) -> None:
    n = SystemdNotifier("")
    assert not n.enabled and not n.ready()


def test_send_to_a_vanished_socket_does_not_raise(tmp_path: Path) -> None:
    n = SystemdNotifier(str(tmp_path / "gone.sock"))
    assert n.ready() is False and n.errors == 1

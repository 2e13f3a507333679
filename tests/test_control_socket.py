"""The local control socket (0600, JSON lines, e-stop path) and `send_command` over socket/MQTT."""

from __future__ import annotations

import json
import os
import socket
import stat
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import MQTT_USERS
from mosquitto import Mosquitto, wait_until
from unix_socket import try_connect

from edge_agent.commands import CommandAPI, CommandContext, Mode
from edge_agent.comms.client import (
    CommandTimeout,
    CommandTransportError,
    MqttTarget,
    prepare_payload,
    send_command,
)
from edge_agent.comms.control_socket import ControlSocketServer
from edge_agent.comms.mqtt_bridge import MqttBridge
from edge_agent.comms.mqtt_settings import MqttSettings
from edge_agent.errors import EdgeAgentError


class Daemonish:
    def __init__(self, state_dir: Path) -> None:
        self.estops: list[str] = []
        self.ran: list[str] = []
        self.api = CommandAPI(lambda: Mode.IDLE)
        for name in ("status", "estop", "task.start"):
            self.api.register(name, self._record)
        self.server = ControlSocketServer(self.api, state_dir / "control.sock",
                                          on_estop=self.estops.append, idle_timeout_s=5)

    def _record(self, args: dict[str, Any], ctx: CommandContext) -> dict[str, Any]:
        self.ran.append(f"{ctx.command}:{ctx.source}")
        return {"command": ctx.command, "source": ctx.source}


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[Daemonish]:
    d = Daemonish(tmp_path / "state")
    d.server.start()
    yield d
    d.server.stop()


def exchange(path: Path, *lines: bytes) -> list[dict[str, Any]]:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(10)
        s.connect(str(path))
        s.sendall(b"".join(lines))
        with s.makefile("rb") as r:
            return [json.loads(r.readline()) for _ in lines]


def test_socket_is_0600_and_answers(daemon: Daemonish) -> None:
    path = daemon.server.path
    st = os.stat(path)
    assert stat.S_ISSOCK(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o600
    replies = exchange(path, b'{"cmd": "status", "v": 1, "id": "a"}\n',
                       b'{"cmd": "status", "v": 1, "id": "a"}\n',
                       b'{"cmd": "task.start", "v": 1, "id": "b", "params": {"place": [1]}}\n')
    assert replies[0] == {"v": 1, "id": "a", "ok": True,
                          "result": {"command": "status", "source": "socket"}}
    assert replies[1] == replies[0] and daemon.ran == ["status:socket"]  # dedup, same API
    assert replies[2]["error"]["code"] == "bad_args"
    assert "params.place: expected 3 numbers, got 1" in replies[2]["error"]["message"]


def test_estop_goes_through_on_estop(daemon: Daemonish) -> None:
    reply = exchange(daemon.server.path, b'{"cmd": "estop", "v": 1, "id": "e"}\n')[0]
    assert reply["ok"] and daemon.estops == ["socket"] and daemon.ran == ["estop:socket"]


def test_malformed_lines(daemon: Daemonish) -> None:
    replies = exchange(daemon.server.path, b"nope\n", b'{"v": 1, "id": "c"}\n',
                       b'{"cmd": "fly", "v": 1, "id": "d"}\n', b"[1]\n")
    assert [r["error"]["code"] for r in replies] == [
        "bad_json", "bad_args", "unknown_command", "not_object"]
    assert replies[1]["id"] == "c" and replies[2]["id"] == "d"
    too_long = b'{"cmd": "status", "pad": "' + b"x" * 70000 + b'"}\n'
    assert exchange(daemon.server.path, too_long)[0]["error"]["code"] == "too_large"


def test_stale_socket_is_replaced_and_a_live_one_is_not(tmp_path: Path) -> None:
    path = tmp_path / "control.sock"
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stale.bind(str(path))
    stale.close()  # the file stays, nobody listens: what a crash leaves behind
    d = Daemonish(tmp_path)
    d.server.start()
    try:
        assert exchange(path, b'{"cmd": "status", "v": 1, "id": "x"}\n')[0]["ok"]
        other = Daemonish(tmp_path)
        with pytest.raises(EdgeAgentError, match="another process"):
            other.server.start()
        other.server.stop()
    finally:
        d.server.stop()
        d.server.stop()  # idempotent
    assert not path.exists()
    path.write_text("not a socket")
    with pytest.raises(EdgeAgentError, match="not a socket"):
        Daemonish(tmp_path).server.start()


def test_stop_closes_open_connections(daemon: Daemonish) -> None:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(10)
    s.connect(str(daemon.server.path))
    s.sendall(b'{"cmd": "status", "v": 1, "id": "q"}\n')
    assert json.loads(s.makefile("rb").readline())["ok"]
    done = threading.Event()
    threading.Thread(target=lambda: (daemon.server.stop(), done.set()), daemon=True).start()
    assert done.wait(10)
    assert s.recv(1) == b""  # closed by the server
    s.close()


def test_send_command_over_the_socket(daemon: Daemonish) -> None:
    reply = send_command("status", None, socket_path=daemon.server.path, timeout=5)
    assert reply["ok"] and len(reply["id"]) == 32
    reply = send_command("status", '{"id": "mine"}', socket_path=daemon.server.path)
    assert reply["id"] == "mine"
    with pytest.raises(ValueError, match="not JSON"):
        prepare_payload("{oops")
    with pytest.raises(CommandTransportError):
        send_command("status", socket_path=daemon.server.path.with_name("none.sock"))


@pytest.mark.parametrize("protocol", ["5", "3.1.1"])
def test_send_command_over_mqtt(broker: Mosquitto, tmp_path: Path, protocol: str) -> None:
    api = CommandAPI(lambda: Mode.IDLE)
    api.register("status", lambda a, c: {"via": c.source})
    bridge = MqttBridge(MqttSettings(device_id="dev1", host=broker.host, port=broker.port,
                                     password=MQTT_USERS["dev1"], protocol=protocol), api)
    bridge.start()
    target = MqttTarget(device_id="dev1", host=broker.host, port=broker.port,
                        username="operator", password=MQTT_USERS["operator"], protocol=protocol)
    try:
        assert bridge.wait_ready(10)
        missing_socket = tmp_path / "absent.sock"
        reply = send_command("status", {"id": "over-mqtt"}, socket_path=missing_socket,
                             mqtt=target, timeout=10)
        assert reply == {"v": 1, "id": "over-mqtt", "ok": True, "result": {"via": "mqtt"}}
        assert "operator-pw" not in repr(target)
    finally:
        bridge.stop()
    with pytest.raises(CommandTimeout):  # nobody answers now
        send_command("status", {}, mqtt=target, timeout=1.5)
    bad = MqttTarget(device_id="dev1", host=broker.host, port=broker.port, username="operator",
                     password="wrong", protocol=protocol)
    with pytest.raises(CommandTransportError, match="refused"):
        send_command("status", {}, mqtt=bad, timeout=5)


def _admitted(path: Path, n: int) -> list[socket.socket]:
    """`n` connections that each got an answer (so each holds a slot), then stay silent."""
    out = []
    for i in range(n):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(10)
        s.connect(str(path))
        s.sendall(b'{"cmd": "status", "v": 1, "id": "hold-%d"}\n' % i)
        assert json.loads(s.makefile("rb").readline())["ok"]
        out.append(s)
    return out


def _silent(path: Path, n: int) -> list[socket.socket]:
    out = []
    for _ in range(n):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(10)
        wait_until(lambda s=s: try_connect(s, path), 10, "a connection")  # type: ignore[misc]
        out.append(s)
    return out


def test_an_estop_is_served_however_many_connections_are_open(daemon: Daemonish) -> None:
    """Eight silent connections fill the slots, 40 more (past the overflow lane's 32) wait
    silently: an `estop` on yet another connection is still served; a `status` there is busy.
    (Before: `busy: too many connections` for the e-stop too, and nothing stopped.)"""
    path = daemon.server.path
    held = _admitted(path, 8)
    flood = _silent(path, 40)
    try:
        busy = exchange(path, b'{"cmd": "status", "v": 1, "id": "over"}\n')[0]
        assert busy["error"]["code"] == "busy" and "too many connections" in \
            busy["error"]["message"]
        reply = exchange(path, b'{"cmd": "estop", "v": 1, "id": "past-the-limit"}\n')[0]
        assert reply == {"v": 1, "id": "past-the-limit", "ok": True,
                         "result": {"command": "estop", "source": "socket"}}
        assert daemon.estops == ["socket"]
        # the oldest silent ones were pushed out to make room, answered busy
        first = flood[0].makefile("rb").readline()
        assert json.loads(first)["error"]["code"] == "busy"
        lane = daemon.server.overflow
        assert lane is not None and lane.counters["evicted"] >= 8
    finally:
        for s in held + flood:
            s.close()


def test_an_unfinished_estop_line_past_the_limit_stops_when_its_time_is_up(
        tmp_path: Path) -> None:
    d = Daemonish(tmp_path / "state")
    d.server = ControlSocketServer(d.api, tmp_path / "state" / "control.sock",
                                   on_estop=d.estops.append, max_clients=1,
                                   overflow_line_timeout_s=0.2)
    d.server.start()
    try:
        held = _admitted(d.server.path, 1)
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(10)
            s.connect(str(d.server.path))
            s.sendall(b'{"cmd": "estop", "v": 1, "id": "cut-sh')  # no newline, ever
            reply = json.loads(s.makefile("rb").readline())
        assert reply["ok"] and "payload_error" in reply["result"] and d.estops == ["socket"]
        held[0].close()
    finally:
        d.server.stop()


@pytest.mark.parametrize("line", [
    b'{"cmd": "estop", "v": 1, "id": "trunc',  # cut short
    b"estop",  # typed by hand
    b"ESTOP please",
    b'{"cmd": "ESTOP", "v": 1, "id": "upper"}',
    b'{"cmd": ["estop"], "v": 1, "id": "list"}',
    b'{"cmd": "estop", "v": 2, "id": "v2"}',  # a known command with a bad envelope
])
def test_a_line_that_names_estop_stops_even_when_it_is_malformed(daemon: Daemonish,
                                                                 line: bytes) -> None:
    reply = exchange(daemon.server.path, line + b"\n")[0]
    assert reply["ok"] and daemon.estops == ["socket"], reply
    assert daemon.ran == ["estop:socket"]


@pytest.mark.parametrize("line", [
    b'{"cmd": "status", "v": 1, "id": "estop"}',  # a known command: the word is just an id
    b'{"cmd": "estop_input", "v": 1, "id": "x"}',  # not the word estop
    b"nope",
])
def test_a_line_that_does_not_name_estop_does_not_stop(daemon: Daemonish, line: bytes) -> None:
    exchange(daemon.server.path, line + b"\n")
    assert daemon.estops == []

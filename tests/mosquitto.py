"""Test helpers: a private Mosquitto (password file + ACL, free 127.0.0.1 port) and a probe client.

`Mosquitto` writes its own config into a temp dir, starts `mosquitto -c`, waits until the port
accepts connections, can stop and restart on the same port, and pause (SIGSTOP) and resume.
`Probe` is a small synchronous paho client for the test side: connect, subscribe, publish with
MQTT 5 properties, and wait for messages on a queue with a deadline (no sleeps).
"""

from __future__ import annotations

import contextlib
import os
import queue
import shutil
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import paho.mqtt.client as paho
from paho.mqtt.enums import CallbackAPIVersion, MQTTProtocolVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

MOSQUITTO = shutil.which("mosquitto") or "/usr/sbin/mosquitto"
MOSQUITTO_PASSWD = shutil.which("mosquitto_passwd") or "/usr/bin/mosquitto_passwd"

DOCS = Path(__file__).resolve().parents[1] / "docs" / "mosquitto"
# The documented ACL (a device reads its own commands and the fleet e-stop, writes only its own
# topics; the operator reads and writes everything under edge/): the tests run against it.
DEFAULT_ACL = (DOCS / "acl").read_text()


def wait_until(predicate: Callable[[], bool], timeout: float, what: str,
               interval: float = 0.01) -> None:
    """Poll `predicate` until it holds; fail the test with `what` after `timeout` seconds."""
    end = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > end:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(interval)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Mosquitto:
    """A private broker: `start()`, `stop()`, `restart()` (same port), `log()`."""

    host = "127.0.0.1"

    def __init__(self, workdir: Path, users: Mapping[str, str], acl: str = DEFAULT_ACL,
                 port: int | None = None) -> None:
        self.dir = Path(workdir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.port = port or free_port()
        self.users = dict(users)
        self._proc: subprocess.Popen[bytes] | None = None
        self._log_path = self.dir / "mosquitto.log"
        self._write_config(acl)

    def _write_config(self, acl: str) -> None:
        passwd = self.dir / "passwd"
        for i, (user, password) in enumerate(self.users.items()):
            args = [MOSQUITTO_PASSWD, "-b"] + (["-c"] if i == 0 else []) + [
                str(passwd), user, password]
            subprocess.run(args, check=True, capture_output=True)
        os.chmod(passwd, 0o600)
        (self.dir / "acl").write_text(acl)
        os.chmod(self.dir / "acl", 0o600)
        lines = [
            "per_listener_settings false",
            f"listener {self.port} {self.host}",
            "allow_anonymous false",
            f"password_file {passwd}",
            f"acl_file {self.dir / 'acl'}",
            "set_tcp_nodelay true",
            "persistence false",
            "log_dest stderr",
            "log_type error",
            "log_type warning",
            "log_type notice",
            "log_type information",
        ]
        if os.geteuid() == 0:  # else mosquitto drops to user "mosquitto" and cannot read passwd
            lines.append("user root")
        self.config = self.dir / "mosquitto.conf"
        self.config.write_text("\n".join(lines) + "\n")

    def use_config(self, text: str) -> None:
        """Replace the generated config (the caller points it at `.dir/passwd`, `.dir/acl`)."""
        if os.geteuid() == 0 and "\nuser " not in text:
            text += "\nuser root\n"
        self.config.write_text(text)

    def start(self, timeout: float = 10.0) -> None:
        if self._proc is not None:
            return
        log = open(self._log_path, "ab")  # noqa: SIM115 - handed to the child, closed at stop
        self._proc = subprocess.Popen([MOSQUITTO, "-c", str(self.config)], stdout=log,
                                      stderr=subprocess.STDOUT)
        log.close()
        end = time.monotonic() + timeout
        while True:
            if self._proc.poll() is not None:
                raise RuntimeError(f"mosquitto exited ({self._proc.returncode}):\n{self.log()}")
            with contextlib.suppress(OSError), socket.create_connection(
                    (self.host, self.port), timeout=0.5):
                return
            if time.monotonic() > end:
                raise RuntimeError(f"mosquitto did not listen on {self.port}:\n{self.log()}")
            time.sleep(0.02)

    def stop(self) -> None:
        proc, self._proc = self._proc, None
        if proc is None:
            return
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)

    def pause(self) -> None:
        """SIGSTOP the broker: connections stay open, nothing is read or acknowledged."""
        assert self._proc is not None
        self._proc.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        """SIGCONT after `pause()`: the broker reads what queued meanwhile and answers."""
        assert self._proc is not None
        self._proc.send_signal(signal.SIGCONT)

    def restart(self) -> None:
        self.stop()
        self.start()

    def log(self) -> str:
        try:
            return self._log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""


def shipped_config(broker: Mosquitto, tls_port: int, pki: Path) -> str:
    """docs/mosquitto/mosquitto.conf as shipped, pointed at `broker`'s files and ports (plain
    listener on broker.port, TLS on tls_port with pki/{ca,server}.crt) and logging to stderr."""
    text = (DOCS / "mosquitto.conf").read_text()
    for old, new in [
        ("/etc/mosquitto/passwd", str(broker.dir / "passwd")),
        ("/etc/mosquitto/acl", str(broker.dir / "acl")),
        ("/etc/mosquitto/certs", str(pki)),
        ("/var/lib/mosquitto/", f"{broker.dir}/"),
        ("listener 1883 127.0.0.1", f"listener {broker.port} 127.0.0.1"),
        ("listener 8883", f"listener {tls_port} 127.0.0.1"),
        ("log_dest syslog", "log_dest stderr"),
    ]:
        assert old in text, f"docs/mosquitto/mosquitto.conf no longer has {old!r}"
        text = text.replace(old, new)
    return text


class Probe:
    """A synchronous test-side MQTT client; received messages land on `.messages`."""

    def __init__(self, broker: Mosquitto, username: str | None, password: str | None, *,
                 client_id: str | None = None, protocol: int = paho.MQTTv5,
                 clean_start: bool = True, session_expiry: int = 0) -> None:
        self.broker = broker
        self.protocol = protocol
        kwargs: dict[str, Any] = {}
        if protocol != paho.MQTTv5:
            kwargs["clean_session"] = clean_start
        self.client = paho.Client(CallbackAPIVersion.VERSION2, client_id=client_id or "",
                                  protocol=MQTTProtocolVersion(protocol), **kwargs)
        if username is not None:
            self.client.username_pw_set(username, password)
        self.messages: queue.Queue[paho.MQTTMessage] = queue.Queue()
        self.connack: queue.Queue[Any] = queue.Queue()
        self.subacks: queue.Queue[list[Any]] = queue.Queue()
        self.disconnected = threading.Event()
        self._backlog: list[paho.MQTTMessage] = []
        self._clean_start = clean_start
        self._session_expiry = session_expiry
        self.client.on_connect = lambda c, u, f, rc, p: self.connack.put(rc)
        self.client.on_subscribe = lambda c, u, mid, rcs, p: self.subacks.put(list(rcs))
        self.client.on_message = lambda c, u, m: self.messages.put(m)
        self.client.on_disconnect = lambda c, u, f, rc, p: self.disconnected.set()
        self.client.on_socket_open = lambda c, u, sock: sock.setsockopt(
            socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def connect(self, timeout: float = 10.0) -> Any:
        """Connect and return the CONNACK reason code (the caller checks it)."""
        kwargs: dict[str, Any] = {}
        if self.protocol == paho.MQTTv5:
            kwargs["clean_start"] = self._clean_start
            if self._session_expiry:
                props = Properties(PacketTypes.CONNECT)
                props.SessionExpiryInterval = self._session_expiry
                kwargs["properties"] = props
        self.client.connect(self.broker.host, self.broker.port, keepalive=30, **kwargs)
        self.client.loop_start()
        return self.connack.get(timeout=timeout)

    def subscribe(self, topic: str, qos: int = 1, timeout: float = 10.0) -> list[Any]:
        self.client.subscribe(topic, qos=qos)
        return self.subacks.get(timeout=timeout)

    def publish(self, topic: str, payload: bytes | str, *, qos: int = 1, retain: bool = False,
                expiry: int | None = None, response_topic: str | None = None,
                correlation: bytes | None = None, timeout: float = 10.0) -> None:
        props = None
        if self.protocol == paho.MQTTv5 and (expiry or response_topic or correlation):
            props = Properties(PacketTypes.PUBLISH)
            if expiry is not None:
                props.MessageExpiryInterval = expiry
            if response_topic is not None:
                props.ResponseTopic = response_topic
            if correlation is not None:
                props.CorrelationData = correlation
        info = self.client.publish(topic, payload, qos=qos, retain=retain, properties=props)
        if qos > 0:
            info.wait_for_publish(timeout)

    def expect(self, predicate: Callable[[paho.MQTTMessage], bool] | str,
               timeout: float = 10.0) -> paho.MQTTMessage:
        """The first matching message (a topic or a predicate); others stay for later calls."""
        match = (lambda m: m.topic == predicate) if isinstance(predicate, str) else predicate
        for i, msg in enumerate(self._backlog):
            if match(msg):
                del self._backlog[i]
                return msg
        end = time.monotonic() + timeout
        while True:
            left = end - time.monotonic()
            if left <= 0:
                raise AssertionError(f"no matching message within {timeout:g} s")
            try:
                msg = self.messages.get(timeout=left)
            except queue.Empty:
                continue
            if match(msg):
                return msg
            self._backlog.append(msg)

    def drain(self) -> list[paho.MQTTMessage]:
        """Everything received and not yet taken by `expect`."""
        out, self._backlog = self._backlog, []
        while True:
            try:
                out.append(self.messages.get_nowait())
            except queue.Empty:
                return out

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.client.disconnect()
        with contextlib.suppress(Exception):
            self.client.loop_stop()
